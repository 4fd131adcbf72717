"""Intervals over seeds and paired comparisons, in plain Python (the tables import no NumPy or JAX).

A metric measured on n seeds gets mean +- t_{0.975, n-1} s / sqrt(n), the 95% Student-t interval of
its mean (s the sample standard deviation). A variant is compared with a reference variant seed by
seed: the differences d_s = x_s - r_s over the seeds both finished, and the same interval for their
mean; the difference is significant at 5% (a two-sided paired t-test) when that interval excludes 0.
"""

import functools
import math
from typing import Optional

CONFIDENCE = 0.95


def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
  """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
  tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
  c, d = 1.0, 1.0 - qab * x / qap
  d = 1.0 / (d if abs(d) > tiny else tiny)
  result = d
  for m in range(1, 500):
    for numerator in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                      -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
      d = 1.0 + numerator * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + numerator / c
      c = c if abs(c) > tiny else tiny
      result *= d * c
    if abs(d * c - 1.0) < 1e-15:
      break
  return result


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
  """I_x(a, b) = B(x; a, b) / B(a, b), for 0 <= x <= 1."""
  if x <= 0.0 or x >= 1.0:
    return 0.0 if x <= 0.0 else 1.0
  log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
  if x < (a + 1.0) / (a + b + 2.0):
    return math.exp(log_front) * _incomplete_beta_fraction(a, b, x) / a
  return 1.0 - math.exp(log_front) * _incomplete_beta_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, degrees_of_freedom: float) -> float:
  """P(T <= t) for Student's t: 1 - I_{v / (v + t^2)}(v / 2, 1 / 2) / 2 for t >= 0, symmetric below."""
  tail = 0.5 * regularized_incomplete_beta(degrees_of_freedom / 2.0, 0.5,
                                           degrees_of_freedom / (degrees_of_freedom + t * t))
  return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=None)
def student_t_quantile(probability: float, degrees_of_freedom: float) -> float:
  """The t with P(T <= t) = probability, by bisection on the CDF (to 1e-12)."""
  if not 0.0 < probability < 1.0:
    raise ValueError(f'probability: got {probability}; valid: a number in (0, 1)')
  if probability < 0.5:
    return -student_t_quantile(1.0 - probability, degrees_of_freedom)
  low, high = 0.0, 1.0
  while student_t_cdf(high, degrees_of_freedom) < probability:
    low, high = high, 2.0 * high
  while high - low > 1e-12 * max(1.0, high):
    middle = 0.5 * (low + high)
    low, high = (middle, high) if student_t_cdf(middle, degrees_of_freedom) < probability else (low, middle)
  return 0.5 * (low + high)


def mean_interval(values: list, confidence: float = CONFIDENCE) -> tuple[float, float]:
  """(mean, half-width of its Student-t interval); the half-width is NaN for fewer than 2 values."""
  count = len(values)
  mean = sum(values) / count
  if count < 2:
    return mean, math.nan
  std = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
  return mean, student_t_quantile(0.5 + confidence / 2.0, count - 1) * std / math.sqrt(count)


def paired_difference(values: dict, reference: dict, confidence: float = CONFIDENCE
                      ) -> Optional[tuple[float, float, int, bool]]:
  """values and reference: {seed: value}. (mean difference, its interval's half-width, the number of
  seeds both have, whether the interval excludes 0); None with fewer than 2 shared seeds."""
  shared = sorted(set(values) & set(reference))
  if len(shared) < 2:
    return None
  mean, half_width = mean_interval([values[s] - reference[s] for s in shared], confidence)
  return mean, half_width, len(shared), abs(mean) > half_width
