"""Multi-head attention (Vaswani et al. 2017, section 3.2.2), with the positional hooks at fixed points."""

import dataclasses
import math
from typing import Optional, Union

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer import attention_core
from transformer.attention import check_groups, merge_heads, split_heads
from transformer.attention_request import AttentionMask, AttentionPositions, AttentionRequest, CoreSettings
from transformer.layers import EMBED, HEADS, KV_HEADS, Dense, RMSNorm, linear, parameter
from transformer.positions.ssmax import keys_seen, scalable_query
from transformer.positions.temperature import tempered_query
from transformer.rolling_cache import RollingCache, StreamingCache, rolled, streamed


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_H) W^O, head_h = Attention(Q W^Q_h, K W^K_g, V W^V_g), g = h // (H / G).

  With num_kv_heads = G < H key and value heads (grouped-query attention, Ainslie et al. 2023; G = 1 is
  multi-query attention, Shazeer 2019) the key and value projections are G heads wide, the cache holds G
  heads, and every core reads each key and value head once for its group of H / G query heads.

  The variant's hooks (positions.hooks) enter at fixed points and never by name: read the layer's input
  (from_inputs), rotate the projected queries and keys, set the scale, and with the setting ssmax scale
  the queries by s_h log n (positions/ssmax.py); the core adds the logits and values terms. Which core
  runs the call (explicit softmax, blocks, XLA's or cuDNN's fused attention, the Pallas kernel) is chosen
  in one place, attention_core.choose, from the backend, the dtype and what the call needs, or as
  `implementation` (model.attention_implementation) asks. The weights, where the core forms them, are
  sown as 'intermediates/attention_weights'.
  """
  num_heads: int
  num_kv_heads: int = 0     # key and value heads G, a divisor of num_heads (0: num_heads, multi-head)
  head_dim: int = 0         # K, each head's width; 0: the model's width / num_heads
  dropout_rate: float = 0.0
  block_size: int = 0       # queries per block in the blockwise core (0: none)
  key_block_size: int = 0   # keys per block there (0: every key a query block sees)
  implementation: str = 'auto'  # the attention core, chosen per call by attention_core.choose
  qkv_bias: bool = True     # biases on the query, key and value projections
  out_bias: bool = True     # a bias on the output projection
  qk_norm: str = 'none'     # RMSNorm of the queries and keys before the rotation: 'head' over each head's width
  #                           (Qwen3, Gemma 3), 'projection' over the whole projection (OLMo 2), or 'none'
  qk_norm_eps: float = 1e-6
  softcap: float = 0.0      # c > 0: logits capped to c tanh(x / c) (Gemma 2's attn_logit_softcapping)
  sinks: bool = False       # a learned sink logit per head in every softmax denominator (GPT-OSS)
  query_scale: float = 0.0  # > 0: logits scaled by query_scale^-1/2 (Gemma's query_pre_attn_scalar); 0: 1/sqrt(K)

  @nn.compact
  def __call__(self, inputs_q_BxLqxD: chex.Array, inputs_kv_BxLkxD: chex.Array, *,
               mask: Union[AttentionMask, chex.Array, None] = None, positions: Optional[AttentionPositions] = None,
               deterministic: bool = True, use_cache: bool = False,
               cache_index: Optional[chex.Array] = None, rolling: Optional[RollingCache] = None,
               streaming: Optional[StreamingCache] = None) -> chex.Array:
    """mask: an AttentionMask, or a boolean array (True = attend) broadcastable to B x H x Lq x Lk.
    positions: the layer's hooks and the positions they read; None adds no position terms.

    use_cache: incremental decoding through the 'cache' collection. The first call (cache_index
    None) stores this call's projected (and rotated) keys and values, whose length is the cache's
    capacity; later calls pass cache_index, the position of their first query: self-attention
    writes its new keys and values there and attends over the whole cache (the mask hides the
    slots not yet written), cross-attention reuses the memory's keys and values stored by the
    first call. Keys and positions are those of the cache: positions.k_positions_BxLk spans its capacity.
    rolling (a sliding layer's self-attention): the cache holds the last rolling.size keys and values instead
    (rolling_cache.py), and a later call attends over those and its own, whose positions k_positions_BxLk gives.
    streaming (self-attention, one token a call): StreamingLLM's slots (rolling_cache.py), the keys kept before the
    rotation and rotated at the slots' positions, k_positions_BxLk, at every call.
    """
    chex.assert_rank([inputs_q_BxLqxD, inputs_kv_BxLkxD], 3)
    width = inputs_q_BxLqxD.shape[-1]
    if width % self.num_heads and not self.head_dim:
      raise ValueError(f'model width {width} is not divisible by num_heads={self.num_heads}')
    check_groups(self.num_heads, self.key_value_heads)
    if not isinstance(mask, AttentionMask):
      mask = AttentionMask(mask)
    is_self_attention = inputs_q_BxLqxD is inputs_kv_BxLkxD
    cached_step = use_cache and cache_index is not None and streaming is None
    query, key, value = self._project(inputs_q_BxLqxD, inputs_kv_BxLkxD, is_self_attention,
                                      reads_memory_cache=cached_step and not is_self_attention)
    query, key = self._normalized(query, key)
    if use_cache and streaming is not None:  # every slot's key, to be rotated at its slot's position
      key, value = self._streaming_keys_values(key, value, streaming)
    scale = 1.0 / math.sqrt(self.query_scale or query.shape[-1])
    if positions is not None:
      positions = dataclasses.replace(positions, shared=positions.hooks.from_inputs(
          inputs_q_BxLqxD, positions.shared, use_cache, cache_index))
      query, key, scale = self._rotate_and_scale(query, key, positions, cached_step, scale)
      self._check_softmax_settings(positions)
      query = self._query_factors(query, mask, positions)
    if use_cache and streaming is None and rolling is not None and is_self_attention:
      key, value = self._rolling_keys_values(key, value, cache_index, rolling)
    elif use_cache and streaming is None:
      key, value = self._cached_keys_values(key, value, cache_index, is_self_attention)
    rng = None if deterministic or self.dropout_rate == 0.0 else self.make_rng('dropout')
    settings = CoreSettings(attention_core.current_backend(), self.block_size, self.key_block_size,
                            self.dropout_rate, rng, self.is_mutable_collection('intermediates'))
    sink_H = parameter(self, 'sinks', nn.initializers.zeros, (self.num_heads,)) if self.sinks else None
    request = AttentionRequest(query, key, value, scale, mask, positions, self.softcap, sink_H)
    result = attention_core.attend(self.implementation, request, settings)
    if result.weights_BxHxLqxLk is not None:
      self.sow('intermediates', 'attention_weights', result.weights_BxHxLqxLk)
    return Dense(width, use_bias=self.out_bias, name='out', axes=(HEADS, EMBED))(merge_heads(result.output_BxLqxHxV))

  def _normalized(self, query_BxLqxHxK, key_BxLkxGxK):
    """RMSNorm(q) and RMSNorm(k) with scales of their own (qk_norm): over each head's K features, one scale shared
    by the heads, or over the whole projection; key None (a memory read from the cache) stays None."""
    if self.qk_norm == 'none':
      return query_BxLqxHxK, key_BxLkxGxK

    def norm(x, name):
      if self.qk_norm == 'head':
        return RMSNorm(self.qk_norm_eps, name=name)(x)
      flat = x.reshape(*x.shape[:2], -1)
      return RMSNorm(self.qk_norm_eps, name=name)(flat).reshape(x.shape)
    key = None if key_BxLkxGxK is None else norm(key_BxLkxGxK, 'key_norm')
    return norm(query_BxLqxHxK, 'query_norm'), key

  @property
  def key_value_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  def _project(self, inputs_q_BxLqxD, inputs_kv_BxLkxD, is_self_attention: bool, reads_memory_cache: bool):
    """Queries B x Lq x H x K, keys and values B x Lk x G x K; keys and values None when they come from the
    cache (cross-attention's memory, projected by the first call)."""
    width = inputs_q_BxLqxD.shape[-1]
    head_dim = self.head_dim or width // self.num_heads
    query_width, key_value_width = self.num_heads * head_dim, self.key_value_heads * head_dim
    projections = [Dense(query_width, use_bias=self.qkv_bias, name='query', axes=(EMBED, HEADS))] + [
        Dense(key_value_width, use_bias=self.qkv_bias, name=name, axes=(EMBED, KV_HEADS)) for name in ('key', 'value')]
    if is_self_attention:  # one matmul of width H K + 2 G K instead of three
      kernels, biases = zip(*(projection.weights(width) for projection in projections))
      dtype = inputs_q_BxLqxD.dtype
      qkv_BxLxO = linear(inputs_q_BxLqxD, jnp.concatenate(kernels, axis=1).astype(dtype),
                         jnp.concatenate(biases).astype(dtype) if self.qkv_bias else None)
      query, key, value = jnp.split(qkv_BxLxO, [query_width, query_width + key_value_width], axis=-1)
      return (split_heads(query, self.num_heads), split_heads(key, self.key_value_heads),
              split_heads(value, self.key_value_heads))
    query = split_heads(projections[0](inputs_q_BxLqxD), self.num_heads)
    if reads_memory_cache:
      return query, None, None
    return (query, split_heads(projections[1](inputs_kv_BxLkxD), self.key_value_heads),
            split_heads(projections[2](inputs_kv_BxLkxD), self.key_value_heads))

  def _check_softmax_settings(self, positions: AttentionPositions) -> None:
    """ValueError for a sink, a cap or a query scale that the variant's own weights or scale would contradict."""
    rule = positions.hooks.weights_rule()
    if rule is not None and (self.sinks or self.softcap):
      field, value = ('attention_sinks', self.sinks) if self.sinks else ('attention_softcap', self.softcap)
      raise ValueError(f'model.{field}: got {value!r} with {rule.name}, whose weights are not a softmax; valid: '
                       f'{"False" if self.sinks else "0"} (sinks and caps act on a softmax)')
    if self.query_scale and positions.hooks.scale() is not None:
      raise ValueError(f'model.query_scale: got {self.query_scale!r} with a variant that sets its own logit scale '
                       f'({positions.hooks.scale()}); valid: 0')

  def _query_factors(self, query_BxLqxHxK, mask: AttentionMask, positions: AttentionPositions):
    """The queries times the settings' factors: SSMax's s_h log n_i, Llama 4's temperature by position."""
    settings = positions.hooks.settings
    if settings.ssmax:
      query_BxLqxHxK = self._scalable_softmax(query_BxLqxHxK, mask, positions.k_positions_BxLk.shape[1],
                                              settings.ssmax_initial_scale)
    if settings.temperature_scale:
      query_BxLqxHxK = tempered_query(query_BxLqxHxK, positions.q_positions_BxLq, settings.temperature_scale,
                                      settings.temperature_floor)
    return query_BxLqxHxK

  @staticmethod
  def _rotate_and_scale(query, key, positions: AttentionPositions, cached_step: bool, default_scale: float):
    """The variant's rotation of queries and keys, and its logit scale (default_scale unless it sets one). In a
    cached step the new keys sit at their queries' positions; a key None (cross-attention's memory, from the
    cache) stays None."""
    hooks, q_positions_BxLq = positions.hooks, positions.q_positions_BxLq
    if cached_step:
      query, rotated_key = hooks.rotate(query, query if key is None else key, q_positions_BxLq, q_positions_BxLq)
      key = None if key is None else rotated_key
    else:
      query, key = hooks.rotate(query, key, q_positions_BxLq, positions.k_positions_BxLk, positions.sequence_length)
    scale = hooks.scale()
    return query, key, default_scale if scale is None else scale

  def _scalable_softmax(self, query_BxLqxHxK, mask: AttentionMask, key_length: int, initial: float):
    """The query times s_h log n_i (positions/ssmax.py), s_h this layer's, n_i counted from the mask."""
    scale_H = parameter(self, 'ssmax_scale', nn.initializers.constant(initial), (self.num_heads,))
    batch, length_q = query_BxLqxHxK.shape[:2]
    seen = mask.mask
    if seen is None and mask.key_valid_BxLk is not None:
      seen = mask.key_valid_BxLk[:, None, None, :]
    return scalable_query(query_BxLqxHxK, scale_H, keys_seen(seen, batch, length_q, key_length))

  def _streaming_keys_values(self, key, value, streaming: StreamingCache):
    """The N slots' keys and values after writing this call's one token (rolling_cache.streamed)."""
    if key.shape[1] != 1:
      raise ValueError(f'streaming: got {key.shape[1]} tokens in one call; valid: 1 (a stream is fed token by token)')
    slots = lambda x: jnp.zeros((x.shape[0], streaming.size, *x.shape[2:]), x.dtype)
    cached_key = self.variable('cache', 'streamed_key', slots, key)
    cached_value = self.variable('cache', 'streamed_value', slots, value)
    cached_key.value = streamed(cached_key.value, key, streaming)
    cached_value.value = streamed(cached_value.value, value, streaming)
    return cached_key.value, cached_value.value

  def _rolling_keys_values(self, key, value, cache_index, rolling: RollingCache):
    """The first call keeps the keys and values of rolling.kept_R and attends as without a cache; a later call
    attends over the R kept and its own, and keeps the newest R (rolling_cache.rolled)."""
    cached_key = self.variable('cache', 'cached_key', lambda: key[:, rolling.kept_R])
    cached_value = self.variable('cache', 'cached_value', lambda: value[:, rolling.kept_R])
    if cache_index is None:
      return key, value
    key, cached_key.value = rolled(cached_key.value, key)
    value, cached_value.value = rolled(cached_value.value, value)
    return key, value

  def _cached_keys_values(self, key, value, cache_index, is_self_attention):
    """The cache's keys and values, B x capacity x G x K, after writing this call's at cache_index."""
    cached_key = self.variable('cache', 'cached_key', lambda: key)
    cached_value = self.variable('cache', 'cached_value', lambda: value)
    if cache_index is not None and is_self_attention:
      start = (0, cache_index, 0, 0)
      cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key.astype(cached_key.value.dtype), start)
      cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value.astype(cached_value.value.dtype),
                                                        start)
    return cached_key.value, cached_value.value
