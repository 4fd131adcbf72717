"""Scaled dot-product attention and multi-head attention (Vaswani et al. 2017, section 3.2)."""

import dataclasses
import math
from typing import Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import attention_core
from transformer.blockwise import blockwise_attention, shared_by_query_block
from transformer.flash_attention import flash_attention
from transformer.layers import Dense, dropout, linear
from transformer.positions.base import LayerPositions, Shared
from transformer.positions.relative import contiguous_offset
from transformer.softmax import softmax


def scaled_dot_product_attention(query: chex.Array, key: chex.Array, value: chex.Array, *,
                                 mask: Optional[chex.Array] = None, bias: Optional[chex.Array] = None,
                                 scale: Optional[float] = None, return_weights: bool = False,
                                 dropout_rate: float = 0.0, dropout_rng: Optional[chex.PRNGKey] = None,
                                 deterministic: bool = True):
  """Attention(Q, K, V) = softmax(Q K^T * scale + bias) V, scale = 1/sqrt(d_k) by default.

  query: B x Lq x H x K, key: B x Lk x H x K, value: B x Lk x H x V (the layout of
  `jax.nn.dot_product_attention`). mask (True = attend) and bias broadcast to B x H x Lq x Lk.
  Logits and softmax are in float32 whatever the input dtype. The 1/sqrt(d_k) keeps the logits'
  variance near 1 as d_k grows, so the softmax does not saturate.
  Returns the output, B x Lq x H x V, and with return_weights the weights, B x H x Lq x Lk.
  """
  chex.assert_rank([query, key, value], 4)
  chex.assert_equal_shape_prefix([key, value], 3)
  chex.assert_equal_shape([query[:, :1], key[:, :1]])  # same batch, heads and head width
  batch, length_q, heads, head_dim = query.shape
  length_k = key.shape[1]
  if scale is None:
    scale = 1.0 / math.sqrt(head_dim)
  # Heads first before the matmuls: XLA's CPU backend runs B x H x L x K batched matmuls much faster
  # than the same contraction over the B x L x H x K layout.
  query_BxHxLqxK = jnp.transpose(query, (0, 2, 1, 3)).astype(jnp.float32)
  key_BxHxLkxK = jnp.transpose(key, (0, 2, 1, 3)).astype(jnp.float32)
  logits_BxHxLqxLk = jnp.einsum('bhqk,bhsk->bhqs', query_BxHxLqxK, key_BxHxLkxK) * scale
  if bias is not None:
    logits_BxHxLqxLk = logits_BxHxLqxLk + bias.astype(jnp.float32)
  chex.assert_shape(logits_BxHxLqxLk, (batch, heads, length_q, length_k))
  weights_BxHxLqxLk = softmax(logits_BxHxLqxLk, mask)
  attended = dropout(weights_BxHxLqxLk, dropout_rate, dropout_rng, deterministic)
  output_BxHxLqxV = jnp.einsum('bhqs,bhsv->bhqv', attended.astype(value.dtype), jnp.transpose(value, (0, 2, 1, 3)))
  output_BxLqxHxV = jnp.transpose(output_BxHxLqxV, (0, 2, 1, 3))
  chex.assert_shape(output_BxLqxHxV, (batch, length_q, heads, value.shape[-1]))
  return (output_BxLqxHxV, weights_BxHxLqxLk) if return_weights else output_BxLqxHxV


def fused_attention(query: chex.Array, key: chex.Array, value: chex.Array, *, mask: Optional[chex.Array] = None,
                    bias: Optional[chex.Array] = None, scale: Optional[float] = None,
                    implementation: str = 'xla', mask_parts: Optional[tuple] = None) -> chex.Array:
  """The same attention through `jax.nn.dot_product_attention` (same layout, B x L x H x K) with the given
  implementation ('xla' or 'cudnn'), which never hands back the weights. A fully masked row gives a uniform
  average here (zeros in scaled_dot_product_attention); no model in this library produces one for a
  position whose output is used.

  With mask_parts = (causal, key_valid_BxLk) the mask goes in as its parts: causal as is_causal (cuDNN then
  skips the blocks above the diagonal), the keys' padding as key_value_seq_lengths where it is at the end
  of every row (checked on the values: elsewhere a B x 1 x 1 x Lk mask through XLA's implementation).
  Otherwise masks and biases are broadcast to B x H x Lq x Lk as it requires."""
  batch, length_q, heads, _ = query.shape
  shape = (batch, heads, length_q, key.shape[1])
  if bias is not None:
    bias = jnp.broadcast_to(bias.astype(query.dtype), shape)
  if mask_parts is None:
    output = jax.nn.dot_product_attention(query, key, value, bias=bias, scale=scale, implementation=implementation,
                                          mask=None if mask is None else jnp.broadcast_to(mask, shape))
  else:
    causal, key_valid_BxLk = mask_parts

    def attend(lengths=None, padding=None, core=implementation):
      return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=padding, scale=scale, is_causal=causal,
                                          key_value_seq_lengths=lengths, implementation=core)
    if key_valid_BxLk is None:
      output = attend()
    else:
      key_valid_BxLk = jnp.broadcast_to(key_valid_BxLk, (batch, key.shape[1])).astype(jnp.bool_)
      lengths_B = jnp.sum(key_valid_BxLk, axis=1, dtype=jnp.int32)
      at_the_end = jnp.all(key_valid_BxLk == (jnp.arange(key.shape[1])[None, :] < lengths_B[:, None]))
      output = jax.lax.cond(at_the_end, lambda: attend(lengths=lengths_B),
                            lambda: attend(padding=key_valid_BxLk[:, None, None, :], core='xla'))
  chex.assert_shape(output, (batch, length_q, heads, value.shape[-1]))
  return output


def current_backend() -> str:
  """jax.default_backend(): what attention_core.choose reads ('cpu', 'gpu', 'tpu')."""
  return jax.default_backend()


def kernel_platform(backend: str) -> str:
  """flash_attention's platform on a backend: compiled on GPUs and TPUs, interpreted elsewhere."""
  return backend if backend in ('gpu', 'tpu') else 'interpret'


def _same_known_consecutive_positions(q_positions_BxLq, k_positions_BxLk) -> bool:
  """Whether queries and keys are the same run of positions, known while tracing."""
  consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
  return consecutive is True and offset == 0


def split_heads(x_BxLxD: chex.Array, num_heads: int) -> chex.Array:
  """B x L x (H*K) -> B x L x H x K."""
  batch, length, width = x_BxLxD.shape
  return x_BxLxD.reshape(batch, length, num_heads, width // num_heads)


def merge_heads(x_BxLxHxK: chex.Array) -> chex.Array:
  """Concat(head_1, ..., head_H): B x L x H x K -> B x L x (H*K)."""
  batch, length, heads, head_dim = x_BxLxHxK.shape
  return x_BxLxHxK.reshape(batch, length, heads * head_dim)


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_H) W^O, head_h = Attention(Q W^Q_h, K W^K_h, V W^V_h).

  `positions` (the per-layer hooks of a positional variant) enter at fixed points and never by
  name: rotate the projected queries and keys, add a logits term, set the scale, add a values term.
  The attention core of each call (explicit softmax, blocks, XLA's or cuDNN's fused attention) is
  chosen in one place, attention_core.choose, from the backend, the dtype and what the call needs,
  or as model.attention_implementation asks.
  With block_size > 0, causal attention over sequences longer than a block runs through
  blockwise_attention instead: block_size queries at a time, position terms per block, the keys
  after a block skipped; with key_block_size also bidirectional attention, by an online softmax over
  blocks of keys (memory bounded by the block sizes); Shaw included (in causal attention its
  terms only on the band of keys within its clipping distance: LayerPositions.causal_band).
  With use_cache, incremental decoding: keys and values kept in the 'cache' collection.
  Cross-attention passes no hooks unless source and target are aligned step by step. The weights
  are sown as 'intermediates/attention_weights'. The Pallas kernel (flash_attention.py) takes the mask
  as its parts, mask_parts = (causal, key_valid_BxLk), and the variant's term as its kernel_term.
  """
  num_heads: int
  dropout_rate: float = 0.0
  block_size: int = 0
  key_block_size: int = 0
  implementation: str = 'auto'  # the attention core, chosen per call by attention_core.choose

  @nn.compact
  def __call__(self, inputs_q_BxLqxD: chex.Array, inputs_kv_BxLkxD: chex.Array, *,
               mask: Optional[chex.Array] = None, positions: Optional[LayerPositions] = None,
               q_positions_BxLq: Optional[chex.Array] = None, k_positions_BxLk: Optional[chex.Array] = None,
               shared: Shared = None, causal: bool = False, deterministic: bool = True,
               use_cache: bool = False, cache_index: Optional[chex.Array] = None,
               mask_parts: Optional[tuple] = None, kernel_shared: Shared = None) -> chex.Array:
    """causal: the mask is causal and queries and keys share positions (lets blocks be skipped).
    mask_parts: None, or (causal, key_valid_BxLk or None) when the mask is exactly the causal mask (if
    causal) and the keys' padding (if given): what a kernel takes instead of the mask.
    kernel_shared: the stack's kernel_shared(), for the layer's kernel_term.

    use_cache: incremental decoding through the 'cache' collection. The first call (cache_index
    None) stores this call's projected (and rotated) keys and values, whose length is the cache's
    capacity; later calls pass cache_index, the position of their first query: self-attention
    writes its new keys and values there and attends over the whole cache (the mask hides the
    slots not yet written), cross-attention reuses the memory's keys and values stored by the
    first call. Keys and positions are those of the cache: k_positions_BxLk spans its capacity.
    """
    chex.assert_rank([inputs_q_BxLqxD, inputs_kv_BxLkxD], 3)
    width = inputs_q_BxLqxD.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'model width {width} is not divisible by num_heads={self.num_heads}')
    is_self_attention = inputs_q_BxLqxD is inputs_kv_BxLkxD
    reads_memory_cache = use_cache and cache_index is not None and not is_self_attention
    query, key, value = self._project(inputs_q_BxLqxD, inputs_kv_BxLkxD, is_self_attention, reads_memory_cache)
    scale = None
    if positions is not None:
      query, key, scale = self._rotate_and_scale(query, key, positions, q_positions_BxLq, k_positions_BxLk,
                                                 cached_step=use_cache and cache_index is not None)
    if use_cache:
      key, value = self._cached_keys_values(key, value, cache_index, is_self_attention)
    attended_BxLqxHxK = self._attend(query, key, value, mask, positions, q_positions_BxLq, k_positions_BxLk, shared,
                                     scale, causal, deterministic, mask_parts, kernel_shared)
    return Dense(width, name='out')(merge_heads(attended_BxLqxHxK))

  def _project(self, inputs_q_BxLqxD, inputs_kv_BxLkxD, is_self_attention: bool, reads_memory_cache: bool):
    """Queries, keys and values, B x L x H x K each; keys and values None when they come from the cache
    (cross-attention's memory, projected by the first call)."""
    width = inputs_q_BxLqxD.shape[-1]
    projections = [Dense(width, name=name) for name in ('query', 'key', 'value')]
    if is_self_attention:  # one matmul of width 3D instead of three
      kernels, biases = zip(*(projection.weights(width) for projection in projections))
      dtype = inputs_q_BxLqxD.dtype
      qkv_BxLx3D = linear(inputs_q_BxLqxD, jnp.concatenate(kernels, axis=1).astype(dtype),
                          jnp.concatenate(biases).astype(dtype))
      return tuple(split_heads(part, self.num_heads) for part in jnp.split(qkv_BxLx3D, 3, axis=-1))
    query = split_heads(projections[0](inputs_q_BxLqxD), self.num_heads)
    if reads_memory_cache:
      return query, None, None
    return (query, split_heads(projections[1](inputs_kv_BxLkxD), self.num_heads),
            split_heads(projections[2](inputs_kv_BxLkxD), self.num_heads))

  @staticmethod
  def _rotate_and_scale(query, key, positions: LayerPositions, q_positions_BxLq, k_positions_BxLk, cached_step: bool):
    """The variant's rotation of queries and keys, and its logit scale (default 1/sqrt(K)). In a cached
    step the new keys sit at their queries' positions; a key None (cross-attention's memory, from the
    cache) stays None."""
    if cached_step:
      query, rotated_key = positions.rotate(query, query if key is None else key, q_positions_BxLq, q_positions_BxLq)
      key = None if key is None else rotated_key
    else:
      query, key = positions.rotate(query, key, q_positions_BxLq, k_positions_BxLk)
    scale = positions.scale()
    return query, key, 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale

  def _attend(self, query, key, value, mask, positions, q_positions_BxLq, k_positions_BxLk, shared, scale, causal,
              deterministic, mask_parts, kernel_shared) -> chex.Array:
    """The attention core attention_core.choose picks: query blocks (blockwise_attention),
    `jax.nn.dot_product_attention` (XLA's or cuDNN's), the Pallas kernel (flash_attention), or the explicit
    softmax, whose weights are sown and feed the variant's values term. The whole-call position term is
    built only where a core uses it."""
    rng = None if deterministic or self.dropout_rate == 0.0 else self.make_rng('dropout')

    def position_term():
      if positions is None:
        return None
      return positions.logits(query, key, q_positions_BxLq, k_positions_BxLk, shared, scale)

    needs = attention_core.CallNeeds(
        backend=current_backend(), dtype=jnp.dtype(query.dtype).name,
        caller_weights=rng is not None or self.is_mutable_collection('intermediates'),
        values_term=positions is not None and positions.needs_weights(), position_term=False,
        blocks_configured=self.block_size > 0,
        # Blocks pay where they skip work (causal: the keys after a block) or bound memory (key blocks);
        # bidirectional attention in query blocks alone only recomputes.
        blocks_pay=(causal or self.key_block_size > 0) and max(query.shape[1], key.shape[1]) > self.block_size,
        kernel_serves=positions is None or positions.kernel_serves(),
        mask_in_parts=mask is None or mask_parts is not None)
    bias = None
    if attention_core.may_use_cudnn(needs) and self.implementation != 'pallas':  # a term rules cuDNN out
      bias = position_term()
      needs = dataclasses.replace(needs, position_term=bias is not None)
    core = attention_core.choose(self.implementation, needs)
    if core == 'pallas':
      kernel_causal, key_valid_BxLk = (False, None) if mask_parts is None else mask_parts
      return flash_attention(query, key, value, causal=kernel_causal, key_valid_BxLk=key_valid_BxLk,
                             q_positions_BxLq=None if positions is None else q_positions_BxLq,
                             k_positions_BxLk=None if positions is None else k_positions_BxLk,
                             term=None if positions is None else positions.kernel_term(kernel_shared), scale=scale,
                             block_q=self.block_size or 128, block_k=self.key_block_size or self.block_size or 128,
                             platform=kernel_platform(needs.backend))
    if core == 'blockwise':  # position terms per block, never for the whole call
      return self._blockwise(query, key, value, mask, positions, q_positions_BxLq, k_positions_BxLk, shared, scale,
                             causal)
    if bias is None:
      bias = position_term()
    if core in ('xla', 'cudnn'):
      return fused_attention(query, key, value, mask=mask, bias=bias, scale=scale, implementation=core,
                             mask_parts=mask_parts)
    attended_BxLqxHxK, weights = scaled_dot_product_attention(
        query, key, value, mask=mask, bias=bias, scale=scale, return_weights=True,
        dropout_rate=self.dropout_rate, dropout_rng=rng, deterministic=deterministic)
    self.sow('intermediates', 'attention_weights', weights)
    value_term = None if positions is None else positions.values(weights, q_positions_BxLq, k_positions_BxLk)
    if value_term is not None:
      attended_BxLqxHxK = attended_BxLqxHxK + value_term.astype(attended_BxLqxHxK.dtype)
    return attended_BxLqxHxK

  def _cached_keys_values(self, key, value, cache_index, is_self_attention):
    """The cache's keys and values, B x capacity x H x K, after writing this call's at cache_index."""
    cached_key = self.variable('cache', 'cached_key', lambda: key)
    cached_value = self.variable('cache', 'cached_value', lambda: value)
    if cache_index is not None and is_self_attention:
      start = (0, cache_index, 0, 0)
      cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key.astype(cached_key.value.dtype), start)
      cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value.astype(cached_value.value.dtype),
                                                        start)
    return cached_key.value, cached_value.value

  def _blockwise(self, query, key, value, mask, positions, q_positions_BxLq, k_positions_BxLk, shared,
                 scale, causal):
    logits_term = values_term = band = None
    if causal and positions is not None and positions.causal_band() is not None and (
        _same_known_consecutive_positions(q_positions_BxLq, k_positions_BxLk)):
      # Terms on the band next to each query block only; the keys before it go in without any.
      causal_band = positions.causal_band()
      band = causal_band.width
      value = value + causal_band.value_offset().astype(value.dtype)

      def logits_term(query_block, q_slice, k_slice):
        return causal_band.logits(query_block, q_positions_BxLq[:, q_slice], k_positions_BxLk[:, k_slice], scale)

      def values_term(weights_block, q_slice, k_slice):
        return causal_band.values(weights_block, q_positions_BxLq[:, q_slice], k_positions_BxLk[:, k_slice])
    elif positions is not None:
      shared_block = shared_by_query_block(shared, query.shape[1], self.block_size)

      def logits_term(query_block, q_slice, k_slice):
        return positions.logits(query_block, key[:, k_slice], q_positions_BxLq[:, q_slice],
                                k_positions_BxLk[:, k_slice], shared_block(q_slice, k_slice), scale)

      def values_term(weights_block, q_slice, k_slice):
        return positions.values(weights_block, q_positions_BxLq[:, q_slice], k_positions_BxLk[:, k_slice])
    all_keys_at_once = positions is not None and positions.needs_all_keys()
    return blockwise_attention(query, key, value, block_size=self.block_size, mask=mask, scale=scale,
                               skip_future_blocks=causal, logits_term=logits_term, values_term=values_term,
                               key_block_size=None if all_keys_at_once else self.key_block_size or None, band=band)
