"""Su et al. 2021 (RoFormer), eq. 15: q_m -> R(m) q_m, k_n -> R(n) k_n, R(m) block diagonal of 2 x 2
rotations by m theta_i, theta_i = base^(-2i/d)."""

import math

import numpy as np


def rotation_matrix(pos: int, dim: int, base: float) -> np.ndarray:
  matrix = np.zeros((dim, dim))
  for i in range(dim // 2):
    angle = pos * base ** (-2.0 * i / dim)
    matrix[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[math.cos(angle), -math.sin(angle)],
                                               [math.sin(angle), math.cos(angle)]]
  return matrix


def rotate(vector, position, settings):
  return rotation_matrix(position, vector.shape[0], settings.rope_base) @ vector
