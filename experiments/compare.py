"""Compare positional encodings: one command trains every (variant, seed) and tabulates and plots.

  python -m experiments.compare --config=configs/algorithmic.py:copy --positions=all --seeds=3 \
      --workdir=runs/compare-copy [--jobs=2] [--baselines=lstm] [--reference=none] [--config.train.steps=1000 ...]

--baselines adds recurrent models (model.architecture lstm or rnn) as rows of the same table, trained
on the same task, budget and seeds.

Before anything trains, every run's configuration is resolved and validated here, and every run
directory that exists already is checked against it (experiments/runs/run_record.py): a run of another
configuration is refused, one line per field, and nothing is launched. Each run then trains in its own
subprocess in WORKDIR/<variant>-seed<k> (so one failure cannot take the sweep down; its output is
appended to the train.log of the first run it trains); a run that finished with exactly the requested configuration is
skipped, so an interrupted sweep resumes where it stopped. A variant's unfinished seeds train in one
program (experiments/runs/replicas.py: `jax.vmap` over the seeds' replicas, each still its own run
and workdir; consecutive seeds that resume from the same step go together); --novmap_seeds trains
one run per process instead. --jobs=N trains N programs at once, each in its own share of the
machine (experiments/sweeps/local.py): on a CPU --cores_per_run cores (default 1), on GPUs
--gpus_per_run devices (default 1). A run's size is its own setting, so the table is the same
whatever --jobs is. SIGTERM or Ctrl-C is passed on to every
running child, which checkpoints and exits; compare then exits 0 and a rerun resumes. A child whose
parent dies is sent SIGTERM (Linux), so none is left behind. Then every metrics.jsonl is aggregated
into results.csv and results.md (per variant and evaluation length, the mean over seeds with its 95%
Student-t interval, and with --reference each row's paired difference from that row, marked where
significant; failed runs with their error) and plots are written beside them. Exit code 0 when every run
finished, 1 when some failed, 2 for a refusal.

--launcher=slurm submits the unfinished runs as one SLURM job array instead (experiments/sweeps/slurm.py;
--slurm_options adds #SBATCH lines) and returns; the same command with --collect then checks and
tabulates the finished runs, launching nothing (exit code 1 while some are unfinished).
"""

from experiments.shared.signals import STOP  # first: a stop signal during the imports below exits cleanly too

STOP.install()

import copy
import os
import shlex
import sys
import time

from absl import flags, logging

from experiments.shared import cli
from experiments.sweeps import local, results, slurm
from experiments.sweeps.programs import programs
from experiments.sweeps.variants import variants_from_flag
from experiments.runs import run_record

# The runs get the environment this command was given. This process itself only counts devices and
# checks configurations, so on a GPU it leaves the memory to them (JAX would otherwise reserve most of it).
CHILD_ENVIRONMENT = dict(os.environ)
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')

_CONFIG = cli.define_config_flag('Experiment config file.')
_POSITIONS = flags.DEFINE_string('positions', 'all', "'all' or a comma-separated list of variants.")
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Seeds per variant: 0 .. seeds-1.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory of the sweep.')
_BASELINES = flags.DEFINE_string('baselines', '', 'Comma-separated recurrent baselines trained beside the '
                                 'variants: lstm, rnn.')
_LAUNCHER = flags.DEFINE_enum('launcher', 'local', ['local', 'slurm'], 'local: the runs in subprocesses here, '
                               '--jobs at once; slurm: one sbatch job array of the unfinished runs.')
_JOBS = flags.DEFINE_integer('jobs', 1, 'Local programs trained at once, each in its own share of the machine '
                             '(--cores_per_run, --gpus_per_run).')
_CORES_PER_RUN = flags.DEFINE_integer('cores_per_run', 1, "On a CPU, the cores each program may use (the child's "
                                      "affinity, so XLA's threads); a run's sums depend on it, not on --jobs.")
_GPUS_PER_RUN = flags.DEFINE_integer('gpus_per_run', 1, 'On GPUs, the devices each program sees '
                                     '(CUDA_VISIBLE_DEVICES).')
_SLURM_OPTIONS = flags.DEFINE_string('slurm_options', '', 'Extra #SBATCH options for --launcher=slurm, e.g. '
                                     '"--partition=gpu --time=04:00:00 --gres=gpu:1".')
_COLLECT = flags.DEFINE_bool('collect', False, 'Launch nothing: tabulate the runs that finished (after a SLURM '
                             'array); exit code 1 while some have not.')
_VMAP_SEEDS = flags.DEFINE_bool('vmap_seeds', True, "Train a variant's unfinished seeds in one program (jax.vmap "
                                 'over their replicas); --novmap_seeds: one process per run.')
_REFERENCE = flags.DEFINE_string('reference', None, 'A row of the sweep (e.g. none) that every other row is '
                                 'compared with, seed by seed: each difference marked significant or not.')
RECURRENT_BASELINES = ('lstm', 'rnn')  # values of model.architecture
SET_BY_THE_SWEEP = {'seed': '--seeds', 'model.position.kind': '--positions', 'model.architecture': '--baselines'}


def baselines_from_flag(value: str) -> list[str]:
  chosen = [b.strip() for b in value.split(',') if b.strip()]
  unknown = [b for b in chosen if b not in RECURRENT_BASELINES]
  if unknown or len(set(chosen)) < len(chosen):
    raise ValueError(f'--baselines: got {value!r}; valid: empty, or a comma-separated list (each once) of '
                     f'{", ".join(RECURRENT_BASELINES)}')
  return chosen


def override_value(value) -> str:
  """A config value written as --config.FIELD=VALUE parses it back."""
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  return repr(value) if isinstance(value, float) else str(value)


def child_overrides(config, argv) -> list[str]:
  """The command line's overrides, each as --config.FIELD=VALUE with the value this process parsed, so
  the children see exactly the configuration checked here (whatever form the command line used)."""
  arguments = []
  for name in dict.fromkeys(cli.override_names(argv)):
    if name in SET_BY_THE_SWEEP:
      raise cli.CommandError(f'--config.{name}: set per run by {SET_BY_THE_SWEEP[name]} in a sweep; valid: drop '
                             f'it and use {SET_BY_THE_SWEEP[name]}')
    value = config
    for part in name.split('.'):
      value = value[part]
    arguments.append(f'--config.{name}={override_value(value)}')
  return arguments


def row_config(config, row: str, seed: int):
  """The configuration of one run: the sweep's, with this row's variant (or baseline) and seed."""
  config = copy.deepcopy(config)
  if row in RECURRENT_BASELINES:
    config.model.architecture = row
  else:
    config.model.position.kind = row
  config.seed = seed
  return config


def row_flags(row: str, seed: int, seeds: int = 1) -> list[str]:
  field = 'model.architecture' if row in RECURRENT_BASELINES else 'model.position.kind'
  return [f'--config.{field}={row}', f'--config.seed={seed}'] + ([f'--seeds={seeds}'] if seeds > 1 else [])


def resolve(rows: list, seeds: int, device_count: int) -> dict:
  """{run name: its resolved configuration} on `device_count` devices, every run validated; a bad one is a
  CommandError naming it."""
  from experiments.runs import preflight, settings  # pylint: disable=g-import-not-at-top
  resolved = {}
  for row in rows:
    for seed in range(seeds):
      name = results.run_name(row, seed)
      try:
        experiment = settings.from_config_dict(row_config(_CONFIG.value, row, seed), device_count)
        if seed == 0:  # the seed changes no rule the trace checks
          preflight.check(experiment)
      except settings.ConfigError as error:
        raise cli.CommandError(f'{name}: {error}') from None
      resolved[name] = run_record.canonical(settings.to_dict(experiment))
  return resolved


def refusals(sweep: str, resolved: dict) -> list[str]:
  """One line per field in which an existing run differs from what this sweep asks of it."""
  lines = []
  for name, requested in resolved.items():
    workdir = os.path.join(sweep, name)
    stored = run_record.stored_config(workdir)
    if stored is not None:
      lines += [f'{name}: {line}' for line in run_record.refusals(workdir, stored, requested)]
  return lines


def _checked_sweep():
  """The sweep's rows, each run's resolved configuration, the overrides the children get and the machine's
  shares, after every refusal of the flags and of what the workdir already holds (before anything is written)."""
  if _CONFIG.value is None or not _WORKDIR.value:
    cli.fail('--config and --workdir are required, e.g. --config=configs/algorithmic.py:copy --workdir=runs/copy')
  if _SEEDS.value < 1:
    cli.fail(f'--seeds: got {_SEEDS.value}; valid: a positive integer')
  from experiments.runs import settings  # pylint: disable=g-import-not-at-top
  bidirectional = False in settings.CAUSAL_STACKS.get(_CONFIG.value.task.model_kind, ())
  try:
    rows = variants_from_flag(_POSITIONS.value, bidirectional) + baselines_from_flag(_BASELINES.value)
  except ValueError as error:
    cli.fail(str(error))
  if _REFERENCE.value is not None and _REFERENCE.value not in rows:
    cli.fail(f'--reference: got {_REFERENCE.value!r}; valid: one of the sweep\'s rows, {", ".join(rows)}')
  if _JOBS.value != 1 and _LAUNCHER.value == 'slurm':
    cli.fail(f'--jobs: got {_JOBS.value}; valid: 1 with --launcher=slurm (the array\'s tasks run at once already)')
  overrides = child_overrides(_CONFIG.value, sys.argv)
  try:
    settings.check_workdir(_WORKDIR.value)
  except settings.ConfigError as error:
    cli.fail(str(error))
  import jax  # pylint: disable=g-import-not-at-top
  try:
    machine = local.machine_shares(_JOBS.value, _CORES_PER_RUN.value, _GPUS_PER_RUN.value)
  except local.JobsError as error:
    cli.fail(str(error))
  resolved = resolve(rows, _SEEDS.value, local.devices_per_job(machine[0], jax.device_count()))
  lines = refusals(_WORKDIR.value, resolved)
  if lines:
    for line in lines:
      print(f'error: {line}', file=sys.stderr)
    sys.exit(2)
  return rows, resolved, overrides, machine


def _run_directory(row, seed):
  return os.path.join(_WORKDIR.value, results.run_name(row, seed))


def _train_command(row, seeds, overrides):
  """The train command of one program: one seed, or several in one program (workdir with {seed})."""
  workdir = _run_directory(row, '{seed}') if len(seeds) > 1 else _run_directory(row, seeds[0])
  return [sys.executable, '-m', 'experiments.train', f'--config={cli.config_argument(sys.argv)}',
          f'--workdir={workdir}', *overrides, *row_flags(row, seeds[0], len(seeds))]


def _train_programs(planned, overrides, resolved, failures, machine, stop, started):
  """Runs the planned programs, len(machine) at once (experiments/sweeps/local.py), and records their runs'
  failures as each ends; exits on a stop request once every running program has saved and exited."""
  programs_ = [local.Program(tuple(_train_command(row, group, overrides)),
                             tuple(_run_directory(row, seed) for seed in group),
                             f'[program {index + 1}/{len(planned)}] '
                             f'{", ".join(results.run_name(row, seed) for seed in group)}')
               for index, (row, group) in enumerate(planned)]
  stopped = []

  def on_start(program, share):
    logging.info('%s: training in %s (%.0f s into the sweep)', program.label, share.describe(), time.time() - started)

  def on_end(program, outcomes):
    for workdir in program.workdirs:
      name = os.path.basename(workdir)
      outcome, error = outcomes[workdir]
      if outcome == 'stopped':
        stopped.append(name)
        continue
      if outcome == 'ok' and not run_record.is_finished(workdir, resolved[name]):
        outcome, error = 'failed', 'the run finished, but its stored configuration is not the one requested'
      if outcome == 'ok':
        failures.pop(name, None)
        logging.info('%s: finished (%.0f s into the sweep)', name, time.time() - started)
      else:
        failures[name] = error
        logging.warning('%s: FAILED: %s', name, error)
    results.write_failures(_WORKDIR.value, failures)

  local.run_programs(programs_, machine, stop, on_start, on_end, environment=CHILD_ENVIRONMENT)
  if stop.requested:
    where = (f'{", ".join(stopped)} stopped at {"its checkpoint" if len(stopped) == 1 else "their checkpoints"}'
             if stopped else 'no run was training')
    logging.warning('%s received: %s; rerun the same command to resume', stop.requested, where)
    sys.exit(0)


def main(argv):
  del argv
  rows, resolved, overrides, machine = _checked_sweep()
  runs = [(row, seed) for row in rows for seed in range(_SEEDS.value)]
  unfinished = [(row, seed) for row, seed in runs if not run_record.is_finished(
      _run_directory(row, seed), resolved[results.run_name(row, seed)])]
  planned = [(row, group) for row in rows for group in programs(
      row, [seed for r, seed in unfinished if r == row], _WORKDIR.value, _VMAP_SEEDS.value)]
  if _LAUNCHER.value == 'slurm' and unfinished and not _COLLECT.value:
    names = [results.run_name(row, seed) for row, seed in unfinished]
    try:
      job = slurm.submit(_WORKDIR.value, [_train_command(row, group, overrides) for row, group in planned], names,
                         shlex.split(_SLURM_OPTIONS.value))
    except slurm.SubmissionError as error:
      cli.fail(str(error))
    logging.info('submitted SLURM job array %s: %d programs of %d runs (%s); when it has finished, run this command '
                 'again with --collect to tabulate', job, len(planned), len(names), ', '.join(names))
    return
  os.makedirs(_WORKDIR.value, exist_ok=True)
  failures = results.read_failures(_WORKDIR.value)
  started = time.time()
  if planned and not _COLLECT.value:
    in_use = sorted(core for share in machine for core in share.cores)
    logging.info('%d program%s, %d at once: %s', len(planned), '' if len(planned) == 1 else 's', len(machine),
                 '; '.join(share.describe() for share in machine) +
                 (f' ({len(in_use)} of the {len(os.sched_getaffinity(0))} cores this process may use)'))
  with STOP.deferred() as stop:
    for index, (row, seed) in enumerate(runs if not _COLLECT.value else []):
      if (row, seed) not in unfinished:
        logging.info('[%d/%d] %s: finished earlier with this configuration, skipped', index + 1, len(runs),
                     results.run_name(row, seed))
        failures.pop(results.run_name(row, seed), None)
    _train_programs(planned if not _COLLECT.value else [], overrides, resolved, failures, machine, stop, started)
    try:
      table = results.aggregate(_WORKDIR.value, rows, _SEEDS.value, expected=resolved)
    except results.ResultsError as error:
      cli.fail(str(error))
    this_sweep = {results.run_name(row, seed) for row, seed in runs}
    failed = {n: e for n, e in failures.items() if n in this_sweep}
    written = results.write_tables(_WORKDIR.value, table, failed, reference=_REFERENCE.value, overrides=overrides)
    written += results.plot(_WORKDIR.value, table)
  with open(os.path.join(_WORKDIR.value, 'results.md')) as file:
    print(file.read())
  if failed:
    logging.warning('sweep done in %.0f s with %d of %d runs failed; wrote %s', time.time() - started, len(failed),
                    len(runs), ', '.join(written))
    sys.exit(1)
  if _COLLECT.value and unfinished:
    logging.warning('collected %d of %d runs; not finished yet: %s; wrote %s', len(runs) - len(unfinished), len(runs),
                    ', '.join(results.run_name(row, seed) for row, seed in unfinished), ', '.join(written))
    sys.exit(1)
  logging.info('sweep done in %.0f s; wrote %s', time.time() - started, ', '.join(written))

if __name__ == '__main__':
  cli.run(main)
