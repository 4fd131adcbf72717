"""Yang et al. 2025 (PaTH attention), eq. 3-4: e_ij = q_i^T (prod_{s=j+1}^{i} H_s) k_j / sqrt(d), the product
taken from H_i on the left down to H_{j+1}, H_s = I - beta_s w_s w_s^T, w_s = the unit vector of
x_s W_down W_up (head h's slice), beta_s = 2 sigmoid(x_s . u_h + b_h), x_s the layer's input. As
written: each matrix formed and multiplied, d x d. Causal only."""

import math

import numpy as np


def _reflection(context, s, h):
  layer = context.layer
  x = context.inputs[s]
  d = context.head_dim
  w = (x @ np.asarray(layer['w_down'], np.float64) @ np.asarray(layer['w_up'], np.float64))[h * d:(h + 1) * d]
  w = w / math.sqrt(float(w @ w) + 1e-12)
  beta = 2.0 / (1.0 + math.exp(-(float(x @ np.asarray(layer['beta_kernel'], np.float64)[:, h])
                                 + float(layer['beta_bias'][h]))))
  return np.eye(d) - beta * np.outer(w, w)


def logit(context, i, j, q_i, k_j, h):
  product = np.eye(context.head_dim)
  for s in range(i, j, -1):
    product = product @ _reflection(context, s, h)
  return float(q_i @ product @ k_j) / math.sqrt(context.head_dim)
