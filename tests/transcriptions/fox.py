"""Lin et al. 2025 (Forgetting Transformer), eq. 4-6: per head a forget gate f_t = sigmoid(w_h . x_t + b_h)
from the layer's input, and e_ij = q_i . k_j / sqrt(d) + sum_{l=j+1}^{i} log f_l for j <= i (the
decay over the tokens after the key, up to and including the query's). Causal only."""

import math

import numpy as np


def logit(context, i, j, q_i, k_j, h):
  weight = np.asarray(context.layer['forget_gate_kernel'], np.float64)[:, h]
  bias = float(context.layer['forget_gate_bias'][h])
  decay = 0.0
  for t in range(j + 1, i + 1):
    gate = 1.0 / (1.0 + math.exp(-(float(context.inputs[t] @ weight) + bias)))
    decay += math.log(gate)
  return float(q_i @ k_j) / math.sqrt(context.head_dim) + decay
