"""The retrieval grid of a sweep: the passkey or needle probes of several runs (experiments/evaluation/probes.py)
grouped into rows, one per variant (as trained or fine-tuned) and extension method, with the runs' seeds as
its replicates (experiments/evaluation/lineage.py).

A row's rate at a length is, for each seed, the exact-match rate over every depth's trials; the table
gives the mean over seeds with its 95% Student-t interval (experiments/shared/statistics.py) and each
seed's rate. The depth x length grid of a row pools its seeds' trials, each cell with its Wilson interval.
Only probes asked the same questions (the probe and its needles, lengths, depths, trials, filler, probe seed)
are tabulated together, and a row holds runs of one configuration: runs that differ in anything but their
seed are refused.
"""

import csv
import io
import json
import math
import os

import numpy as np

from experiments.evaluation import lineage, long_context
from experiments.evaluation.probes import PROBES, wilson_interval
from experiments.shared.statistics import mean_interval

QUESTIONS = ('probe', 'needles', 'lengths', 'depths', 'trials', 'filler', 'seed')  # what every tabulated probe must share


def row_label(description: dict) -> str:
  """The variant as trained (with its fine-tuning, if any) and the extension it was probed with (its overrides and
  the layers it stretched where not all)."""
  return lineage.label(description['run_configuration'], description['method'], description['factor'],
                       long_context.label_overrides(description))


def seeds_of(description: dict) -> tuple:
  """The probed run's seeds: its own after its sources' (experiments/evaluation/lineage.py)."""
  return tuple(description.get('source_seeds', ())) + (description['run_seed'],)


def _read(directory: str) -> tuple[dict, list]:
  spec, results = os.path.join(directory, 'evaluation.json'), os.path.join(directory, 'results.json')
  description = None
  if os.path.exists(spec):
    with open(spec) as file:
      description = json.load(file)
  if not description or description.get('probe') not in PROBES or not os.path.exists(results):
    raise ValueError(f'--collect: {directory} holds no finished retrieval probe (evaluation.json with probe passkey '
                     'or needle, and results.json); valid: RUN/evaluations/ directories the probes wrote')
  if 'run_configuration' not in description:
    raise ValueError(f'--collect: {directory} was probed before probes recorded their run\'s configuration; valid: '
                     'probe the run again under a new --name')
  with open(results) as file:
    return description, json.load(file)['cells']


def collect(directories: list[str]) -> tuple[list[lineage.Row], dict]:
  """(the rows of these probes' evaluation directories, the questions they all asked)."""
  probes = [(directory, *_read(directory)) for directory in directories]
  return group(probes), {name: probes[0][1].get(name) for name in QUESTIONS}


def group(probes: list[tuple[str, dict, list]]) -> list[lineage.Row]:
  """(directory, its evaluation.json, its cells) of each probe, as rows in the order their labels first
  appear (each row's by_seeds holds its runs' cells); a mix of questions, of configurations in one row, or
  one run twice is refused."""
  probes, questions = list(probes), None
  for directory, description, _ in probes:
    asked = {name: description.get(name) for name in QUESTIONS}
    if questions is None:
      questions = (directory, asked)
    differing = [name for name in QUESTIONS if asked[name] != questions[1][name]]
    if differing:
      name = differing[0]
      raise ValueError(f'--collect: {directory} was probed with {name} {asked[name]!r} and {questions[0]} with '
                       f'{questions[1][name]!r}; valid: probes that asked the same questions')
  return lineage.group((row_label(description),
                        lineage.evaluated_at(lineage.Lineage(description['run_configuration'], seeds_of(description)),
                                             description['checkpoint_step']), directory, cells)
                       for directory, description, cells in probes)


def seed_rates(row: lineage.Row, length: int) -> list[float]:
  """Each seed's rate of right answers at `length` over every depth's trials, in seed order."""
  rates = []
  for seed in sorted(row.by_seeds):
    cells = [cell for cell in row.by_seeds[seed] if cell['length'] == length]
    rates.append(sum(cell['correct'] for cell in cells) / sum(cell['trials'] for cell in cells))
  return rates


def pooled(row: lineage.Row, length: int, depth: float) -> tuple[int, int]:
  """(correct, trials) of one cell over the row's seeds."""
  cells = [cell for cells in row.by_seeds.values() for cell in cells
           if cell['length'] == length and cell['depth'] == depth]
  return sum(cell['correct'] for cell in cells), sum(cell['trials'] for cell in cells)


def _rate_text(rates: list[float]) -> str:
  mean, half_width = mean_interval(rates)
  interval = '' if math.isnan(half_width) else f' ± {half_width:.2f}'
  return f'{mean:.2f}{interval} ({", ".join(f"{rate:.2f}" for rate in rates)})'


SCORES = {'passkey': 'Passkey exact-match rate', 'needle': 'Needle string-match rate ({needles} needles, one asked for)'}


def tables(rows: list[lineage.Row], lengths: list[int], depths: list[float], trials: int, probe: str = 'passkey',
           needles: int = 0) -> str:
  """results.md: the rate by length per row (mean over seeds, each seed's), then each row's pooled grid."""
  header = ['row', 'seeds'] + [str(length) for length in lengths]
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for row in rows:
    lines.append(f'| {row.label} | {len(row.by_seeds)} | ' +
                 ' | '.join(_rate_text(seed_rates(row, length)) for length in lengths) + ' |')
  score = SCORES[probe].format(needles=needles)
  text = ('\n'.join(lines) + f'\n\n{score} at each prompt length over {len(depths)} depths x {trials} '
          'trials per seed: the mean over seeds ± the half-width of its 95% Student-t interval, then each seed\'s '
          'rate.\n')
  for row in rows:
    grid = [f'\n{row.label}, every seed\'s trials pooled (95% Wilson interval):\n',
            '| depth | ' + ' | '.join(str(length) for length in lengths) + ' |', '|---' * (len(lengths) + 1) + '|']
    for depth in depths:
      cells = []
      for length in lengths:
        correct, total = pooled(row, length, depth)
        low, high = wilson_interval(correct, total)
        cells.append(f'{correct}/{total} ({low:.2f}-{high:.2f})')
      grid.append(f'| {depth:g} | ' + ' | '.join(cells) + ' |')
    text += '\n'.join(grid) + '\n'
  return text


def csv_text(rows: list[lineage.Row]) -> str:
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  writer.writerow(['row', 'seed', 'length', 'depth', 'correct', 'trials', 'evaluation'])
  for row in rows:
    for seed in sorted(row.by_seeds):
      for cell in row.by_seeds[seed]:
        writer.writerow([row.label, lineage.seeds_text(seed), cell['length'], f'{cell["depth"]:g}', cell['correct'],
                         cell['trials'], row.directories[seed]])
  return buffer.getvalue()


def draw(path: str, rows: list[lineage.Row], lengths: list[int], depths: list[float]) -> None:
  """heatmaps.png: each row's pooled rate by depth and length, one panel per row."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from experiments.shared.files import save_figure_atomically  # pylint: disable=g-import-not-at-top
  columns = min(4, len(rows))
  panel_rows = -(-len(rows) // columns)
  figure, axes_grid = plt.subplots(panel_rows, columns, figsize=(3.2 * columns + 1, 2.6 * panel_rows + 0.4),
                                 squeeze=False, layout='constrained')
  for axes in axes_grid.flat[len(rows):]:
    axes.set_axis_off()
  for row, axes in zip(rows, axes_grid.flat):
    rate_DxL = np.zeros((len(depths), len(lengths)))
    for d, depth in enumerate(depths):
      for n, length in enumerate(lengths):
        correct, total = pooled(row, length, depth)
        rate_DxL[d, n] = correct / total
        axes.text(n, d, f'{correct}/{total}', ha='center', va='center', fontsize=7)
    image = axes.imshow(rate_DxL, vmin=0.0, vmax=1.0, cmap='RdYlGn', aspect='auto')
    axes.set_xticks(range(len(lengths)), [str(length) for length in lengths], fontsize=7)
    axes.set_yticks(range(len(depths)), [f'{depth:g}' for depth in depths], fontsize=7)
    seeds = len(row.by_seeds)
    axes.set_title(f'{row.label} ({seeds} seed{"s" if seeds > 1 else ""})', fontsize=8)
  for axes in axes_grid[:, 0]:
    axes.set_ylabel('needle depth', fontsize=8)
  for axes in axes_grid[-1]:
    axes.set_xlabel('prompt length (tokens)', fontsize=8)
  figure.colorbar(image, ax=axes_grid.ravel().tolist(), label='rate of right answers')
  save_figure_atomically(figure, path, dpi=100)
  plt.close(figure)


def write(output: str, rows: list[lineage.Row], probe: str = 'passkey', needles: int = 0) -> list[str]:
  """results.md, results.csv and heatmaps.png in `output`, each written whole or not at all."""
  from experiments.shared.files import write_text_atomically  # pylint: disable=g-import-not-at-top
  first = next(iter(rows[0].by_seeds.values()))
  lengths = sorted({cell['length'] for cell in first})
  depths = sorted({cell['depth'] for cell in first})
  os.makedirs(output, exist_ok=True)
  paths = [os.path.join(output, name) for name in ('results.md', 'results.csv', 'heatmaps.png')]
  write_text_atomically(paths[0], tables(rows, lengths, depths, first[0]['trials'], probe, needles))
  write_text_atomically(paths[1], csv_text(rows))
  draw(paths[2], rows, lengths, depths)
  return paths
