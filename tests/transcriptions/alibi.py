"""Press et al. 2022: e_ij = q_i . k_j / sqrt(d) - m_h (i - j) in decoders, - m_h |i - j| in encoders;
m_h = 2^(-8h/n) for n heads a power of two (h from 1), for other n the slopes of the power of two
below, then every other slope of the one above."""

import math


def alibi_slope(head: int, num_heads: int) -> float:
  lower = 2 ** int(math.floor(math.log2(num_heads)))
  if head < lower:
    return 2.0 ** (-8.0 * (head + 1) / lower)
  return 2.0 ** (-8.0 * (2 * (head - lower) + 1) / (2 * lower))


def logit(context, i, j, q_i, k_j, h):
  distance = i - j if context.causal else abs(i - j)
  return float(q_i @ k_j) / math.sqrt(context.head_dim) - alibi_slope(h, context.num_heads) * distance
