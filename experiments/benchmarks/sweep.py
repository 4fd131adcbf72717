"""A sweep's wall time with 1 and with N programs at once (`experiments.compare --jobs`), in one sitting.

  python -m experiments.benchmark sweep [--config=configs/algorithmic.py:copy]
      [--positions=none,sinusoidal,rope,alibi,t5,kerple_log] [--seeds=1] [--jobs=1,2,1x2] [--repeats=2]
      [--overrides=train.steps=400,train.eval_every=400] [--workdir=DIR]

--jobs lists the sweeps to time: J runs J programs at once of one core each, JxC of C cores each
(compare's --jobs and --cores_per_run). Each repeat runs the same compare command once per entry, each in
a fresh sweep directory; the order alternates between repeats (first to last, then last to first), so
that a machine that slows down during the sitting weighs on all. Prints each sweep's wall time, its ratio
to the first entry's in the same repeat, and whether its results.csv is byte for byte that of the first
sweep whose runs had as many cores (XLA:CPU's sums depend on a run's thread count, not on --jobs).
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
_JOBS = flags.DEFINE_list('jobs', ['1', '2'], 'The sweeps compared, each J (--jobs=J, one core per run) or JxC '
                          '(C cores per run); the first is the reference of the time ratios.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Sweeps per --jobs value, in alternating order.')
_OVERRIDES = flags.DEFINE_list('overrides', ['train.steps=400', 'train.eval_every=400'],
                               'FIELD=VALUE config overrides of every sweep.')
_VMAP_SEEDS = flags.DEFINE_bool('vmap_seeds', True, "compare's --vmap_seeds.")
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where the sweeps are kept (default: a temporary directory, removed).')


def _sweeps() -> list[tuple[int, int]]:
  """(jobs, cores per run) of each --jobs entry."""
  sweeps = []
  for value in _JOBS.value:
    jobs, _, cores = value.strip().partition('x')
    if not jobs.isdigit() or int(jobs) < 1 or (cores and (not cores.isdigit() or int(cores) < 1)):
      cli.fail(f'--jobs: got {",".join(_JOBS.value)}; valid: comma-separated J or JxC, positive integers, e.g. 1,2,1x2')
    sweeps.append((int(jobs), int(cores or 1)))
  if len(set(sweeps)) < len(sweeps):
    cli.fail(f'--jobs: got {",".join(_JOBS.value)}; valid: each sweep once')
  return sweeps


def sweep_order(sweeps: list, repeat: int) -> list:
  """The sweeps in the order of this repeat: as given, then reversed, alternately."""
  return sweeps if repeat % 2 == 0 else sweeps[::-1]


def _sweep(directory: str, jobs: int, cores: int) -> float:
  """Runs one compare sweep; returns its wall time in seconds."""
  command = [sys.executable, '-m', 'experiments.compare', f'--config={_CONFIG.value}',
             f'--positions={_POSITIONS.value}', f'--seeds={_SEEDS.value}', f'--workdir={directory}',
             f'--jobs={jobs}', f'--cores_per_run={cores}', '--vmap_seeds' if _VMAP_SEEDS.value else '--novmap_seeds',
             *[f'--config.{override}' for override in _OVERRIDES.value]]
  started = time.perf_counter()
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - started
  if result.returncode != 0:
    cli.fail(f'the sweep with --jobs={jobs} --cores_per_run={cores} failed (exit code {result.returncode}): '
             f'{(result.stderr.strip().splitlines() or ["no output"])[-1]}')
  return seconds


def main(argv):
  del argv
  sweeps = _sweeps()
  if _REPEATS.value < 1:
    cli.fail(f'--repeats: got {_REPEATS.value}; valid: a positive integer')
  for override in _OVERRIDES.value:
    if '=' not in override:
      cli.fail(f'--overrides: got {override!r}; valid: FIELD=VALUE, e.g. train.steps=400')
  cores = len(os.sched_getaffinity(0))
  with tempfile.TemporaryDirectory() as temporary:
    root = _WORKDIR.value or temporary
    rows, first_table = [], {}  # cores per run: the first results.csv of runs that size
    for repeat in range(_REPEATS.value):
      order = sweep_order(sweeps, repeat)
      seconds = {}
      for jobs, per_run in order:
        directory = os.path.join(root, f'repeat{repeat}-jobs{jobs}x{per_run}')
        seconds[jobs, per_run] = _sweep(directory, jobs, per_run)
        with open(os.path.join(directory, 'results.csv')) as file:
          table = file.read()
        first_table.setdefault(per_run, table)
        rows.append(dict(repeat=repeat, jobs=jobs, cores_per_run=per_run, seconds=seconds[jobs, per_run],
                         same=table == first_table[per_run]))
      for row in rows[-len(order):]:
        row['ratio'] = row['seconds'] / seconds[sweeps[0]]
  print(f'{_CONFIG.value}: {_POSITIONS.value} x {_SEEDS.value} seed(s), {" ".join(_OVERRIDES.value)}, '
        f'{"seeds in one program" if _VMAP_SEEDS.value else "one process per run"}, {cores} cores')
  print()
  print('| repeat | --jobs | --cores_per_run | wall (s) | / the first row\'s | results.csv as the first of its '
        'cores per run |')
  print('| ---: | ---: | ---: | ---: | ---: | --- |')
  for row in rows:
    print(f'| {row["repeat"] + 1} | {row["jobs"]} | {row["cores_per_run"]} | {row["seconds"]:.1f} | '
          f'{row["ratio"]:.2f} | {"same" if row["same"] else "DIFFERENT"} |')
  if not all(row['same'] for row in rows):
    cli.fail('a sweep\'s results.csv differs from the first one\'s of runs with as many cores')
