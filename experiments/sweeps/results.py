"""Aggregates a sweep's runs into tables and plots. The runs' metrics.jsonl files are the source."""

import csv
import dataclasses
import io
import json
import math
import os
import re
from typing import Optional, Sequence

from experiments.runs import run_record
from experiments.shared.files import save_figure_atomically, write_json_atomically, write_text_atomically
from experiments.shared.plots import line_style
from experiments.shared.statistics import CONFIDENCE, mean_interval, paired_difference

FAILURES_FILE = 'failures.json'
EXCEPTION_LINE = re.compile(r'^[A-Za-z_.]*(Error|Exception|Loss)\b[^ ]*: ')  # a traceback's last line
MAIN_METRICS = ('bits_per_byte', 'bits_per_token', 'bits_per_character', 'token_accuracy', 'sequence_accuracy', 'accuracy', 'auc', 'mae', 'mse')
METRIC_RANGE = {'token_accuracy': (0.0, 1.0), 'sequence_accuracy': (0.0, 1.0), 'accuracy': (0.0, 1.0),
                'auc': (0.0, 1.0), 'bits_per_byte': (0.0, math.inf), 'bits_per_token': (0.0, math.inf),
                'bits_per_character': (0.0, math.inf), 'mae': (0.0, math.inf),
                'mse': (0.0, math.inf)}
HIGHER_IS_BETTER = {'token_accuracy': True, 'sequence_accuracy': True, 'accuracy': True, 'auc': True,
                    'bits_per_byte': False, 'bits_per_token': False, 'bits_per_character': False, 'mae': False, 'mse': False}


def baseline_of(name: str):
  """'bigram_bits_per_character' -> ('bigram', 'bits_per_character'): an evaluation record's
  baseline fields are <baseline>_<metric>; None for any other field."""
  if name in MAIN_METRICS:
    return None
  for metric in MAIN_METRICS:
    if name.endswith('_' + metric):
      return name[:-len(metric) - 1], metric
  return None


def error_line(lines: list[str], about: str = '') -> str:
  """The line of a failed run's output that says why: our one-line 'error:' (the one naming `about`,
  a run's workdir, when several do), else the last line of a traceback (the exception), else the last."""
  lines = [line.strip() for line in lines if line.strip()]
  errors = [l for l in lines if l.startswith('error:') or EXCEPTION_LINE.match(l)]
  naming = [l for l in errors if about and about in l]
  return (naming or errors or lines or ['no output'])[-1]


def run_name(variant: str, seed: int) -> str:
  return f'{variant}-seed{seed}'


class ResultsError(ValueError):
  """A run cannot be tabulated as it is (damaged metrics, another configuration): one line."""


def finished(workdir: str) -> bool:
  return run_record.is_finished(workdir)


def read_failures(sweep: str) -> dict:
  path = os.path.join(sweep, FAILURES_FILE)
  return json.load(open(path)) if os.path.exists(path) else {}


def write_failures(sweep: str, failures: dict) -> None:
  write_json_atomically(os.path.join(sweep, FAILURES_FILE), failures)


@dataclasses.dataclass
class Table:
  variants: list            # in the order asked for
  lengths: list             # evaluation lengths
  metrics: list             # the main metrics present
  training_length: int
  values: dict              # variant -> length -> metric -> [value per finished seed]
  by_seed: dict             # variant -> length -> metric -> {seed: value}
  baselines: dict           # metric -> baseline name -> length -> value (e.g. bigram bits per character)
  curves: dict              # variant -> [(steps, losses) per seed]
  seeds: dict               # variant -> number of finished seeds


def _records(workdir: str) -> list:
  path = os.path.join(workdir, 'metrics.jsonl')
  records = []
  with open(path) as file:
    for number, line in enumerate(file, 1):
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        raise ResultsError(f'{path}: line {number} is not a JSON record ({line[:60]!r}); move the run aside and '
                           f'run the sweep again to retrain it') from None
  return records


def aggregate(sweep: str, variants: list, seeds: int, expected: Optional[dict] = None) -> Table:
  """Every finished run of the sweep. expected: {run name: configuration}; a finished run whose stored
  configuration differs from it is a ResultsError, so a table never mixes configurations."""
  values, by_seed, baselines, curves, finished_seeds = {}, {}, {}, {}, {}
  lengths, metrics, training_length = set(), set(), 0
  for variant in variants:
    values[variant], by_seed[variant], curves[variant], finished_seeds[variant] = {}, {}, [], 0
    for seed in range(seeds):
      name = run_name(variant, seed)
      workdir = os.path.join(sweep, name)
      if not finished(workdir):
        continue
      stored = run_record.stored_config(workdir)
      if expected is not None and run_record.differences(stored, expected[name]):
        field, (old, new) = next(iter(run_record.differences(stored, expected[name]).items()))
        raise ResultsError(f'{name}: its configuration differs from the sweep\'s ({field}: {old!r} there, {new!r} '
                           f'asked for); the table would mix configurations')
      finished_seeds[variant] += 1
      training_length = stored['task']['max_length']
      records = _records(workdir)
      final_step = max(r['step'] for r in records if r['split'] == 'eval')
      for record in records:
        if record['split'] == 'eval' and record['step'] == final_step:
          length = record['length']
          lengths.add(length)
          for metric in MAIN_METRICS:
            if metric in record:
              metrics.add(metric)
              values[variant].setdefault(length, {}).setdefault(metric, []).append(record[metric])
              by_seed[variant].setdefault(length, {}).setdefault(metric, {})[seed] = record[metric]
          for name, value in record.items():
            if baseline_of(name):
              baseline, metric = baseline_of(name)
              baselines.setdefault(metric, {}).setdefault(baseline, {})[length] = value
      train = [r for r in records if r['split'] == 'train']
      curves[variant].append(([r['step'] for r in train], [r['loss'] for r in train]))
  return Table(variants=list(variants), lengths=sorted(lengths), metrics=[m for m in MAIN_METRICS if m in metrics],
               training_length=training_length, values=values, by_seed=by_seed, baselines=baselines,
               curves=curves, seeds=finished_seeds)


def mean_std(values: list) -> tuple:
  mean = sum(values) / len(values)
  std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
  return mean, std


def _number(value: float) -> str:
  return '' if math.isnan(value) else f'{value:.6g}'


def write_tables(sweep: str, table: Table, failures: dict, reference: Optional[str] = None,
                 overrides: Sequence[str] = ()) -> list:
  """results.csv (one row per variant, length and metric) and results.md (one table per metric): the
  mean over seeds with its 95% Student-t interval; with a reference variant, each other variant's
  paired difference from it and whether that is significant (experiments/shared/statistics.py).
  overrides: the command line's --config.FIELD=VALUE that every run got, which results.md names first,
  so that a row labelled `rope` says it is RoPE with them (scalable softmax, say)."""
  csv_path, md_path = os.path.join(sweep, 'results.csv'), os.path.join(sweep, 'results.md')
  write_text_atomically(csv_path, _csv_text(table, failures, reference))
  every_run = ['Every run: ' + ', '.join(f'`{override}`' for override in overrides), '', ''] if overrides else []
  write_text_atomically(md_path, '\n'.join(every_run) + _markdown_text(table, failures, reference))
  return [csv_path, md_path]


def _comparison(table: Table, reference: Optional[str], variant: str, length, metric: str):
  """The paired difference of variant from the reference at (length, metric); None for no reference or itself."""
  if reference is None or variant == reference:
    return None
  return paired_difference(table.by_seed[variant].get(length, {}).get(metric, {}),
                           table.by_seed[reference].get(length, {}).get(metric, {}))


def _csv_text(table: Table, failures: dict, reference: Optional[str]) -> str:
  rows = io.StringIO()
  writer = csv.writer(rows)
  writer.writerow(['variant', 'length', 'metric', 'mean', 'std', 'ci95_half_width', 'seeds', 'reference',
                   'difference', 'difference_ci95_half_width', 'paired_seeds', 'significant', 'status'])
  for variant in table.variants:
    failed = [name for name in failures if name.startswith(variant + '-seed')]
    for length in table.lengths:
      for metric in table.metrics:
        found = table.values[variant].get(length, {}).get(metric, [])
        if found:
          mean, std = mean_std(found)
          half_width = mean_interval(found)[1]
          paired = _comparison(table, reference, variant, length, metric)
          difference = ['', '', '', ''] if paired is None else [
              f'{paired[0]:.6g}', _number(paired[1]), paired[2], 'yes' if paired[3] else 'no']
          writer.writerow([variant, length, metric, f'{mean:.6g}', f'{std:.6g}', _number(half_width), len(found),
                           reference or '', *difference, 'ok' if not failed else f'{len(failed)} failed'])
    for name in failed:
      writer.writerow([variant, '', '', '', '', '', 0, '', '', '', '', '', f'failed: {failures[name]}'])
  for metric, by_name in table.baselines.items():
    for name, by_length in by_name.items():
      for length, value in sorted(by_length.items()):
        writer.writerow([f'{name} (baseline)', length, metric, f'{value:.6g}', '0', '', '', '', '', '', '', '',
                         'ok'])
  return rows.getvalue()


def _markdown_text(table: Table, failures: dict, reference: Optional[str]) -> str:
  lines = []
  header = ['variant'] + [f'{n} (train)' if n == table.training_length else str(n) for n in table.lengths]
  interval = f'mean ± the {CONFIDENCE:.0%} Student-t interval over seeds'
  for metric in table.metrics:
    better = 'higher' if HIGHER_IS_BETTER[metric] else 'lower'
    lines += [f'### {metric} by evaluation length ({better} is better; {interval})', '']
    if reference is not None:
      lines += [f'\\* differs from `{reference}` at 5% (paired t-test over the seeds both finished)', '']
    lines += ['| ' + ' | '.join(header) + ' | seeds |', '|' + '---|' * (len(header) + 1)]
    for variant in table.variants:
      cells = []
      for length in table.lengths:
        found = table.values[variant].get(length, {}).get(metric, [])
        if found:
          mean, half_width = mean_interval(found)
          cell = f'{mean:.3f} ± {half_width:.3f}' if len(found) > 1 else f'{mean:.3f}'
          paired = _comparison(table, reference, variant, length, metric)
          cells.append(cell + ('\\*' if paired is not None and paired[3] else ''))
        else:
          cells.append('—')
      label = f'{variant} (reference)' if variant == reference else variant
      lines.append(f'| {label} | ' + ' | '.join(cells) + f' | {table.seeds[variant]} |')
    for name, by_length in table.baselines.get(metric, {}).items():
      lines.append(f'| {name} (baseline) | ' + ' | '.join(
          f'{by_length[n]:.3f}' if n in by_length else '—' for n in table.lengths) + ' | |')
    lines.append('')
  if failures:
    lines += ['### Failed runs', '']
    lines += [f'- `{name}`: {error}' for name, error in sorted(failures.items())]
    lines.append('')
  return '\n'.join(lines)


def plot(sweep: str, table: Table) -> list:
  """plot_<metric>.png: the metric against evaluation length, a line per variant, a band for the 95%
  interval of its mean over seeds (cut to the metric's range: a t interval of accuracies over three
  seeds can reach past 1; the tables give it whole), the training length marked; training_curves.png: training loss against step."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  written = []
  for metric in table.metrics:
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for variant_index, variant in enumerate(table.variants):
      points = [(n, table.values[variant][n][metric]) for n in table.lengths
                if metric in table.values[variant].get(n, {})]
      if not points:
        continue
      xs = [n for n, _ in points]
      means = [mean_std(v)[0] for _, v in points]
      line, = axis.plot(xs, means, label=variant, **line_style(variant_index))
      if all(len(v) > 1 for _, v in points):  # the 95% interval of the mean
        intervals = [mean_interval(v) for _, v in points]
        low, high = METRIC_RANGE.get(metric, (-math.inf, math.inf))  # drawn within what the metric can be
        axis.fill_between(xs, [max(m - h, low) for m, h in intervals], [min(m + h, high) for m, h in intervals],
                          color=line.get_color(), alpha=0.2)
    for index, (name, by_length) in enumerate(table.baselines.get(metric, {}).items()):
      xs = sorted(by_length)
      axis.plot(xs, [by_length[n] for n in xs], linestyle=(0, (1, 1 + index)), color='grey',
                label=f'{name} baseline')
    axis.axvline(table.training_length, color='black', linestyle='--', linewidth=1, label='training length')
    axis.set_xscale('log', base=2)
    axis.set_xticks(table.lengths, [str(n) for n in table.lengths])
    axis.minorticks_off()
    axis.set_xlabel('evaluation length')
    axis.set_ylabel(metric.replace('_', ' '))
    axis.legend(fontsize=8, ncol=2)
    axis.grid(alpha=0.3)
    path = os.path.join(sweep, f'plot_{metric}.png')
    figure.tight_layout()
    save_figure_atomically(figure, path, dpi=120)
    plt.close(figure)
    written.append(path)
  figure, axis = plt.subplots(figsize=(7, 4.5))
  for variant in table.variants:
    for index, (steps, losses) in enumerate(table.curves[variant]):
      style = line_style(table.variants.index(variant))
      axis.plot(steps, losses, label=variant if index == 0 else None, color=style['color'],
                linestyle=style['linestyle'], alpha=0.8)
  axis.set_xlabel('step')
  axis.set_ylabel('training loss')
  axis.set_yscale('log')
  axis.legend(fontsize=8, ncol=2)
  axis.grid(alpha=0.3)
  path = os.path.join(sweep, 'training_curves.png')
  figure.tight_layout()
  save_figure_atomically(figure, path, dpi=120)
  plt.close(figure)
  return written + [path]
