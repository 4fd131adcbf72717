"""Raffel et al. 2020, section 2.1: e_ij = q_i . k_j / sqrt(d) + b_h[bucket(j - i)], mesh-tensorflow's
bucketing: exact buckets for the nearest distances, log-spaced ones up to max_distance, both
directions in encoders, the past only in decoders."""

import math

import numpy as np


def t5_bucket(relative: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
  """T5's bucketing, per scalar distance."""
  n = -relative
  offset = 0
  if bidirectional:
    num_buckets //= 2
    if n < 0:
      offset = num_buckets
    n = abs(n)
  else:
    n = max(n, 0)
  exact = num_buckets // 2
  if n < exact:
    return offset + n
  large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
  return offset + min(large, num_buckets - 1)


def bias(context, stack, layer, i, j, h) -> float:
  """b_h[bucket(j - i)] from the shared table (the stack's) or the layer's own."""
  settings = context.settings
  table = np.asarray(stack['relative_bias'] if settings.shared_across_layers else layer['relative_bias'])
  return float(table[t5_bucket(j - i, not context.causal, settings.num_buckets, settings.max_distance), h])


def logit(context, i, j, q_i, k_j, h):
  return float(q_i @ k_j) / math.sqrt(context.head_dim) + bias(context, context.stack, context.layer, i, j, h)
