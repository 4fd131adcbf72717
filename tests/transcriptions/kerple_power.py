"""Chi et al. 2022 (KERPLE), the power kernel: e_ij = q_i . k_j / sqrt(d) - r1_h |i - j|^r2_h,
r1 clamped to at least 0.01 and r2 to [0.01, 2] (the authors' code); in causal attention only j <= i
is seen."""

import math


def logit(context, i, j, q_i, k_j, h):
  r1 = max(float(context.layer['r1'][h]), 0.01)
  r2 = min(max(float(context.layer['r2'][h]), 0.01), 2.0)
  return float(q_i @ k_j) / math.sqrt(context.head_dim) - r1 * abs(i - j) ** r2
