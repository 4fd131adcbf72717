"""Ke et al. 2021, eq. 6-8: e_ij = (x_i W^Q)(x_j W^K) / sqrt(2d) + (LN(p_i) U^Q)(LN(p_j) U^K) / sqrt(2d),
p_i a sinusoidal or learned absolute table; with a [CLS] token at 0, its row of the positional term
is a learned theta_1 and its column (below row 0) a learned theta_2, per head."""

import math

import numpy as np

from tests.transcriptions.sinusoidal import sinusoid


def layer_norm(x: np.ndarray, scale, offset, eps=1e-6) -> np.ndarray:
  mean = x.mean()
  return (x - mean) / math.sqrt(((x - mean) ** 2).mean() + eps) * scale + offset


def scale(head_dim):
  return 1 / math.sqrt(2 * head_dim)


def tupe_params(context):
  return context.stack.get('components_0', context.stack)  # tupe_r nests TUPE's as its first part


def prepare(context):
  params, settings = tupe_params(context), context.settings
  if settings.absolute_table == 'learned':
    absolute = np.asarray(params['table'], np.float64)[context.positions]
  else:
    absolute = np.stack([sinusoid(p, context.dim, settings.sinusoidal_base) for p in context.positions])
  context.normed = np.stack([layer_norm(a, np.asarray(params['norm_scale']), np.asarray(params['norm_offset']))
                             for a in absolute])


def position_term(context, i, j, h) -> float:
  params, settings = tupe_params(context), context.settings
  if context.has_cls and settings.cls_reset and i == 0:
    return float(params['cls_theta'][0, h])
  if context.has_cls and settings.cls_reset and j == 0:
    return float(params['cls_theta'][1, h])
  u_q, u_k = np.asarray(params['query_projection']), np.asarray(params['key_projection'])
  return float((context.normed[i] @ u_q[:, h]) @ (context.normed[j] @ u_k[:, h])) * context.scale


def logit(context, i, j, q_i, k_j, h):
  return float(q_i @ k_j) * context.scale + position_term(context, i, j, h)
