"""Partial rotation: RoPE's 2 x 2 rotations on the first n = floor(fraction d / 2) pairs only, by
m base^(-2p/d) (p-RoPE, Barbero et al. 2025: the highest frequencies kept) or by m base^(-2p/(2n))
(GPT-NeoX's rotary_pct: a RoPE as wide as the rotated part); the other pairs unrotated."""

import math

import numpy as np


def rotate(vector, position, settings):
  dim = vector.shape[0]
  pairs = int(math.floor(settings.rotary_fraction * dim / 2 + 1e-9))
  width = dim if settings.rotary_frequencies == 'truncated' else 2 * pairs
  matrix = np.eye(dim)
  for p in range(pairs):
    angle = position * settings.rope_base ** (-2.0 * p / width)
    matrix[2 * p:2 * p + 2, 2 * p:2 * p + 2] = [[math.cos(angle), -math.sin(angle)],
                                               [math.sin(angle), math.cos(angle)]]
  return matrix @ vector
