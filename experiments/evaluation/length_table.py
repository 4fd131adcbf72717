"""The table of long-context evaluations (experiments/evaluation/long_context.py) over several runs: a row per
configuration (as trained, or fine-tuned from another run) and extension method, with the runs' seeds as
its replicates (experiments/evaluation/lineage.py).

Each row's score at a length is the mean over its seeds with the half-width of its 95% Student-t interval
(experiments/shared/statistics.py; a row of one seed has no interval), and each seed's score is listed
below. By position: the mean over seeds of each band of window positions at the longest length.
"""

import csv
import io
import math
import os

import numpy as np

from experiments.evaluation import lineage, long_context
from experiments.shared.files import save_figure_atomically, write_text_atomically
from experiments.shared.plots import line_style
from experiments.shared.statistics import mean_interval


def group(evaluations) -> list[lineage.Row]:
  """(directory, its evaluation.json, its results by length) of each evaluation as rows (by_seeds holds
  each run's results by length); a row that would mix configurations (the checkpoint's step among them), or
  hold one run twice, is refused."""
  items = []
  for directory, description, results in evaluations:
    run_lineage = lineage.of_run(description['run'])
    label = lineage.label(run_lineage.configuration, description['method'], description['factor'],
                          long_context.label_overrides(description))
    items.append((label, lineage.evaluated_at(run_lineage, description['checkpoint_step']), directory, results))
  return lineage.group(items)


def _first_record(rows: list[lineage.Row]) -> dict:
  return next(iter(next(iter(rows[0].by_seeds.values())).values()))


def metric_of(rows: list[lineage.Row]) -> tuple[str, str]:
  """(the results' score, its words): bits per byte for corpus runs, bits per character for Shakespeare, a
  task's headline metric (token accuracy for copy) for a task run."""
  metric = long_context.record_metric(_first_record(rows))
  return metric, long_context.metric_label(metric)


def has_positions(rows: list[lineage.Row]) -> bool:
  """Whether the results hold bits by window position (a language model's; a task run's do not)."""
  return 'bits_by_position' in _first_record(rows)


def seed_values(row: lineage.Row, length: int, metric: str) -> list[float]:
  """Each seed's score at `length`, in seed order."""
  return [row.by_seeds[seeds][length][metric] for seeds in sorted(row.by_seeds)]


def _mean_text(values: list[float]) -> str:
  mean, half_width = mean_interval(values)
  return f'{mean:.3f}' if math.isnan(half_width) else f'{mean:.3f} ± {half_width:.3f}'


def _band_means(row: lineage.Row, length: int, bands) -> list[list[float]]:
  """For each band, each seed's mean bits over the band's positions of a window of `length`."""
  curves = [np.asarray(row.by_seeds[seeds][length]['bits_by_position']) for seeds in sorted(row.by_seeds)]
  return [[float(curve[first - 1:last - 1].mean()) for curve in curves] for first, last in bands]  # positions 1..L-1


def tables(rows: list[lineage.Row], lengths: list[int], trained: int, protocol: str) -> tuple[str, str, str]:
  """(results.md, by_position.md, results.csv); by_position.md is '' for task runs (no windows)."""
  metric, words = metric_of(rows)
  header = ['run', 'seeds'] + [str(length) for length in lengths]
  by_length = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  each_seed = ['| run | seed | ' + ' | '.join(str(length) for length in lengths) + ' |',
               '|' + '---|' * (len(lengths) + 2)]
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  writer.writerow(['run', 'seed'] + [str(length) for length in lengths] + ['evaluation'])
  for row in rows:
    values_by_length = [seed_values(row, length, metric) for length in lengths]
    by_length.append(f'| {row.label} | {len(row.by_seeds)} | ' +
                     ' | '.join(_mean_text(values) for values in values_by_length) + ' |')
    for index, seeds in enumerate(sorted(row.by_seeds)):
      values = [values[index] for values in values_by_length]
      each_seed.append(f'| {row.label} | {lineage.seeds_text(seeds)} | ' + ' | '.join(f'{v:.3f}' for v in values)
                       + ' |')
      writer.writerow([row.label, lineage.seeds_text(seeds)] + [f'{v:.5f}' for v in values]
                      + [row.directories[seeds]])
  results = ('\n'.join(by_length) + f'\n\n{words.capitalize()} {_where(rows)} ({protocol}; the first run was '
             f'trained at {trained}): the mean over seeds ± the half-width of its 95% Student-t interval.\n\n'
             'Each seed (a fine-tune as its source\'s seed / its own):\n\n' + '\n'.join(each_seed) + '\n')
  if not has_positions(rows):
    return results, '', buffer.getvalue()
  longest = lengths[-1]
  bands = long_context.position_bands(longest, trained)
  band_lines = ['| run | ' + ' | '.join(f'{first}-{last - 1}' for first, last in bands) + ' |',
                '|' + '---|' * (len(bands) + 1)]
  for row in rows:
    band_lines.append(f'| {row.label} | ' + ' | '.join(_mean_text(values)
                                                      for values in _band_means(row, longest, bands)) + ' |')
  unit = 'character' if metric == 'bits_per_character' else 'token'
  by_position = ('\n'.join(band_lines) + f'\n\nBits per {unit} at each position of a window of {longest}, averaged '
                 f'over the windows and over the positions of each band, then over seeds ({protocol}; trained at '
                 f'{trained}).\n')
  return results, by_position, buffer.getvalue()


def _where(rows: list[lineage.Row]) -> str:
  return 'on the held-out stream' if has_positions(rows) else 'on each run\'s evaluation problems'


def _plot_by_length(axes, row: lineage.Row, index: int, lengths: list[int], metric: str) -> dict:
  """The row's mean over seeds at each length, with its interval shaded; returns the row's line style."""
  style = line_style(index)
  intervals = [mean_interval(seed_values(row, length, metric)) for length in lengths]
  axes.plot(lengths, [mean for mean, _ in intervals], label=f'{row.label} ({len(row.by_seeds)})', **style)
  if len(row.by_seeds) > 1:
    axes.fill_between(lengths, [m - h for m, h in intervals], [m + h for m, h in intervals], color=style['color'],
                      alpha=0.15)
  return style


def _finish_by_length(axes, words: str, trained: int) -> None:
  axes.set_xscale('log', base=2)
  axes.set_xlabel('length')
  axes.set_ylabel(f'{words} (mean over seeds)')
  axes.axvline(trained, color='grey', linewidth=0.8, linestyle=':')
  axes.grid(alpha=0.3)


def draw(path: str, rows: list[lineage.Row], lengths: list[int], trained: int) -> None:
  """plot_extension.png: by length (the mean over seeds and its interval) and, for language models, by
  position within the longest window (the mean over seeds of each run's mean over windows, smoothed)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  metric, words = metric_of(rows)
  if not has_positions(rows):
    figure, by_length = plt.subplots(1, 1, figsize=(10, 4.8 + 0.2 * len(rows)))
    for index, row in enumerate(rows):
      _plot_by_length(by_length, row, index, lengths, metric)
    _finish_by_length(by_length, words, trained)
    figure.legend(*by_length.get_legend_handles_labels(), fontsize=7, title='row (seeds)', title_fontsize=7,
                  loc='lower center', ncol=1)
    figure.tight_layout(rect=(0, 0.026 * len(rows) + 0.06, 1, 1))  # the legend below the axes, a line per row
    save_figure_atomically(figure, path, dpi=110)
    plt.close(figure)
    return
  figure, (by_length, by_position) = plt.subplots(1, 2, figsize=(16, 4.8))
  width = 1
  for index, row in enumerate(rows):
    style = _plot_by_length(by_length, row, index, lengths, metric)
    curve = np.mean([row.by_seeds[seeds][lengths[-1]]['bits_by_position'] for seeds in row.by_seeds], axis=0)
    width = max(1, len(curve) // 64)
    smooth = np.convolve(curve, np.ones(width) / width, mode='valid')
    by_position.plot(np.arange(1, len(smooth) + 1) + width // 2, smooth, label=row.label, color=style['color'],
                     linestyle=style['linestyle'])
  _finish_by_length(by_length, words, trained)
  by_position.set_xlabel(f'position within a window of {lengths[-1]} (mean over windows and seeds, '
                         f'{width}-position average)')
  by_position.set_ylabel('bits per character' if metric == 'bits_per_character' else 'bits per token')
  by_position.axvline(trained, color='grey', linewidth=0.8, linestyle=':')
  by_position.grid(alpha=0.3)
  by_position.set_xscale('log', base=2)
  by_position.legend(*by_length.get_legend_handles_labels(), fontsize=7, title='row (seeds)', title_fontsize=7,
                     loc='center left', bbox_to_anchor=(1.01, 0.5))
  figure.tight_layout()
  save_figure_atomically(figure, path, dpi=110)
  plt.close(figure)


def write(output: str, rows: list[lineage.Row], lengths: list[int], trained: int, protocol: str) -> list[str]:
  """results.md, by_position.md (language models only), results.csv and plot_extension.png in `output`, each
  whole or not at all."""
  os.makedirs(output, exist_ok=True)
  paths = [os.path.join(output, name) for name in ('results.md', 'by_position.md', 'results.csv',
                                                   'plot_extension.png')]
  written = []
  for path, text in zip(paths, tables(rows, lengths, trained, protocol)):
    if text:
      write_text_atomically(path, text)
      written.append(path)
  draw(paths[3], rows, lengths, trained)
  return written + [paths[3]]


def print_table(rows: list[lineage.Row], lengths: list[int]) -> None:
  metric, words = metric_of(rows)
  cells = [[_mean_text(seed_values(row, length, metric)) for length in lengths] for row in rows]
  width = max(len(row.label) for row in rows)
  cell_width = max(8, *(len(cell) for line in cells for cell in line))
  print(f'\n{words} by window length (mean over seeds ± the 95% t half-width)')
  print(f'{"run":<{width}} {"seeds":>5} ' + ' '.join(f'{length:>{cell_width}}' for length in lengths))
  for row, line in zip(rows, cells):
    print(f'{row.label:<{width}} {len(row.by_seeds):>5} ' + ' '.join(f'{cell:>{cell_width}}' for cell in line))
