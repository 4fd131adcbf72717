"""Float64 transcriptions of each paper's attention equation, one file per variant of
transformer.positions.VARIANTS, named after it (tests/transcriptions/<kind>.py).

Written from the papers, independently of transformer/positions: scalar Python math per (i, j),
explicit L x L x d tensors where the paper has them. Slow on purpose; only for tiny inputs. The loop
of multi-head attention is here once (attention); a variant's file supplies what its paper changes,
any of:

  embed(x_LxD, positions, stack_params, settings) -> x_LxD       added to the inputs
  prepare(context)                                               per-pass terms (TUPE's LN(p_i) U)
  rotate(vector, position, settings) -> vector                   a query or key of one head
  scale(head_dim) -> float                                       the logit scale
  logit(context, i, j, q_i, k_j, h) -> float                     e_ij, the scale included; context.keys
                                                                 holds every key of the head (CoPE's gates),
                                                                 context.inputs the layer's input x_t of the
                                                                 row (FoX's gates)
  value(context, i, j, v_j, h) -> vector                         the value vector key j gives query i
  weights(context, i, allowed, logits) -> weights                the weights of the keys `allowed` (j <= i in
                                                                 a decoder) in place of their softmax

With the setting ssmax (every variant's) query i of head h is multiplied by s_h log n_i, n_i the keys
it sees, before the variant's logit (Nakanishi 2025, as the paper applies it).
"""

import importlib
import math
import types

import numpy as np


def transcription(kind: str) -> types.ModuleType:
  """The transcription of `kind`: a missing file fails the suite for that variant."""
  return importlib.import_module(f'tests.transcriptions.{kind}')


def default_logit(context, i, j, q_i, k_j, h) -> float:
  del i, j, h
  return float(q_i @ k_j) * context.scale


def attention(kind: str, x: np.ndarray, params: dict, num_heads: int, causal: bool, has_cls: bool,
              settings, offset: int = 0) -> np.ndarray:
  """One multi-head self-attention with the given variant, B x L x D -> B x L x D."""
  variant = transcription(kind)
  batch, length, dim = x.shape
  head_dim = dim // num_heads
  attention_params = params['attention']
  positions = [p + offset for p in range(length)]
  context = types.SimpleNamespace(stack=params.get('stack', {}), layer=params.get('layer', {}), settings=settings,
                                  causal=causal, has_cls=has_cls, positions=positions, num_heads=num_heads,
                                  dim=dim, head_dim=head_dim)
  context.scale = variant.scale(head_dim) if hasattr(variant, 'scale') else 1 / math.sqrt(head_dim)
  x = np.array(x, dtype=np.float64)
  if hasattr(variant, 'embed'):
    x = np.stack([variant.embed(x[b], positions, context.stack, settings) for b in range(batch)])
  if hasattr(variant, 'prepare'):
    variant.prepare(context)
  logit = getattr(variant, 'logit', default_logit)

  def project(name, inputs):
    return inputs @ np.asarray(attention_params[name]['kernel'], np.float64) + np.asarray(
        attention_params[name]['bias'], np.float64)

  q, k, v = (project(n, x).reshape(batch, length, num_heads, head_dim) for n in ('query', 'key', 'value'))
  output = np.zeros((batch, length, num_heads, head_dim))
  for b in range(batch):
    context.inputs = x[b]
    for h in range(num_heads):
      q_bh, k_bh = q[b, :, h], k[b, :, h]
      if hasattr(variant, 'rotate'):
        q_bh = np.stack([variant.rotate(q_bh[i], positions[i], settings) for i in range(length)])
        k_bh = np.stack([variant.rotate(k_bh[j], positions[j], settings) for j in range(length)])
      context.keys = k_bh
      for i in range(length):
        allowed = [j for j in range(length) if not causal or j <= i]
        if settings.ssmax:  # Nakanishi 2025: softmax((s log n) z) with the query scaled, n the keys it sees
          q_bh = q_bh.copy()
          q_bh[i] = q_bh[i] * float(attention_params['ssmax_scale'][h]) * math.log(len(allowed))
        row = np.array([logit(context, i, j, q_bh[i], k_bh[j], h) for j in allowed])
        if hasattr(variant, 'weights'):
          weights = variant.weights(context, i, allowed, row)
        else:
          weights = np.exp(row - row.max())
          weights /= weights.sum()
        for w, j in zip(weights, allowed):
          value_vector = variant.value(context, i, j, v[b, j, h], h) if hasattr(variant, 'value') else v[b, j, h]
          output[b, i, h] += w * value_vector
  merged = output.reshape(batch, length, dim)
  return merged @ np.asarray(attention_params['out']['kernel'], np.float64) + np.asarray(
      attention_params['out']['bias'], np.float64)
