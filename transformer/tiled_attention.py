"""Causal attention over the same positions as a rolled loop of small tiles (the forward pass of FlashAttention,
Dao et al. 2022, in plain JAX): for each block of T queries, a loop over the blocks of T keys up to its own (the
blocks after it never visited), an online softmax carried through (Milakov and Gimelshein 2018):

  s = cap(Q_i K_j^T scale) (masked)   m' = max(m, rowmax s)   p = exp(s - m')
  l' = exp(m - m') l + rowsum p        o' = exp(m - m') o + p V_j        out_i = o / l  (zeros for a row with no key)

A sink logit per head starts every row at m = s, l = 1. The loops are rolled (lax.map over the query blocks, a
fori_loop over each one's key blocks), so the program does not grow with the length, and a tile's logits (H x T x T)
stay in a CPU core's cache, where blockwise.py's unrolled blocks of 1,024 x 4,096 write every block's logits to
memory and read them back for the softmax. Differentiated, it is blockwise.py's attention, forward and backward (a
loop whose length depends on the block cannot be reversed): a training step and its gradients are the blockwise
core's, and the tiles serve the passes without gradients (evaluation, scoring, decoding).
"""

import functools
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from transformer.attention_request import AttentionMask
from transformer.blockwise import blockwise_attention, normalised_output, online_softmax_update, sink_start
from transformer.softmax import masked_fill_value

TILE = 512  # queries and keys per tile: 512 x 512 logits per head


class TiledSettings(NamedTuple):
  """The static arguments: the tile, the logits' scale and cap, and the blocks of the backward pass."""
  tile: int
  scale: float
  softcap: float
  backward_block_size: int
  backward_key_block_size: Optional[int]


def tiled_causal_attention(query: chex.Array, key: chex.Array, value: chex.Array, *, scale: float,
                           key_valid_BxL: Optional[chex.Array] = None, segments_BxL: Optional[chex.Array] = None,
                           softcap: float = 0.0, sink_H: Optional[chex.Array] = None, tile: int = TILE,
                           backward_block_size: int = 1024,
                           backward_key_block_size: Optional[int] = None) -> chex.Array:
  """query B x L x H x K, key B x L x G x K, value B x L x G x V, the same positions (query head h reads key head
  h // (H / G)): causal softmax attention, the keys' padding (key_valid_BxL) and documents (segments_BxL) masked.
  B x L x H x V in value's dtype. softcap c > 0: logits c tanh(x / c); sink_H: a logit per head in every
  denominator. Differentiated, blockwise_attention runs with backward_block_size (and _key_block_size)."""
  chex.assert_rank([query, key, value], 4)
  chex.assert_equal_shape_prefix([query, key, value], 2)
  settings = TiledSettings(tile, float(scale), float(softcap), backward_block_size, backward_key_block_size)
  return _attention(query, key, value, sink_H, (key_valid_BxL, segments_BxL), settings)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(query, key, value, sink_H, mask_parts, settings: TiledSettings):
  return _tiled_forward(query, key, value, sink_H, mask_parts, settings)


def _tiled_forward(query, key, value, sink_H, mask_parts, settings: TiledSettings):
  """The rolled loops: B x L x H x V."""
  batch, length, heads, _ = query.shape
  tile = settings.tile
  blocks = -(-length // tile)
  padding = blocks * tile - length
  pad = lambda array, fill=0: None if array is None else jnp.pad(
      array, [(0, 0), (0, padding)] + [(0, 0)] * (array.ndim - 2), constant_values=fill)
  key_valid_BxL, segments_BxL = mask_parts
  # Padded keys come after every real query, so the causal mask alone keeps them from the real rows.
  mask = AttentionMask(causal=True, in_parts=True, key_valid_BxLk=pad(key_valid_BxL, True),
                       segments_BxL=pad(segments_BxL, -1))
  query_BxHxLxK = jnp.transpose(pad(query), (0, 2, 1, 3)).astype(jnp.float32) * settings.scale
  key_BxGxLxK = jnp.transpose(pad(key), (0, 2, 1, 3)).astype(jnp.float32)
  value_BxGxLxV = jnp.transpose(pad(value), (0, 2, 1, 3))
  value_dim = value.shape[-1]

  def query_block(index):
    q_start = index * tile
    query_BxHxbqxK = jax.lax.dynamic_slice_in_dim(query_BxHxLxK, q_start, tile, axis=2)

    def key_block(key_index, state):
      k_start = key_index * tile
      return online_softmax_update(
          settings.softcap, query_BxHxbqxK, jax.lax.dynamic_slice_in_dim(key_BxGxLxK, k_start, tile, axis=2),
          jax.lax.dynamic_slice_in_dim(value_BxGxLxV, k_start, tile, axis=2), None,
          mask.block_at(q_start, k_start, tile, tile), *state)[:3]
    if sink_H is None:
      start = (jnp.full((batch, heads, tile, 1), masked_fill_value(jnp.float32)),
               jnp.zeros((batch, heads, tile, 1)), jnp.zeros((batch, heads, tile, value_dim)))
    else:
      start = sink_start(sink_H, batch, tile, value_dim)
    return normalised_output(*jax.lax.fori_loop(0, index + 1, key_block, start))

  output_NxBxHxbqxV = jax.lax.map(query_block, jnp.arange(blocks))
  output_BxLxHxV = jnp.transpose(output_NxBxHxbqxV, (1, 0, 3, 2, 4)).reshape(batch, blocks * tile, heads, value_dim)
  return output_BxLxHxV[:, :length].astype(value.dtype)


def _blockwise(query, key, value, sink_H, mask_parts, settings: TiledSettings):
  """The same attention as blockwise.py computes it, whose gradients the backward pass takes."""
  key_valid_BxL, segments_BxL = mask_parts
  mask = AttentionMask(causal=True, in_parts=True, key_valid_BxLk=key_valid_BxL, segments_BxL=segments_BxL)
  return blockwise_attention(query, key, value, block_size=settings.backward_block_size, mask=mask.block,
                             scale=settings.scale, skip_future_blocks=True,
                             key_block_size=settings.backward_key_block_size, softcap=settings.softcap,
                             sink_H=sink_H)


def _forward(query, key, value, sink_H, mask_parts, settings):
  """Under differentiation the blockwise core runs forward too, its vjp the residual: a training step costs what it
  cost in blocks, and only a pass without gradients (evaluation, decoding) runs the tiles."""
  output, vjp = jax.vjp(lambda *inputs: _blockwise(*inputs, mask_parts, settings), query, key, value, sink_H)
  return output, (vjp, mask_parts)


def _backward(settings, residuals, output_gradient):
  del settings
  vjp, mask_parts = residuals
  return (*vjp(output_gradient), jax.tree_util.tree_map(lambda _: None, mask_parts))


_attention.defvjp(_forward, _backward)
