"""Naive, loop-by-loop transcriptions of each paper's attention equation, in float64 numpy.

Written from the papers, independently of transformer/positions: scalar Python math per (i, j),
explicit L x L x d tensors where the paper has them. Slow on purpose; only for tiny inputs.
"""

import math

import numpy as np


def sinusoid(pos: int, dim: int, base: float = 10000.0) -> np.ndarray:
  """Vaswani et al. section 3.5: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...)."""
  return np.array([math.sin(pos / base ** (2 * (c // 2) / dim)) if c % 2 == 0
                   else math.cos(pos / base ** (2 * (c // 2) / dim)) for c in range(dim)])


def t5_bucket(relative: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
  """T5's bucketing, per scalar distance."""
  n = -relative
  offset = 0
  if bidirectional:
    num_buckets //= 2
    if n < 0:
      offset = num_buckets
    n = abs(n)
  else:
    n = max(n, 0)
  exact = num_buckets // 2
  if n < exact:
    return offset + n
  large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
  return offset + min(large, num_buckets - 1)


def alibi_slope(head: int, num_heads: int) -> float:
  """Press et al.: 2^(-8h/n) for n a power of two (h from 1), interleaving for others."""
  lower = 2 ** int(math.floor(math.log2(num_heads)))
  if head < lower:
    return 2.0 ** (-8.0 * (head + 1) / lower)
  return 2.0 ** (-8.0 * (2 * (head - lower) + 1) / (2 * lower))


def layer_norm(x: np.ndarray, scale, offset, eps=1e-6) -> np.ndarray:
  mean = x.mean()
  return (x - mean) / math.sqrt(((x - mean) ** 2).mean() + eps) * scale + offset


def rotation_matrix(pos: int, dim: int, base: float) -> np.ndarray:
  """RoFormer eq. 15: block diagonal of 2x2 rotations by pos * theta_i, theta_i = base^(-2i/d)."""
  matrix = np.zeros((dim, dim))
  for i in range(dim // 2):
    angle = pos * base ** (-2.0 * i / dim)
    matrix[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[math.cos(angle), -math.sin(angle)],
                                               [math.sin(angle), math.cos(angle)]]
  return matrix


def attention(kind: str, x: np.ndarray, params: dict, num_heads: int, causal: bool, has_cls: bool,
              position_config, offset: int = 0) -> np.ndarray:
  """One multi-head self-attention with the given variant, B x L x D -> B x L x D."""
  batch, length, dim = x.shape
  head_dim = dim // num_heads
  attention_params, stack, layer = params['attention'], params.get('stack', {}), params.get('layer', {})
  positions = [p + offset for p in range(length)]
  x = np.array(x, dtype=np.float64)
  if kind == 'sinusoidal':
    x = x + np.stack([sinusoid(p, dim, position_config.sinusoidal_base) for p in positions])
  if kind == 'learned':
    x = x + np.asarray(stack['table'])[positions]

  def project(name, inputs):
    return inputs @ np.asarray(attention_params[name]['kernel'], np.float64) + np.asarray(
        attention_params[name]['bias'], np.float64)

  q, k, v = (project(n, x).reshape(batch, length, num_heads, head_dim) for n in ('query', 'key', 'value'))
  tupe = kind in ('tupe_a', 'tupe_r')
  tupe_params = stack.get('components_0', stack)
  t5_table = None
  if kind in ('t5', 'tupe_r'):
    t5_stack = stack.get('components_1', {}) if kind == 'tupe_r' else stack
    t5_layer = layer.get('components_1', {}) if kind == 'tupe_r' else layer
    t5_table = np.asarray(t5_stack['relative_bias'] if position_config.shared_across_layers
                          else t5_layer['relative_bias'])
  if tupe:
    if position_config.absolute_table == 'learned':
      absolute = np.asarray(tupe_params['table'])[positions]
    else:
      absolute = np.stack([sinusoid(p, dim, position_config.sinusoidal_base) for p in positions])
    normed = np.stack([layer_norm(a, np.asarray(tupe_params['norm_scale']), np.asarray(tupe_params['norm_offset']))
                       for a in absolute])
    u_q, u_k = np.asarray(tupe_params['query_projection']), np.asarray(tupe_params['key_projection'])

  output = np.zeros((batch, length, num_heads, head_dim))
  for b in range(batch):
    for h in range(num_heads):
      q_bh, k_bh = q[b, :, h], k[b, :, h]
      if kind == 'rope':
        q_bh = np.stack([rotation_matrix(positions[i], head_dim, position_config.rope_base) @ q_bh[i]
                         for i in range(length)])
        k_bh = np.stack([rotation_matrix(positions[j], head_dim, position_config.rope_base) @ k_bh[j]
                         for j in range(length)])
      logits = np.zeros((length, length))
      for i in range(length):
        for j in range(length):
          scale = 1 / math.sqrt(2 * head_dim) if tupe else 1 / math.sqrt(head_dim)
          key_vector = k_bh[j].copy()
          if kind == 'shaw':
            c = position_config.clip_distance
            table = np.asarray(layer['key_table'])
            key_vector += table[min(max(j - i, -c), c) + c, h if table.shape[1] > 1 else 0]
          e = float(q_bh[i] @ key_vector) * scale
          if tupe:
            if has_cls and position_config.cls_reset and i == 0:
              e += float(tupe_params['cls_theta'][0, h])
            elif has_cls and position_config.cls_reset and j == 0:
              e += float(tupe_params['cls_theta'][1, h])
            else:
              e += float((normed[i] @ u_q[:, h]) @ (normed[j] @ u_k[:, h])) * scale
          if t5_table is not None:
            e += float(t5_table[t5_bucket(j - i, not causal, position_config.num_buckets,
                                          position_config.max_distance), h])
          if kind == 'alibi':
            e += -alibi_slope(h, num_heads) * (i - j if causal else abs(i - j))
          logits[i, j] = e
      for i in range(length):
        allowed = [j for j in range(length) if not causal or j <= i]
        row = np.array([logits[i, j] for j in allowed])
        weights = np.exp(row - row.max())
        weights /= weights.sum()
        for w, j in zip(weights, allowed):
          value_vector = v[b, j, h].copy()
          if kind == 'shaw':
            c = position_config.clip_distance
            table = np.asarray(layer['value_table'])
            value_vector += table[min(max(j - i, -c), c) + c, h if table.shape[1] > 1 else 0]
          output[b, i, h] += w * value_vector
  merged = output.reshape(batch, length, dim)
  return merged @ np.asarray(attention_params['out']['kernel'], np.float64) + np.asarray(
      attention_params['out']['bias'], np.float64)
