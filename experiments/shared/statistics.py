"""Intervals over seeds and paired comparisons, with Student's t from scipy.stats.

A metric measured on n seeds gets mean +- t_{0.975, n-1} s / sqrt(n), the 95% Student-t interval of
its mean (s the sample standard deviation). A variant is compared with a reference variant seed by
seed: the differences d_s = x_s - r_s over the seeds both finished, and the same interval for their
mean; the difference is significant at 5% (a two-sided paired t-test) when that interval excludes 0.
"""

import math
from typing import Optional

CONFIDENCE = 0.95


def mean_interval(values: list, confidence: float = CONFIDENCE) -> tuple[float, float]:
  """(mean, half-width of its Student-t interval); the half-width is NaN for fewer than 2 values."""
  count = len(values)
  mean = sum(values) / count
  if count < 2:
    return mean, math.nan
  std = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
  from scipy import stats  # pylint: disable=g-import-not-at-top  (a second to import; one seed needs no interval)
  return mean, float(stats.t.ppf(0.5 + confidence / 2.0, count - 1)) * std / math.sqrt(count)


def paired_difference(values: dict, reference: dict, confidence: float = CONFIDENCE
                      ) -> Optional[tuple[float, float, int, bool]]:
  """values and reference: {seed: value}. (mean difference, its interval's half-width, the number of
  seeds both have, whether the interval excludes 0); None with fewer than 2 shared seeds."""
  shared = sorted(set(values) & set(reference))
  if len(shared) < 2:
    return None
  mean, half_width = mean_interval([values[s] - reference[s] for s in shared], confidence)
  return mean, half_width, len(shared), abs(mean) > half_width
