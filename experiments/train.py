"""Train one experiment.

  python -m experiments.train --config=configs/algorithmic.py:copy --workdir=runs/copy \
      [--config.model.position.kind=rope --config.train.steps=500 ...]
  python -m experiments.train --config=configs/algorithmic.py:copy --seeds=4 --workdir=runs/copy-seed{seed}

--seeds=N trains the seeds config.seed .. config.seed + N - 1 in one program (experiments/runs/replicas.py),
each in its own workdir (the {seed} in --workdir), each the run its seed would be alone.

A workdir that holds a run is resumed, if the configuration is the run's own (or differs only in what
experiments/runs/run_record.py allows to change on resume); any other difference is refused, one line per
field. Multi-host: add --coordinator_address=HOST:PORT --num_processes=N --process_id=I on every host
(or set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
"""

from experiments.shared.signals import STOP  # first: a stop signal during the imports below exits cleanly too

STOP.install()

import sys

from absl import flags

from experiments.shared import cli

_CONFIG = cli.define_config_flag('Experiment config file (configs/<name>.py).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for config.json, metrics, checkpoints.')
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Train seeds config.seed .. config.seed + seeds - 1 in one program; '
                              'with more than one, --workdir holds {seed}.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', None, 'Multi-host: HOST:PORT of process 0.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Multi-host: number of processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'Multi-host: index of this process.')


def prepare():
  """What can be checked before the model is built: the config file, the overrides, the workdirs, the run to
  start from. Exits with code 2 and one line on any problem; writes nothing. What only tracing finds, the
  trainer refuses before it writes (trainer.run_seeds)."""
  if _CONFIG.value is None:
    cli.fail('--config: missing; valid: a config file, e.g. --config=configs/algorithmic.py:copy')
  if not _WORKDIR.value:
    cli.fail('--workdir: missing; valid: a directory for the run, e.g. --workdir=runs/copy')
  from experiments.runs import parallel, preflight, settings  # pylint: disable=g-import-not-at-top
  parallel.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  import jax  # pylint: disable=g-import-not-at-top
  try:
    experiment = settings.from_config_dict(_CONFIG.value, jax.device_count())
    workdirs = settings.seed_workdirs(_WORKDIR.value, experiment.seed, _SEEDS.value)
    for workdir in workdirs:
      settings.check_workdir(workdir)
    for workdir in workdirs:
      preflight.check_init_from(experiment, workdir)
  except settings.ConfigError as error:
    cli.fail(str(error))
  return experiment, workdirs


def evaluation_table(experiment, evaluation: dict) -> str:
  """The final evaluation, a row per length (the training length marked), a column per main metric."""
  from experiments.sweeps.results import MAIN_METRICS  # pylint: disable=g-import-not-at-top
  columns = [m for m in MAIN_METRICS if any(m in record for record in evaluation.values())] + ['loss']
  lines = [f'{"length":>12} ' + ' '.join(f'{c:>18}' for c in columns)]
  for length in sorted(evaluation):
    label = f'{length} (train)' if length == experiment.task.max_length else str(length)
    lines.append(f'{label:>12} ' + ' '.join(f'{evaluation[length][c]:>18.4f}' for c in columns))
  return '\n'.join(lines)


def main(argv):
  del argv
  experiment, workdirs = prepare()
  from experiments.runs import checkpoints, metrics, run_record, settings, trainer  # pylint: disable=g-import-not-at-top
  try:
    evaluations = trainer.run_seeds(experiment, workdirs)
  except run_record.RunMismatch as mismatch:
    for line in mismatch.lines:
      print(f'error: {line}', file=sys.stderr)
    sys.exit(2)
  except trainer.NonFiniteLoss as error:  # a line per diverged seed
    for line in str(error).splitlines():
      print(f'error: {line}', file=sys.stderr)
    sys.exit(2)
  except (settings.ConfigError, trainer.WorkdirBusy, trainer.WorkdirUnusable, trainer.ReplicasOutOfStep,
          checkpoints.CheckpointMismatch, metrics.MetricsDamaged) as error:
    cli.fail(str(error))
  for offset, (workdir, evaluation) in enumerate(zip(workdirs, evaluations)):
    if not run_record.is_finished(workdir):
      return  # stopped by a signal: the restart finishes it
    position = experiment.model.position.kind if experiment.model.architecture == 'transformer' else '-'
    print(f'{experiment.task.name}, {experiment.model.architecture} ({position} positions), seed '
          f'{experiment.seed + offset}: {experiment.train.steps} steps; the final evaluation by length (training '
          f'length {experiment.task.max_length}):')
    print(evaluation_table(experiment, evaluation))
    print(f'in {workdir}: config.json, metrics.jsonl (every record), summary.json (this table), tensorboard/, '
          f'checkpoints/')


if __name__ == '__main__':
  cli.run(main)
