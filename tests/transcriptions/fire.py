"""Li et al. 2023 (FIRE), eq. 5 with its reference code's details: e_ij = q_i . k_j / sqrt(d) + f(x)_h,
x = psi(|i - j|) / (psi(max(L, i)) + 1e-6), psi(t) = log(|c| t + 1), L = |m| L0 (learned m) or L0,
f(x) = W2 relu(W1 x + b1) + b2. i and j are the absolute positions of query and key."""

import math

import numpy as np


def logit(context, i, j, q_i, k_j, h):
  layer, settings = context.layer, context.settings
  position_i, position_j = context.positions[i], context.positions[j]
  c = abs(float(layer['c']))
  threshold = settings.fire_threshold
  if settings.fire_learn_threshold:
    threshold = abs(float(layer['threshold_multiplier']) * threshold)
  x = math.log(c * abs(position_i - position_j) + 1) / (math.log(c * max(threshold, position_i) + 1) + 1e-6)
  hidden = np.maximum(x * np.asarray(layer['hidden_kernel'], np.float64) + np.asarray(layer['hidden_bias'], np.float64), 0)
  bias = hidden @ np.asarray(layer['output_kernel'], np.float64) + np.asarray(layer['output_bias'], np.float64)
  return float(q_i @ k_j) / math.sqrt(context.head_dim) + float(bias[h])
