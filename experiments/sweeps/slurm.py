"""Sweeps on a SLURM cluster: the runs of `experiments.compare --launcher=slurm` as one job array.

sbatch directly, not submitit: a job array is SLURM's own way to run many independent commands, the
script it runs is a file a user can read, edit and resubmit, and nothing beyond SLURM needs
installing on the cluster. Each array task execs one run's `python -m experiments.train` command,
the same command the local launcher runs, so each run is an ordinary workdir: `--requeue` puts a
preempted task back in the queue and the restarted command resumes from its checkpoint, and
`--signal=B:TERM@120` sends SIGTERM two minutes before the time limit, on which a run saves a
checkpoint and exits (experiments/shared/signals.py). When the array has finished, the same compare
command with `--collect` tabulates the runs.

  WORKDIR/slurm/commands.txt   one shell-quoted command per array task (task i: line i + 1)
  WORKDIR/slurm/sweep.sbatch   the array job
  WORKDIR/slurm/%A_%a.log      each task's output (SLURM writes them)
  WORKDIR/slurm/submitted.jsonl  one record per submission: job id, time, runs
"""

import json
import os
import shlex
import subprocess
import time

from experiments.shared.files import append_line_durably, write_text_atomically

DIRECTORY = 'slurm'


class SubmissionError(RuntimeError):
  """sbatch is missing or refused the job: one line."""


def array_script(sweep: str, commands_path: str, count: int, working_directory: str, options: list[str]) -> str:
  """The sbatch script of a job array of `count` tasks, task i running line i + 1 of commands_path."""
  directory = os.path.join(os.path.abspath(sweep), DIRECTORY)
  lines = ['#!/bin/bash', f'#SBATCH --job-name=compare-{os.path.basename(os.path.abspath(sweep))}',
           f'#SBATCH --array=0-{count - 1}', f'#SBATCH --output={directory}/%A_%a.log', '#SBATCH --open-mode=append',
           '#SBATCH --requeue', '#SBATCH --signal=B:TERM@120']
  lines += [f'#SBATCH {option}' for option in options]
  lines += ['set -euo pipefail', f'cd {shlex.quote(working_directory)}',
            f'command=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(commands_path)})',
            'echo "=== $(date \'+%Y-%m-%d %H:%M:%S\') task $SLURM_ARRAY_TASK_ID (job ${SLURM_JOB_ID:-}, restart '
            '${SLURM_RESTART_COUNT:-0}): $command"',
            'eval "exec $command"  # exec: the run itself receives SLURM\'s signals', '']
  return '\n'.join(lines)


def submit(sweep: str, commands: list[list[str]], names: list[str], options: list[str]) -> str:
  """Writes the commands file and the array script, submits it with sbatch; returns the job id."""
  directory = os.path.join(sweep, DIRECTORY)
  os.makedirs(directory, exist_ok=True)
  commands_path = os.path.abspath(os.path.join(directory, 'commands.txt'))
  write_text_atomically(commands_path, ''.join(shlex.join(command) + '\n' for command in commands))
  script_path = os.path.join(directory, 'sweep.sbatch')
  write_text_atomically(script_path, array_script(sweep, commands_path, len(commands), os.getcwd(), options))
  try:
    completed = subprocess.run(['sbatch', '--parsable', script_path], capture_output=True, text=True, check=False)
  except FileNotFoundError:
    raise SubmissionError(f'--launcher=slurm: sbatch is not on PATH; valid: a machine with SLURM, or '
                          f'--launcher=local (the job script is written to {script_path})') from None
  if completed.returncode != 0:
    reason = (completed.stderr.strip().splitlines() or ['no output'])[-1]
    raise SubmissionError(f'--launcher=slurm: sbatch refused {script_path}: {reason}')
  job = completed.stdout.strip().split(';')[0]
  append_line_durably(os.path.join(directory, 'submitted.jsonl'), json.dumps(
      dict(job=job, time=time.strftime('%Y-%m-%d %H:%M:%S'), runs=names), sort_keys=True))
  return job
