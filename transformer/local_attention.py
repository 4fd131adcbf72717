"""Causal attention within a sliding window or a chunk, every block of queries at once: time and memory O(L (W + b)),
the backward pass too, where blocks visited one after another (blockwise.py) pay O(L) per block in the backward.

The sequence is cut into blocks of b queries. Block n reads its own b keys and the P = ceil((W - 1) / b) blocks
before it (a chunk of C: b = C, P = 0), gathered once as shifted views of the keys, so the logits of all blocks are
one batched matmul of nb x b x (P + 1) b per head (Beltagy et al. 2020's banded form; Mistral's sliding window):

  allowed(i, j) = j <= i, i - j < W (a window) or floor(i / C) = floor(j / C) (a chunk), key j real and in i's
                  document;  out_i = softmax_j(q_i k_j scale | allowed) v_j, a row with no allowed key zero.
"""

import math
from typing import Optional

import chex
import jax
import jax.numpy as jnp

from transformer.softmax import masked_fill_value, soft_cap


def _shifted_blocks(array_BxLx___, blocks: int, block: int, previous: int):
  """B x (previous + blocks) b x ... (the first `previous` blocks padding) -> B x blocks x (previous + 1) b x ...:
  block n's own rows and the `previous` blocks' before them."""
  rest = array_BxLx___.shape[2:]
  by_block = array_BxLx___.reshape(array_BxLx___.shape[0], previous + blocks, block, *rest)
  return jnp.concatenate([by_block[:, shift:shift + blocks] for shift in range(previous + 1)], axis=2)


def banded_attention(query: chex.Array, key: chex.Array, value: chex.Array, *, scale: float, window: int = 0,
                     chunk: int = 0, block_size: int = 128, key_valid_BxL: Optional[chex.Array] = None,
                     segments_BxL: Optional[chex.Array] = None, softcap: float = 0.0,
                     sink_H: Optional[chex.Array] = None) -> chex.Array:
  """query B x L x H x K, key B x L x G x K, value B x L x G x V (query head h reads key head h // (H / G)), the
  same positions: causal attention within a window of W keys (the query and the W - 1 before it) or a chunk of C
  positions. B x L x H x V. softcap c > 0: logits c tanh(x / c); sink_H: a logit per head in every denominator."""
  chex.assert_rank([query, key, value], 4)
  chex.assert_equal_shape_prefix([query, key, value], 2)
  if bool(window) == bool(chunk):
    raise ValueError(f'banded_attention: got window={window} and chunk={chunk}; valid: one of them positive')
  batch, length, heads, head_dim = query.shape
  groups = key.shape[2]
  block = chunk or min(block_size, max(window, 1))
  previous = 0 if chunk else math.ceil((window - 1) / block)
  blocks = -(-length // block)
  padded = blocks * block

  def keys_side(array_BxL___, fill):
    widths = [(0, 0), (previous * block, padded - length)] + [(0, 0)] * (array_BxL___.ndim - 2)
    return _shifted_blocks(jnp.pad(array_BxL___, widths, constant_values=fill), blocks, block, previous)
  query_BxNxbqxGxHgxK = jnp.pad(query, [(0, 0), (0, padded - length), (0, 0), (0, 0)]).reshape(
      batch, blocks, block, groups, heads // groups, head_dim).astype(jnp.float32) * scale
  key_BxNxbkxGxK = keys_side(key.astype(jnp.float32), 0)
  value_BxNxbkxGxV = keys_side(value, 0)
  logits = jnp.einsum('bnqgrk,bnsgk->bngrqs', query_BxNxbqxGxHgxK, key_BxNxbkxGxK)
  query_index_Nxbqx1 = (jnp.arange(padded).reshape(blocks, block))[:, :, None]
  key_index_Nxbk = keys_side(jnp.arange(length)[None], -1)[0]  # -1: before or after the sequence
  key_index_Nx1xbk = key_index_Nxbk[:, None, :]
  allowed = jnp.logical_and(key_index_Nx1xbk <= query_index_Nxbqx1, key_index_Nx1xbk >= 0)
  if window:
    allowed = jnp.logical_and(allowed, query_index_Nxbqx1 - key_index_Nx1xbk < window)
  else:
    allowed = jnp.logical_and(allowed, query_index_Nxbqx1 // chunk == key_index_Nx1xbk // chunk)
  allowed = allowed[None, :, None, None]  # 1 x N x 1 x 1 x bq x bk
  if key_valid_BxL is not None:
    valid_BxNxbk = keys_side(key_valid_BxL.astype(bool), False)
    allowed = jnp.logical_and(allowed, valid_BxNxbk[:, :, None, None, None, :])
  if segments_BxL is not None:
    query_segments_BxNxbq = jnp.pad(segments_BxL, [(0, 0), (0, padded - length)], constant_values=-1).reshape(
        batch, blocks, block)
    key_segments_BxNxbk = keys_side(segments_BxL, -2)
    same = query_segments_BxNxbq[:, :, :, None] == key_segments_BxNxbk[:, :, None, :]
    allowed = jnp.logical_and(allowed, same[:, :, None, None])
  logits = jnp.where(allowed, soft_cap(logits, softcap), masked_fill_value(jnp.float32))
  maximum = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  sink = None if sink_H is None else sink_H.astype(jnp.float32).reshape(1, 1, groups, heads // groups, 1, 1)
  if sink is not None:
    maximum = jnp.maximum(maximum, jax.lax.stop_gradient(sink))
  weights = jnp.where(allowed, jnp.exp(logits - maximum), 0.0)
  total = jnp.sum(weights, axis=-1, keepdims=True)
  if sink is not None:
    total = total + jnp.exp(sink - maximum)
  weights = weights / jnp.where(total > 0, total, 1.0)
  output = jnp.einsum('bngrqs,bnsgv->bnqgrv', weights, value_BxNxbkxGxV.astype(jnp.float32))
  output = output.reshape(batch, padded, heads, value.shape[-1])[:, :length].astype(value.dtype)
  chex.assert_shape(output, (batch, length, heads, value.shape[-1]))
  return output
