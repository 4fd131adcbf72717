"""The local launcher of a sweep: its programs run as subprocesses here, up to N at once, the machine
split between them (`experiments.compare --jobs=N`).

Each of the N jobs owns a share of the machine for as long as the sweep runs, and a program is
started in a free share and keeps it until it exits:

- on a CPU, `cores_per_run` cores (default 1), given as the child's CPU affinity. XLA sizes its
  thread pools by the cores a process may run on, and on XLA:CPU a run's sums depend on how many
  threads computed them (its losses differ after a few steps between one core and two), so a run's
  size is its own setting, never derived from N: the table is the same whatever --jobs is.
- on GPUs, `gpus_per_run` devices (default 1), given as the child's CUDA_VISIBLE_DEVICES, and an
  equal part of the cores.

A program's output is appended to its first run's train.log (a file, not a pipe through this
process, so a run outlives a killed sweep with its log intact), after a header naming the command
and its share.
"""

import dataclasses
import os
import signal
import subprocess
import time
from typing import Callable, Optional, Sequence

from experiments.runs import run_record
from experiments.shared import signals
from experiments.sweeps import results


class JobsError(ValueError):
  """A number of jobs this machine cannot split into equal shares: one line."""


@dataclasses.dataclass(frozen=True)
class Share:
  """What one job may use: these CPU cores and, on GPUs, these devices (as CUDA_VISIBLE_DEVICES names them)."""
  index: int
  count: int
  cores: tuple[int, ...]
  gpus: Optional[tuple[str, ...]] = None

  def describe(self) -> str:
    gpus = f'; GPUs {",".join(self.gpus)}' if self.gpus is not None else ''
    return f'job {self.index + 1} of {self.count}: cores {",".join(map(str, self.cores))}{gpus}'


@dataclasses.dataclass(frozen=True)
class Program:
  """One training program of a sweep: its command and the run directories it trains (first: its log)."""
  command: tuple[str, ...]
  workdirs: tuple[str, ...]
  label: str


def shares(jobs: int, cores: Sequence[int], gpus: Optional[Sequence[str]] = None, platform: str = 'cpu',
           cores_per_run: int = 1, gpus_per_run: int = 1) -> list[Share]:
  """The machine split into `jobs` shares. On a CPU each share is `cores_per_run` consecutive cores: a
  run's size does not depend on how many run beside it. On GPUs each share is `gpus_per_run` GPUs and
  an equal part of the cores (sizes differing by at most one)."""
  cores = sorted(cores)
  if jobs < 1:
    raise JobsError(f'--jobs: got {jobs}; valid: a positive integer')
  for name, value in (('cores_per_run', cores_per_run), ('gpus_per_run', gpus_per_run)):
    if value < 1:
      raise JobsError(f'--{name}: got {value}; valid: a positive integer')
  if platform == 'gpu' and gpus is not None:
    if jobs * gpus_per_run > len(gpus):
      raise JobsError(f'--jobs: got {jobs} with --gpus_per_run={gpus_per_run}, {jobs * gpus_per_run} GPUs; valid: '
                      f'--jobs x --gpus_per_run at most {len(gpus)}, the GPUs here')
    if jobs > len(cores):
      raise JobsError(f'--jobs: got {jobs}; valid: at most {len(cores)}, the CPU cores this process may use (each '
                      'job needs one)')
    return [Share(index, jobs, tuple(cores[index * len(cores) // jobs:(index + 1) * len(cores) // jobs]),
                  tuple(gpus[index * gpus_per_run:(index + 1) * gpus_per_run])) for index in range(jobs)]
  if platform != 'cpu':
    if jobs > 1:
      raise JobsError(f'--jobs: got {jobs}; valid: 1 on {platform} (jobs split CPU cores or GPUs only)')
    return [Share(0, 1, tuple(cores))]
  if jobs * cores_per_run > len(cores):
    raise JobsError(f'--jobs: got {jobs} with --cores_per_run={cores_per_run}, {jobs * cores_per_run} cores; valid: '
                    f'--jobs x --cores_per_run at most {len(cores)}, the CPU cores this process may use')
  return [Share(index, jobs, tuple(cores[index * cores_per_run:(index + 1) * cores_per_run]))
          for index in range(jobs)]


def machine_shares(jobs: int, cores_per_run: int = 1, gpus_per_run: int = 1) -> list[Share]:
  """`shares` of this machine: the cores of this process's affinity, and JAX's local GPUs when its
  backend is a GPU (numbered as CUDA_VISIBLE_DEVICES lists them, or 0..n-1)."""
  import jax  # pylint: disable=g-import-not-at-top
  platform = jax.default_backend()
  gpus = None
  if platform == 'gpu':
    visible = os.environ.get('CUDA_VISIBLE_DEVICES', '').strip()
    gpus = [g.strip() for g in visible.split(',')] if visible else [str(i) for i in range(jax.local_device_count())]
  return shares(jobs, os.sched_getaffinity(0), gpus, platform, cores_per_run, gpus_per_run)


def devices_per_job(share: Share, device_count: int) -> int:
  """The devices a run started in this share sees: its GPUs, or every (host) device on a CPU."""
  return len(share.gpus) if share.gpus is not None else device_count


class _Started:
  """A program running in its share."""

  def __init__(self, program: Program, share: Share, environment: dict):
    self.program = program
    self.share = share
    header = f'=== {time.strftime("%Y-%m-%d %H:%M:%S")}: {" ".join(program.command)} ({share.describe()})\n'
    for workdir in program.workdirs:
      os.makedirs(workdir, exist_ok=True)
    for workdir in program.workdirs[1:]:
      with open(os.path.join(workdir, 'train.log'), 'a') as log:
        log.write(header + f'(trained in one program with {program.workdirs[0]}: its output is in '
                           f'{os.path.join(program.workdirs[0], "train.log")})\n')
    self.log_path = os.path.join(program.workdirs[0], 'train.log')
    environment = dict(environment, **{signals.PARENT_VARIABLE: str(os.getpid())})
    if share.gpus is not None:
      environment['CUDA_VISIBLE_DEVICES'] = ','.join(share.gpus)
    with open(self.log_path, 'a') as log:
      log.write(header)
      log.flush()
      self.log_start = log.tell()
      # Affinity is per thread on Linux and a child inherits its parent thread's: set it on this
      # thread for the fork, then put it back (no code runs in the child before exec).
      own = os.sched_getaffinity(0)
      os.sched_setaffinity(0, share.cores)
      try:
        self.process = subprocess.Popen(list(program.command), stdout=log, stderr=subprocess.STDOUT, env=environment)
      finally:
        os.sched_setaffinity(0, own)
    self.forwarded = False

  def outcomes(self, stopped: bool) -> dict:
    """{workdir: ('ok' | 'failed' | 'stopped', the reason of a failure)}."""
    with open(self.log_path) as log:
      log.seek(self.log_start)
      output = log.read().splitlines()
    outcomes = {}
    for workdir in self.program.workdirs:
      if stopped:
        outcomes[workdir] = ('stopped', '')
      elif os.path.exists(os.path.join(workdir, run_record.SUMMARY_FILE)):  # written last, by a run that finished
        outcomes[workdir] = ('ok', '')
      else:
        outcomes[workdir] = ('failed', f'exit code {self.process.returncode}: {results.error_line(output, workdir)}')
    return outcomes


def run_programs(programs: Sequence[Program], machine: Sequence[Share], stop,
                 on_start: Callable[[Program, Share], None], on_end: Callable[[Program, dict], None],
                 environment: Optional[dict] = None, poll_seconds: float = 0.1) -> None:
  """Runs `programs` in order, each in a free share of `machine` (so at most len(machine) at once),
  calling on_start when one starts and on_end with its outcomes when it exits. When `stop.requested`
  (a signal's name) is set, starts nothing more, passes that signal to every running program and
  returns once all have exited (their runs 'stopped')."""
  environment = dict(os.environ) if environment is None else environment
  waiting = list(programs)
  free = list(machine)
  running: list[_Started] = []
  while waiting or running:
    while waiting and free and not stop.requested:
      started = _Started(waiting.pop(0), free.pop(0), environment)
      running.append(started)
      on_start(started.program, started.share)
    for started in list(running):
      if stop.requested and not started.forwarded:
        started.process.send_signal(getattr(signal, stop.requested))
        started.forwarded = True
      if started.process.poll() is not None:
        running.remove(started)
        free.append(started.share)
        free.sort(key=lambda share: share.index)
        on_end(started.program, started.outcomes(bool(stop.requested)))
    if stop.requested and not running:
      return
    time.sleep(poll_seconds)
