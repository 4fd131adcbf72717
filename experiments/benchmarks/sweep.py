"""A sweep's wall time with 1 and with N programs at once (`experiments.compare --jobs`), in one sitting.

  python -m experiments.benchmark sweep [--config=configs/algorithmic.py:copy]
      [--positions=none,sinusoidal,rope,alibi,t5,kerple_log] [--seeds=1] [--jobs=1,2] [--repeats=2]
      [--overrides=train.steps=400,train.eval_every=400] [--workdir=DIR]

Each repeat runs the same compare command once per --jobs value, each in a fresh sweep directory; the
order alternates between repeats (1, 2, then 2, 1), so that a machine that slows down during the
sitting weighs on both. Prints each sweep's wall time, its ratio to the first --jobs value's in the same
repeat, and whether its results.csv is the first sweep's, byte for byte.
"""

import os
import subprocess
import sys
import tempfile
import time

from absl import flags

from experiments.shared import cli

_CONFIG = flags.DEFINE_string('config', 'configs/algorithmic.py:copy', 'The sweep\'s config.')
_POSITIONS = flags.DEFINE_string('positions', 'none,sinusoidal,rope,alibi,t5,kerple_log', 'The sweep\'s variants.')
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Seeds per variant.')
_JOBS = flags.DEFINE_list('jobs', ['1', '2'], 'The --jobs values compared; the first is the reference.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Sweeps per --jobs value, in alternating order.')
_OVERRIDES = flags.DEFINE_list('overrides', ['train.steps=400', 'train.eval_every=400'],
                               'FIELD=VALUE config overrides of every sweep.')
_VMAP_SEEDS = flags.DEFINE_bool('vmap_seeds', True, "compare's --vmap_seeds.")
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where the sweeps are kept (default: a temporary directory, removed).')


def _jobs_values() -> list[int]:
  values = []
  for value in _JOBS.value:
    if not value.strip().isdigit() or int(value) < 1:
      cli.fail(f'--jobs: got {",".join(_JOBS.value)}; valid: comma-separated positive integers, e.g. 1,2')
    values.append(int(value))
  return values


def _sweep(directory: str, jobs: int) -> float:
  """Runs one compare sweep; returns its wall time in seconds."""
  command = [sys.executable, '-m', 'experiments.compare', f'--config={_CONFIG.value}',
             f'--positions={_POSITIONS.value}', f'--seeds={_SEEDS.value}', f'--workdir={directory}',
             f'--jobs={jobs}', '--vmap_seeds' if _VMAP_SEEDS.value else '--novmap_seeds',
             *[f'--config.{override}' for override in _OVERRIDES.value]]
  started = time.perf_counter()
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - started
  if result.returncode != 0:
    cli.fail(f'the sweep with --jobs={jobs} failed (exit code {result.returncode}): '
             f'{(result.stderr.strip().splitlines() or ["no output"])[-1]}')
  return seconds


def main(argv):
  del argv
  jobs_values = _jobs_values()
  if _REPEATS.value < 1:
    cli.fail(f'--repeats: got {_REPEATS.value}; valid: a positive integer')
  for override in _OVERRIDES.value:
    if '=' not in override:
      cli.fail(f'--overrides: got {override!r}; valid: FIELD=VALUE, e.g. train.steps=400')
  cores = len(os.sched_getaffinity(0))
  with tempfile.TemporaryDirectory() as temporary:
    root = _WORKDIR.value or temporary
    rows, reference_csv = [], None
    for repeat in range(_REPEATS.value):
      order = jobs_values if repeat % 2 == 0 else jobs_values[::-1]
      seconds = {}
      for jobs in order:
        directory = os.path.join(root, f'repeat{repeat}-jobs{jobs}')
        seconds[jobs] = _sweep(directory, jobs)
        with open(os.path.join(directory, 'results.csv')) as file:
          table = file.read()
        reference_csv = table if reference_csv is None else reference_csv
        rows.append(dict(repeat=repeat, jobs=jobs, seconds=seconds[jobs], same=table == reference_csv))
      for row in rows[-len(order):]:
        row['ratio'] = row['seconds'] / seconds[jobs_values[0]]
  print(f'{_CONFIG.value}: {_POSITIONS.value} x {_SEEDS.value} seed(s), {" ".join(_OVERRIDES.value)}, '
        f'{"seeds in one program" if _VMAP_SEEDS.value else "one process per run"}, {cores} cores')
  print()
  print(f'| repeat | --jobs | wall (s) | / --jobs={jobs_values[0]} | results.csv as the first sweep\'s |')
  print('| ---: | ---: | ---: | ---: | --- |')
  for row in rows:
    print(f'| {row["repeat"] + 1} | {row["jobs"]} | {row["seconds"]:.1f} | {row["ratio"]:.2f} | '
          f'{"same" if row["same"] else "DIFFERENT"} |')
  if not all(row['same'] for row in rows):
    cli.fail('a sweep\'s results.csv differs from the first one\'s')
