"""Sun et al. 2022 (xPos), eq. 10-12 as torchscale computes it, with a fixed centre c:
e_nm = (R(n) q_n * zeta^((n - c)/gamma)) . (R(m) k_m * zeta^(-(m - c)/gamma)) / sqrt(d),
zeta_p = (2p/d + 0.4) / 1.4 for pair p (both of its dimensions), R(n) RoPE's rotation."""

import math

import numpy as np

from tests.transcriptions.rope import rotation_matrix


def _scaled(vector, position, settings, sign):
  dim = vector.shape[0]
  factors = np.array([((2 * (c // 2) / dim + 0.4) / 1.4) ** (sign * (position - settings.xpos_center) /
                                                             settings.xpos_scale_base) for c in range(dim)])
  return (rotation_matrix(position, dim, settings.rope_base) @ vector) * factors


def logit(context, i, j, q_i, k_j, h):
  del h
  settings, positions = context.settings, context.positions
  query = _scaled(q_i, positions[i], settings, +1)
  key = _scaled(k_j, positions[j], settings, -1)
  return float(query @ key) / math.sqrt(context.head_dim)
