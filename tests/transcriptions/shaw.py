"""Shaw et al. 2018, eq. 3-5: e_ij = q_i . (k_j + a^K_ij) / sqrt(d), z_i = sum_j w_ij (v_j + a^V_ij),
a_ij = table[clip(j - i, -k, k)] (one table for all heads, or one per head)."""

import math

import numpy as np


def _vector(table, i, j, h, clip):
  table = np.asarray(table, np.float64)
  return table[min(max(j - i, -clip), clip) + clip, h if table.shape[1] > 1 else 0]


def logit(context, i, j, q_i, k_j, h):
  a_key = _vector(context.layer['key_table'], i, j, h, context.settings.clip_distance)
  return float(q_i @ (k_j + a_key)) / math.sqrt(context.head_dim)


def value(context, i, j, v_j, h):
  return v_j + _vector(context.layer['value_table'], i, j, h, context.settings.clip_distance)
