"""Imports go one way between the project's rooms, read from every import statement in the code (those inside
functions too): configs -> nothing of ours; transformer -> nothing of ours; experiments/shared, tasks and data ->
none of runs, evaluation, sweeps; runs -> not evaluation or sweeps; evaluation -> not sweeps."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
OURS = ('configs', 'experiments', 'transformer')

# room: the rooms of ours it may import (itself always). A room is a top-level package or experiments/<folder>;
# experiments' commands (experiments/*.py) may import everything.
ALLOWED = {
    'configs': set(),
    'transformer': set(),
    'experiments.shared': {'transformer'},
    'experiments.data': {'experiments.shared', 'transformer'},
    'experiments.pretrained': {'experiments.shared', 'transformer'},
    'experiments.tasks': {'experiments.shared', 'experiments.data', 'transformer'},
    'experiments.runs': {'experiments.shared', 'experiments.tasks', 'experiments.data', 'transformer'},
    'experiments.evaluation': {'experiments.shared', 'experiments.tasks', 'experiments.data', 'experiments.runs',
                               'transformer'},
    'experiments.sweeps': {'experiments.shared', 'experiments.tasks', 'experiments.data', 'experiments.runs',
                           'experiments.evaluation', 'transformer', 'configs'},
    'experiments.benchmarks': {'experiments.shared', 'experiments.tasks', 'experiments.data', 'experiments.runs',
                               'experiments.evaluation', 'experiments.sweeps', 'transformer', 'configs'},
}


def room_of(module: str):
  """'experiments.runs' for experiments.runs.trainer, 'transformer' for transformer.positions.rope; None for a
  command (experiments.train) or the experiments package itself."""
  parts = module.split('.')
  if parts[0] != 'experiments':
    return parts[0] if parts[0] in OURS else None
  if len(parts) >= 2 and f'experiments.{parts[1]}' in ALLOWED:
    return f'experiments.{parts[1]}'
  return None


def imported_modules(path: pathlib.Path) -> list:
  """(line, module) for every import of ours in the file, at any depth; `from experiments import runs` counts as
  experiments.runs."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      found.append((node.lineno, node.module))
      found += [(node.lineno, f'{node.module}.{alias.name}') for alias in node.names
                if node.module in ('experiments',)]
  return [(line, module) for line, module in found if module.split('.')[0] in OURS]


def _module_of(path: pathlib.Path) -> str:
  return '.'.join(path.relative_to(ROOT).with_suffix('').parts).removesuffix('.__init__')


SOURCES = sorted(p for folder in OURS for p in (ROOT / folder).rglob('*.py'))


def test_the_rooms_import_one_way():
  wrong = []
  for path in SOURCES:
    room = room_of(_module_of(path))
    if room is None:
      continue
    for line, module in imported_modules(path):
      target = room_of(module)
      if target is not None and target != room and target not in ALLOWED[room]:
        wrong.append(f'{path.relative_to(ROOT)}:{line} imports {module} ({room} may import {sorted(ALLOWED[room])})')
  assert not wrong, '\n'.join(wrong)


def test_the_evaluation_room_holds_what_reads_a_finished_run():
  evaluation = {p.stem for p in (ROOT / 'experiments' / 'evaluation').glob('*.py')}
  assert {'long_context', 'windows', 'probes', 'probe_grid', 'length_table', 'task_lengths', 'factor_search',
          'rope_scaling', 'decoding', 'lineage'} <= evaluation
  assert not evaluation & {p.stem for p in (ROOT / 'experiments' / 'runs').glob('*.py')} - {'__init__'}


@pytest.mark.parametrize('source, expected', [
    ('from experiments.sweeps import results\n', 'experiments.sweeps'),
    ('def f():\n  from experiments.sweeps.statistics import mean_interval\n', 'experiments.sweeps'),
    ('from experiments import sweeps\n', 'experiments.sweeps'),
    ('import experiments.sweeps.local as local\n', 'experiments.sweeps'),
])
def test_the_check_sees_every_form_of_import(tmp_path, source, expected):
  """The check is not blind: each way of writing an upward import is found and placed in its room."""
  path = tmp_path / 'module.py'
  path.write_text(source)
  assert [room_of(module) for _, module in imported_modules(path) if room_of(module)] == [expected]
