"""Two compare sweeps of the same variants, task and budget that differ in one treatment (the block, a setting):
does the treatment move each variant, and does it change their order? No JAX.

For each variant both sweeps finished and each evaluation length: the paired difference B - A over the seeds
both finished (d_s = b_s - a_s, its mean with the 95% Student-t interval; significant at 5% when the interval
excludes 0, experiments/shared/statistics.py), each sweep's rank of the variant by its mean over seeds, and
Kendall's tau-b between the two orders at that length (scipy.stats.kendalltau, with its two-sided p-value).
Sweeps whose task or training fields differ are refused: their numbers would not answer for one treatment.
"""

import dataclasses
import math

from experiments.shared import statistics
from experiments.sweeps import ranking, results

SAME_FIELDS = ('task.', 'train.')  # what two sweeps must share to be compared


class SweepsError(ValueError):
  """The two sweeps cannot be compared: one line."""


@dataclasses.dataclass
class Comparison:
  metric: str
  labels: tuple                # (label of A, label of B)
  variants: list               # finished in both, in A's order
  only: dict                   # label -> variants only that sweep finished
  lengths: list
  training_length: int
  treatment: list              # (field, value in A, value in B) where the sweeps differ
  differences: dict            # variant -> length -> statistics.paired_difference(...) or None
  means: dict                  # label -> variant -> length -> mean over seeds
  ranks: dict                  # label -> length -> {variant: rank}
  kendall: dict                # length -> (tau, p-value)


def treatment(configs_a: dict, configs_b: dict) -> list:
  """(field, A's value, B's value) for every field where a variant's runs differ between the sweeps (the
  variant's own settings compared only where both have them); SweepsError for a task or training field."""
  changed = {}
  for variant in sorted(set(configs_a) & set(configs_b)):
    a, b = configs_a[variant], configs_b[variant]
    for field in sorted(set(a) | set(b)):
      if a.get(field) != b.get(field) and (field in a and field in b or not field.startswith('model.position.')):
        if field.startswith(SAME_FIELDS):
          raise SweepsError(f'{variant}: {field} is {a.get(field)!r} in one sweep and {b.get(field)!r} in the other; '
                            'valid: sweeps of the same task and training budget')
        changed[field] = (a.get(field), b.get(field))
  return [(field, *values) for field, values in changed.items()]


def compare(labels: tuple, tables: tuple, configs: tuple, metric: str) -> Comparison:
  """tables and configs: (A's, B's), from experiments/sweeps/stored_sweep.read."""
  from scipy import stats  # pylint: disable=g-import-not-at-top  (a second to import; the refusals need none)
  table_a, table_b = tables
  for label, table in zip(labels, tables):
    if metric not in table.metrics:
      raise SweepsError(f'--metric: got {metric!r}; {label} evaluates {", ".join(table.metrics)}')
  if table_a.lengths != table_b.lengths or table_a.training_length != table_b.training_length:
    raise SweepsError(f'{labels[0]} evaluates {table_a.lengths} trained at {table_a.training_length}, {labels[1]} '
                      f'{table_b.lengths} at {table_b.training_length}; valid: the same lengths')
  variants = [v for v in table_a.variants if v in table_b.variants]
  if len(variants) < 2:
    raise SweepsError(f'{labels[0]} and {labels[1]} share {len(variants)} variant(s) ({", ".join(variants)}); valid: '
                      'at least two, to compare their order')
  only = {label: [v for v in table.variants if v not in variants] for label, table in zip(labels, tables)}
  differences, means, ranks, kendall = {}, {label: {} for label in labels}, {label: {} for label in labels}, {}
  higher = results.HIGHER_IS_BETTER[metric]
  for length in table_a.lengths:
    for label, table in zip(labels, tables):
      for variant in variants:
        seeds = table.by_seed[variant].get(length, {}).get(metric, {})
        means[label].setdefault(variant, {})[length] = statistics.mean_interval(list(seeds.values()))[0]
      ranks[label][length] = ranking.ranks({v: means[label][v][length] for v in variants}, higher)
    for variant in variants:
      differences.setdefault(variant, {})[length] = statistics.paired_difference(
          table_b.by_seed[variant].get(length, {}).get(metric, {}),
          table_a.by_seed[variant].get(length, {}).get(metric, {}))
    tau = stats.kendalltau([ranks[labels[0]][length][v] for v in variants],
                           [ranks[labels[1]][length][v] for v in variants])
    kendall[length] = (float(tau.statistic), float(tau.pvalue))
  return Comparison(metric=metric, labels=tuple(labels), variants=variants, only=only, lengths=table_a.lengths,
                    training_length=table_a.training_length, treatment=treatment(*configs), differences=differences,
                    means=means, ranks=ranks, kendall=kendall)


def _length_header(comparison: Comparison) -> str:
  return ' | '.join(f'{length}{" (train)" if length == comparison.training_length else ""}'
                    for length in comparison.lengths)


def markdown(comparison: Comparison) -> str:
  a, b = comparison.labels
  metric = comparison.metric
  lines = [f'A: {a}; B: {b}. They differ in: ' + ('; '.join(
      f'{field} ({value_a!r} in A, {value_b!r} in B)' for field, value_a, value_b in comparison.treatment) or
      'nothing but their runs\' seeds and variants'), '']
  for label, only in comparison.only.items():
    if only:
      lines += [f'Only in {label} (left out): {", ".join(only)}', '']
  columns = len(comparison.lengths)
  lines += [f'### {metric}: B - A, paired over the seeds both finished (mean ± the 95% Student-t interval; \\* the '
            'interval excludes 0)', '', f'| variant | {_length_header(comparison)} | seeds |',
            '|---|' + '---|' * (columns + 1)]
  for variant in comparison.variants:
    cells, seeds = [], 0
    for length in comparison.lengths:
      paired = comparison.differences[variant][length]
      if paired is None:
        cells.append('-')
        continue
      mean, half_width, seeds, significant = paired
      cells.append(f'{mean:+.3f} ± {half_width:.3f}{chr(92) + "*" if significant else ""}')
    lines.append(f'| {variant} | {" | ".join(cells)} | {seeds} |')
  lines += ['', f'### {metric}: each variant\'s rank by its mean over seeds, A -> B (1 the best)', '',
            f'| variant | {_length_header(comparison)} |', '|---|' + '---|' * columns]
  for variant in comparison.variants:
    cells = [f'{comparison.ranks[a][length][variant]:g} -> {comparison.ranks[b][length][variant]:g}'
             for length in comparison.lengths]
    lines.append(f'| {variant} | {" | ".join(cells)} |')
  lines += ['', 'Kendall\'s tau-b between the two orders (1: the same order; p two-sided): ' + ', '.join(
      f'{length}: {tau:.2f} (p {p:.3f})' if not math.isnan(tau) else f'{length}: -'
      for length, (tau, p) in comparison.kendall.items()) + '.']
  return '\n'.join(lines) + '\n'
