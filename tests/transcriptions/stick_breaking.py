"""Tan et al. 2025 (stick-breaking attention), eq. 1-2: beta_ij = sigmoid(z_ij), z_ij = q_i . k_j / sqrt(d),
and A_ij = beta_ij prod_{j<k<i} (1 - beta_ik) for keys j < i (j <= i, the product over j < k <= i, when the
query attends to itself); no softmax, no positions. Causal only."""

import math

import numpy as np


def weights(context, i, allowed, logits):
  attend_current = context.settings.stick_breaking_attend_current
  beta = {j: 1.0 / (1.0 + math.exp(-z)) for j, z in zip(allowed, logits)}
  result = []
  for j in allowed:
    if j == i and not attend_current:
      result.append(0.0)
      continue
    weight = beta[j]
    for k in range(j + 1, i + 1 if attend_current else i):
      weight *= 1.0 - beta[k]
    result.append(weight)
  return np.array(result)
