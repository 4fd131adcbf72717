"""Ranking variants over several tasks by mean reciprocal rank, as Kazemnejad et al. 2023 ("The Impact
of Positional Encoding on Length Generalization in Transformers", NeurIPS 2023) rank positional
encodings: on each task, the variants are ranked by their score (here a metric averaged over the
evaluation lengths beyond the training length); a variant's MRR is the mean over tasks of 1 / rank.

With several seeds the ranking is made once per seed (seed s of every variant on every task) and the
MRR is given as the mean over seeds with its 95% Student-t interval, so the interval says how much
the ranking itself moves with the seed. Tied scores share the mean of the ranks they span. No JAX.
"""

import dataclasses
import math
from typing import Optional

from experiments.shared import statistics
from experiments.sweeps import results


class RankingError(ValueError):
  """The sweeps cannot be ranked together: one line."""


@dataclasses.dataclass
class Ranking:
  metric: str
  tasks: list                  # sweep labels, in the order given
  variants: list               # in the order of the first sweep
  seeds: list                  # the seeds every variant finished on every task
  scores: dict                 # task -> variant -> {seed: score}
  beyond: dict                 # task -> the evaluation lengths the score averages (those > training length)
  reciprocal_ranks: dict       # variant -> {seed: MRR over tasks}


def ranks(scores: dict, higher_is_better: bool) -> dict:
  """{variant: rank}, 1 the best; ties share the mean of the ranks they span."""
  ordered = sorted(scores, key=lambda v: -scores[v] if higher_is_better else scores[v])
  result, position = {}, 0
  while position < len(ordered):
    end = position
    while end + 1 < len(ordered) and scores[ordered[end + 1]] == scores[ordered[position]]:
      end += 1
    for variant in ordered[position:end + 1]:
      result[variant] = (position + end) / 2 + 1
    position = end + 1
  return result


def score_beyond_training(table: results.Table, variant: str, metric: str) -> tuple[dict, list]:
  """({seed: the metric's mean over the lengths beyond the training length}, those lengths)."""
  beyond = [length for length in table.lengths if length > table.training_length]
  if not beyond:
    raise RankingError(f'no evaluation length beyond the training length {table.training_length}; valid: a sweep '
                       f'whose task.eval_lengths go past task.max_length')
  per_length = table.by_seed.get(variant, {})
  seeds = set.intersection(*(set(per_length.get(length, {}).get(metric, {})) for length in beyond))
  return {seed: sum(per_length[length][metric][seed] for length in beyond) / len(beyond)
          for seed in sorted(seeds)}, beyond


def rank_sweeps(tables: dict, metric: str) -> Ranking:
  """tables: {task label: results.Table}. Every variant must appear in every table."""
  if metric not in results.HIGHER_IS_BETTER:
    raise RankingError(f'--metric: got {metric!r}; valid: {", ".join(results.HIGHER_IS_BETTER)}')
  labels = list(tables)
  variants = list(tables[labels[0]].variants)
  scores, beyond = {}, {}
  for label, table in tables.items():
    if sorted(table.variants) != sorted(variants):
      raise RankingError(f'{label}: its variants ({", ".join(table.variants)}) are not those of {labels[0]} '
                         f'({", ".join(variants)}); valid: sweeps of the same variants')
    scores[label] = {}
    for variant in variants:
      scores[label][variant], beyond[label] = score_beyond_training(table, variant, metric)
  seed_sets = [set(scores[label][variant]) for label in labels for variant in variants]
  seeds = sorted(set.intersection(*seed_sets))
  if not seeds:
    raise RankingError(f'no seed is finished for every variant on every task ({", ".join(labels)}); valid: '
                       f'finish the sweeps first')
  reciprocal = {variant: {} for variant in variants}
  for seed in seeds:
    per_task = [ranks({v: scores[label][v][seed] for v in variants}, results.HIGHER_IS_BETTER[metric])
                for label in labels]
    for variant in variants:
      reciprocal[variant][seed] = sum(1.0 / task_ranks[variant] for task_ranks in per_task) / len(labels)
  return Ranking(metric=metric, tasks=labels, variants=variants, seeds=seeds, scores=scores, beyond=beyond,
                 reciprocal_ranks=reciprocal)


def _interval(values: list) -> str:
  mean, half_width = statistics.mean_interval(values)
  return f'{mean:.3f}' if math.isnan(half_width) else f'{mean:.3f} ± {half_width:.3f}'


def markdown(ranking: Ranking, commands: Optional[list] = None) -> str:
  """The ranking table (by MRR, best first) and each task's scores."""
  seeds = ranking.seeds
  by_mrr = sorted(ranking.variants, key=lambda v: -statistics.mean_interval(
      [ranking.reciprocal_ranks[v][s] for s in seeds])[0])
  lines = [f'### Mean reciprocal rank over {len(ranking.tasks)} tasks ({ranking.metric} beyond the training length; '
           f'mean ± the 95% Student-t interval over {len(seeds)} seed{"s" if len(seeds) > 1 else ""}, ranked per seed)',
           '', '| variant | MRR | ' + ' | '.join(f'{t} rank' for t in ranking.tasks) + ' |',
           '|---|---|' + '---|' * len(ranking.tasks)]
  mean_scores = {t: {v: statistics.mean_interval([ranking.scores[t][v][s] for s in seeds])[0]
                     for v in ranking.variants} for t in ranking.tasks}
  mean_ranks = {t: ranks(mean_scores[t], results.HIGHER_IS_BETTER[ranking.metric]) for t in ranking.tasks}
  for variant in by_mrr:
    task_cells = ' | '.join(f'{mean_ranks[t][variant]:g}' for t in ranking.tasks)
    lines.append(f'| {variant} | {_interval([ranking.reciprocal_ranks[variant][s] for s in seeds])} | {task_cells} |')
  lines += ['', 'A task\'s rank column ranks the variants by their mean score over seeds; the MRR ranks them per '
                'seed, then averages.', '',
            f'### {ranking.metric} beyond the training length, per task (mean ± the 95% interval over seeds)', '',
            '| variant | ' + ' | '.join(f'{t} ({", ".join(map(str, ranking.beyond[t]))})' for t in ranking.tasks) + ' |',
            '|---|' + '---|' * len(ranking.tasks)]
  for variant in by_mrr:
    lines.append(f'| {variant} | ' + ' | '.join(
        _interval([ranking.scores[t][variant][s] for s in seeds]) for t in ranking.tasks) + ' |')
  if commands:
    lines += ['', 'Sweeps:', ''] + [f'    {command}' for command in commands]
  return '\n'.join(lines) + '\n'
