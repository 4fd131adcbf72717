"""Vaswani et al. 2017, section 3.5: x_i + PE(i), PE(pos, 2c) = sin(pos / base^(2c/D)),
PE(pos, 2c+1) = cos(pos / base^(2c/D))."""

import math

import numpy as np


def sinusoid(pos: int, dim: int, base: float = 10000.0) -> np.ndarray:
  return np.array([math.sin(pos / base ** (2 * (c // 2) / dim)) if c % 2 == 0
                   else math.cos(pos / base ** (2 * (c // 2) / dim)) for c in range(dim)])


def embed(x_LxD, positions, stack_params, settings):
  del stack_params
  return x_LxD + np.stack([sinusoid(p, x_LxD.shape[1], settings.sinusoidal_base) for p in positions])
