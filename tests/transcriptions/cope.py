"""Golovneva et al. 2024 (CoPE), eq. 3-5 and their code: gates g_it = sigmoid(q_i . k_t / sqrt(d)) for
t <= i, p_ij = min(sum_{t=j..i} g_it, P - 1), e_ij = q_i . k_j / sqrt(d) + interpolation of
q_i . e[floor p] and q_i . e[ceil p] by the fraction of p. Causal only."""

import math

import numpy as np


def logit(context, i, j, q_i, k_j, h):
  del h
  scale = 1 / math.sqrt(context.head_dim)
  embeddings = np.asarray(context.layer['position_embeddings'], np.float64)  # head_dim x P
  gates = [1 / (1 + math.exp(-float(q_i @ context.keys[t]) * scale)) for t in range(j, i + 1)]
  position = min(sum(gates), embeddings.shape[1] - 1)
  low, high = math.floor(position), math.ceil(position)
  fraction = position - low
  positional = (1 - fraction) * float(q_i @ embeddings[:, low]) + fraction * float(q_i @ embeddings[:, high])
  return float(q_i @ k_j) * scale + positional
