"""Intervals over seeds and paired comparisons (experiments/shared/statistics.py), against published
t-table values, scipy.stats's interval and paired t-test, a coverage simulation, and hand-computed sweeps."""

import json
import math
import random

import pytest
from scipy import stats as scipy_stats

from experiments.shared import statistics
from experiments.sweeps import results

T_975 = {1: 12.7062047, 2: 4.3026527, 3: 3.1824463, 4: 2.7764451, 5: 2.5705818, 9: 2.2621572, 10: 2.2281389,
         30: 2.0422725, 100: 1.9839715}  # two-sided 95% critical values (any statistics table)


@pytest.mark.parametrize('degrees', sorted(T_975))
def test_the_half_width_is_the_tables_t_times_the_standard_error(degrees):
  values = [0.1 * (i % 3) + 0.01 * i for i in range(degrees + 1)]
  mean = sum(values) / len(values)
  standard_error = math.sqrt(sum((v - mean) ** 2 for v in values) / degrees / len(values))
  assert statistics.mean_interval(values)[1] == pytest.approx(T_975[degrees] * standard_error, rel=1e-6)


def test_the_interval_covers_the_true_mean_95_percent_of_the_time():
  generator = random.Random(0)
  trials, covered = 20000, 0
  for _ in range(trials):
    mean, half_width = statistics.mean_interval([generator.gauss(3.0, 2.0) for _ in range(3)])
    covered += abs(mean - 3.0) <= half_width
  assert abs(covered / trials - 0.95) < 0.006  # 4 standard errors of a binomial proportion


def test_paired_differences_by_hand():
  values, reference = {0: 1.0, 1: 2.0, 2: 4.0}, {0: 0.5, 1: 1.0, 2: 2.5, 3: 9.0}  # seed 3: the reference's only
  mean, half_width, seeds, significant = statistics.paired_difference(values, reference)
  assert (mean, seeds) == (1.0, 3)  # differences 0.5, 1.0, 1.5: sd 0.5
  assert half_width == pytest.approx(4.3026527 * 0.5 / math.sqrt(3), abs=1e-6) and not significant
  assert statistics.paired_difference({0: 1.1, 1: 2.11, 2: 3.12}, {0: 1.0, 1: 2.0, 2: 3.0})[3]  # 0.10, 0.11, 0.12
  assert statistics.paired_difference({0: 1.0}, {0: 0.0}) is None
  assert math.isnan(statistics.mean_interval([0.5])[1])


def _run(sweep, name, seed, accuracy):
  workdir = sweep / name
  workdir.mkdir(parents=True)
  config = {'seed': seed, 'task': {'max_length': 6}, 'train': {'steps': 10}}
  (workdir / 'config.json').write_text(json.dumps(config))
  (workdir / 'metrics.jsonl').write_text(json.dumps(
      {'step': 10, 'split': 'eval', 'length': 6, 'token_accuracy': accuracy}) + '\n')
  (workdir / 'summary.json').write_text(json.dumps({'step': 10, 'evaluation': {}}))


def test_a_sweeps_table_gives_intervals_and_marks_significant_differences_from_the_reference(tmp_path):
  for seed, (none, rope, alibi) in enumerate([(0.50, 0.70, 0.52), (0.60, 0.81, 0.58), (0.55, 0.74, 0.59)]):
    _run(tmp_path, f'none-seed{seed}', seed, none)
    _run(tmp_path, f'rope-seed{seed}', seed, rope)
    _run(tmp_path, f'alibi-seed{seed}', seed, alibi)
  table = results.aggregate(str(tmp_path), ['none', 'rope', 'alibi'], 3)
  results.write_tables(str(tmp_path), table, {}, reference='none')
  markdown = (tmp_path / 'results.md').read_text()
  assert 'mean ± the 95% Student-t interval over seeds' in markdown
  assert '\\* differs from `none` at 5% (paired t-test over the seeds both finished)' in markdown
  half_width = 4.3026527 * 0.05 / math.sqrt(3)  # none: 0.50, 0.60, 0.55 have sd 0.05
  assert f'| none (reference) | 0.550 ± {half_width:.3f} | 3 |' in markdown
  rope_row, = [line for line in markdown.splitlines() if line.startswith('| rope |')]
  alibi_row, = [line for line in markdown.splitlines() if line.startswith('| alibi |')]
  assert rope_row.endswith('\\* | 3 |')  # +0.20, +0.21, +0.19: significant
  assert not alibi_row.endswith('\\* | 3 |')  # +0.02, -0.02, +0.04: not
  rows = {(r.split(',')[0]): r.split(',') for r in (tmp_path / 'results.csv').read_text().splitlines()[1:]}
  assert rows['rope'][11] == 'yes' and rows['alibi'][11] == 'no' and rows['none'][11] == ''
  assert float(rows['rope'][8]) == pytest.approx(0.2, abs=1e-9)


KNOWN_DATA = {  # small samples of the kind a sweep has: 3, 5 and 10 seeds
    'three_seeds': [0.633, 0.701, 0.594],
    'five_seeds': [2.42, 2.51, 2.47, 2.60, 2.39],
    'ten_seeds': [1.0, 0.992, 1.0, 0.984, 1.0, 1.0, 0.976, 1.0, 0.992, 1.0],
}


@pytest.mark.parametrize('name', sorted(KNOWN_DATA))
@pytest.mark.parametrize('confidence', [0.9, 0.95, 0.99])
def test_the_interval_matches_scipys_student_t_interval(name, confidence):
  values = KNOWN_DATA[name]
  low, high = scipy_stats.t.interval(confidence, len(values) - 1, loc=scipy_stats.tmean(values),
                                     scale=scipy_stats.sem(values))
  mean, half_width = statistics.mean_interval(values, confidence)
  assert mean == pytest.approx((low + high) / 2, abs=1e-12)
  assert half_width == pytest.approx((high - low) / 2, rel=1e-9)


def test_a_paired_difference_matches_scipys_paired_t_test():
  variant = {0: 0.97, 1: 0.91, 2: 0.95, 3: 0.99}
  reference = {0: 0.63, 1: 0.70, 2: 0.59, 3: 0.66, 7: 0.1}  # seed 7 has no partner: left out
  mean, half_width, seeds, significant = statistics.paired_difference(variant, reference)
  test = scipy_stats.ttest_rel([variant[s] for s in range(4)], [reference[s] for s in range(4)])
  interval = test.confidence_interval(0.95)
  assert seeds == 4 and mean == pytest.approx((interval.low + interval.high) / 2, abs=1e-12)
  assert half_width == pytest.approx((interval.high - interval.low) / 2, rel=1e-9)
  assert significant == (test.pvalue < 0.05)
