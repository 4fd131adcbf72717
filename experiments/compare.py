"""Compare positional encodings: one command trains every (variant, seed) and tabulates and plots.

  python -m experiments.compare --config=configs/algorithmic.py:copy --positions=all --seeds=3 \
      --workdir=runs/compare-copy [--baselines=lstm] [--config.train.steps=1000 ...]

--baselines adds recurrent models (model.architecture lstm or rnn) as rows of the same table, trained
on the same task, budget and seeds.

Each run trains in its own subprocess in WORKDIR/<variant>-seed<k> (so one failure cannot take
the sweep down); runs that finished (summary.json) are skipped, so an interrupted sweep resumes
where it stopped. Then every metrics.jsonl is aggregated into results.csv and results.md (mean and
standard deviation over seeds, per variant and evaluation length; failed runs with their error)
and plots are written beside them.
"""

import os
import subprocess
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from experiments import results

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
_POSITIONS = flags.DEFINE_string('positions', 'all', "'all' or a comma-separated list of variants.")
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Seeds per variant: 0 .. seeds-1.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory of the sweep.')
_BASELINES = flags.DEFINE_string('baselines', '', 'Comma-separated recurrent baselines trained beside the '
                                 'variants: lstm, rnn.')
RECURRENT_BASELINES = ('lstm', 'rnn')  # values of model.architecture


def fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _config_argument(argv) -> str:
  return next(a.split('=', 1)[1] for a in argv if a.startswith('--config='))


def _overrides(argv) -> list[str]:
  return [a for a in argv if a.startswith('--config.') and not a.startswith(('--config.model.position.kind=',
                                                                              '--config.model.architecture=',
                                                                              '--config.seed='))]


def variants_from_flag(value: str) -> list[str]:
  import transformer  # pylint: disable=g-import-not-at-top
  if value == 'all':
    return list(transformer.VARIANTS)
  chosen = [v.strip() for v in value.split(',') if v.strip()]
  unknown = [v for v in chosen if v not in transformer.VARIANTS]
  if unknown or not chosen:
    raise ValueError(f'--positions: got {value!r}; valid: all, or a comma-separated list of '
                     f'{", ".join(transformer.VARIANTS)}')
  return chosen


def baselines_from_flag(value: str) -> list[str]:
  chosen = [b.strip() for b in value.split(',') if b.strip()]
  unknown = [b for b in chosen if b not in RECURRENT_BASELINES]
  if unknown:
    raise ValueError(f'--baselines: got {value!r}; valid: empty, or a comma-separated list of '
                     f'{", ".join(RECURRENT_BASELINES)}')
  return chosen


def row_flag(row: str) -> str:
  """The override that makes a run of this row: a recurrent baseline's architecture, or a positional
  variant of the Transformer."""
  if row in RECURRENT_BASELINES:
    return f'--config.model.architecture={row}'
  return f'--config.model.position.kind={row}'


def run_one(config_argument: str, overrides: list[str], row: str, seed: int, workdir: str) -> tuple[bool, str]:
  """Trains one run in a subprocess. Returns (ok, the last line of its error output)."""
  command = [sys.executable, '-m', 'experiments.train', f'--config={config_argument}', f'--workdir={workdir}',
             row_flag(row), f'--config.seed={seed}', *overrides]
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'train.log'), 'w') as log:
    completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, text=True)
  if completed.returncode == 0 and os.path.exists(os.path.join(workdir, results.SUMMARY_FILE)):
    return True, ''
  with open(os.path.join(workdir, 'train.log')) as log:
    return False, f'exit code {completed.returncode}: {results.error_line(log.read().splitlines())}'


def main(argv):
  if _CONFIG.value is None or not _WORKDIR.value:
    fail('--config and --workdir are required, e.g. --config=configs/algorithmic.py:copy --workdir=runs/copy')
  if _SEEDS.value < 1:
    fail(f'--seeds: got {_SEEDS.value}; valid: a positive integer')
  try:
    variants = variants_from_flag(_POSITIONS.value) + baselines_from_flag(_BASELINES.value)
  except ValueError as error:
    fail(str(error))
  config_argument, overrides = _config_argument(sys.argv), _overrides(sys.argv)
  runs = [(v, s) for v in variants for s in range(_SEEDS.value)]
  os.makedirs(_WORKDIR.value, exist_ok=True)
  failures = results.read_failures(_WORKDIR.value)
  started = time.time()
  for index, (variant, seed) in enumerate(runs):
    name = results.run_name(variant, seed)
    workdir = os.path.join(_WORKDIR.value, name)
    prefix = f'[{index + 1}/{len(runs)}] {name}'
    if results.finished(workdir):
      logging.info('%s: finished earlier, skipped', prefix)
      failures.pop(name, None)
      continue
    logging.info('%s: training (%.0f s into the sweep)', prefix, time.time() - started)
    ok, error = run_one(config_argument, overrides, variant, seed, workdir)
    if ok:
      failures.pop(name, None)
    else:
      failures[name] = error
      logging.warning('%s: FAILED: %s', prefix, error)
    results.write_failures(_WORKDIR.value, failures)
  table = results.aggregate(_WORKDIR.value, variants, _SEEDS.value)
  this_sweep = {results.run_name(variant, seed) for variant, seed in runs}
  written = results.write_tables(_WORKDIR.value, table, {n: e for n, e in failures.items() if n in this_sweep})
  written += results.plot(_WORKDIR.value, table)
  logging.info('sweep done in %.0f s; wrote %s', time.time() - started, ', '.join(written))
  print(open(os.path.join(_WORKDIR.value, 'results.md')).read())


if __name__ == '__main__':
  app.run(main)
