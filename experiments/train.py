"""Train one experiment.

  python -m experiments.train --config=configs/copy.py --workdir=runs/copy \
      [--config.model.position.kind=rope --config.train.steps=500 ...]

A workdir that holds a checkpoint is resumed. Multi-host: add --coordinator_address=HOST:PORT
--num_processes=N --process_id=I on every host (or set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID).
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/<name>.py).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for config.json, metrics, checkpoints.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', None, 'Multi-host: HOST:PORT of process 0.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Multi-host: number of processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'Multi-host: index of this process.')


def fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _first_line(error: Exception) -> str:
  return ' '.join(str(error).split())


def parse_flags(argv):
  """absl parsing, but a bad flag or override gives one line and exit code 2."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, ValueError, AttributeError, TypeError) as error:
    cause = error.args[0] if isinstance(error, AttributeError) and error.args else error
    unknown = isinstance(cause, (flags.UnrecognizedFlagError, KeyError))
    field = _first_line(cause).strip('"\'').split('.')[-1].split(' ')[-1].strip('"\'')
    overrides = [a.split('=')[0] for a in argv if a.startswith('--config.') and field and field in a]
    if unknown and overrides:  # an override of a field the config does not have (lock_config)
      fail(f'{overrides[0]}: unknown config field; valid: the fields listed in configs/base.py')
    fail(_first_line(error))


def _quiet(record) -> bool:
  """Drops orbax's INFO chatter and JAX's note that no TPU is present."""
  return 'orbax' not in record.pathname and 'Unable to initialize backend' not in record.getMessage()


def prepare():
  """Everything that can be checked before compiling: the config file, the overrides, the workdir.
  Exits with code 2 and one line on any problem; writes nothing."""
  config = _CONFIG.value
  try:
    if config is not None:
      config.keys()  # config_flags defers a load failure to the first use
  except (OSError, ImportError, SyntaxError) as error:
    fail(f'--config: cannot load it: {_first_line(error)}')
  if config is None:
    fail('--config: missing; valid: a config file, e.g. --config=configs/algorithmic.py:copy')
  if not _WORKDIR.value:
    fail('--workdir: missing; valid: a directory for the run, e.g. --workdir=runs/copy')
  from experiments import parallel, settings  # pylint: disable=g-import-not-at-top
  parallel.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  import jax  # pylint: disable=g-import-not-at-top
  try:
    experiment = settings.from_config_dict(config, jax.device_count())
    settings.check_workdir(_WORKDIR.value)
  except settings.ConfigError as error:
    fail(str(error))
  return experiment, _WORKDIR.value


def main(argv):
  del argv
  logging.get_absl_handler().addFilter(_quiet)
  experiment, workdir = prepare()
  from experiments import checkpoints, trainer  # pylint: disable=g-import-not-at-top
  try:
    trainer.run(experiment, workdir)
  except (trainer.NonFiniteLoss, trainer.WorkdirBusy, checkpoints.CheckpointMismatch) as error:
    fail(_first_line(error))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
