"""Chi et al. 2022 (KERPLE), the logarithmic kernel: e_ij = q_i . k_j / sqrt(d) - r1_h log(1 + r2_h |i - j|),
r1 and r2 clamped to at least 0.01 (the authors' code); in causal attention only j <= i is seen."""

import math


def logit(context, i, j, q_i, k_j, h):
  r1 = max(float(context.layer['r1'][h]), 0.01)
  r2 = max(float(context.layer['r2'][h]), 0.01)
  return float(q_i @ k_j) / math.sqrt(context.head_dim) - r1 * math.log(1 + r2 * abs(i - j))
