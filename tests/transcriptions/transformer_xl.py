"""Dai et al. 2019 (Transformer-XL), section 3.3: A_ij = q_i . k_j + u . k_j + q_i . W_R R_{i-j} + v . W_R R_{i-j},
scaled by 1/sqrt(d); R_t = [sin(t w_c), cos(t w_c)] (all sines, then all cosines), w_c = base^(-2c/D);
u, v shared by the layers (the stack's) or the layer's own."""

import math

import numpy as np


def _relative(t: int, dim: int, base: float) -> np.ndarray:
  sines = [math.sin(t * base ** (-2.0 * c / dim)) for c in range(dim // 2)]
  cosines = [math.cos(t * base ** (-2.0 * c / dim)) for c in range(dim // 2)]
  return np.array(sines + cosines)


def logit(context, i, j, q_i, k_j, h):
  settings = context.settings
  owner = context.stack if settings.shared_across_layers else context.layer
  u = np.asarray(owner['content_bias'], np.float64)[h]
  v = np.asarray(owner['position_bias'], np.float64)[h]
  projection = np.asarray(context.layer['relative_projection'], np.float64)
  head = slice(h * context.head_dim, (h + 1) * context.head_dim)
  r = _relative(context.positions[i] - context.positions[j], context.dim, settings.sinusoidal_base) @ projection[:, head]
  return float(q_i @ k_j + u @ k_j + q_i @ r + v @ r) / math.sqrt(context.head_dim)
