"""Encoder and decoder layers, and the stack that owns a stack's positional hooks.

Post-LN (the paper): x = LN(x + Dropout(Sublayer(x))). Pre-LN: x = x + Dropout(Sublayer(LN(x))),
with a final LN after the last layer. Output-LN (OLMo 2; Swin V2's res-post-norm): x = x + Dropout(LN(Sublayer(x))),
with a final LN too. LN is LayerNorm or RMSNorm (model.norm_type). The parallel residual
(GPT-J, GPT-NeoX; pre-LN, no cross-attention): x = x + Dropout(Attention(LN1(x))) + Dropout(FFN(LN2(x))).
"""

from typing import Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.attention_request import AttentionMask, AttentionPositions
from transformer.config import ModelConfig, PositionConfig
from transformer.layers import Dropout, FeedForward, batch_split, norm_layer
from transformer.masks import causal_mask, cross_attention_mask, segment_mask, self_attention_mask, window_mask
from transformer.multi_head_attention import MultiHeadAttention
from transformer.positions.base import Shared
from transformer.positions.randomized import randomized_positions
from transformer import rolling_cache
from transformer.rolling_cache import RollingCache, StreamingCache


def _hook_fields(config: ModelConfig, num_layers: int, causal: bool, has_cls: bool, position: PositionConfig = None,
                 **layer) -> dict:
  """The fields of a stack's hooks for `position` (None: model.position); a layer's also get its layer_index."""
  position = position or config.position
  position.check_attention(config.num_heads, config.head_dim, causal)
  return dict(settings=position.settings, num_heads=config.num_heads, head_dim=config.head_dim,
              model_dim=config.model_dim, num_layers=num_layers, causal=causal, has_cls=has_cls, **layer)


def _rolls(config: ModelConfig, index: int) -> bool:
  """Whether layer `index` decodes through a rolling cache (rolling_cache.py): a sliding layer whose position keeps
  no per-token cache of its own."""
  return config.layer_type(index) == 'sliding' and config.layer_position(index).rolling_cache


def _position_name(config: ModelConfig, index: int) -> str:
  """Which of the stack's positions layer `index` takes: 'local_position' or 'position' (ModelConfig.layer_position)."""
  return 'position' if config.layer_position(index) is config.position else 'local_position'


# What a rematerialised layer keeps for its backward pass (jax.checkpoint policies). 'block': only its input,
# everything else recomputed (about one more forward pass). 'matmuls': also the outputs of matmuls without
# batch dimensions (the projections and feed-forward, 2-D in transformer.layers.linear); attention's logits
# and weights (batched over heads) and the elementwise work are recomputed.
REMAT_SAVES = {'block': jax.checkpoint_policies.nothing_saveable,
               'matmuls': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


class _Residual(nn.Module):
  """Wraps one sublayer with dropout, the residual connection and post- or pre-LN."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, sublayer, deterministic: bool, add_input: bool = True):
    """add_input False (pre-LN only): Dropout(Sublayer(LN(x))) alone, one branch of a parallel residual. With
    model.sandwich_norm (pre-LN): x + Dropout(LN'(Sublayer(LN(x)))), LN' with a scale of its own (Gemma 2, 3)."""
    config = self.config
    norm = norm_layer(config.norm_type, config.layer_norm_eps)
    drop = Dropout(config.dropout_rate)
    if config.norm == 'pre':
      output = sublayer(norm(x))
      if config.sandwich_norm:
        output = norm_layer(config.norm_type, config.layer_norm_eps, name='output_norm')(output)
      branch = drop(output, deterministic)
      return x + branch if add_input else branch
    if config.norm == 'output':
      return x + drop(norm(sublayer(x)), deterministic)
    return norm(x + drop(sublayer(x), deterministic))


def sequence_length_of(positions_BxL: chex.Array, valid_BxL: Optional[chex.Array]) -> chex.Array:
  """1 + the largest position of a real token: the length of the sequence a pass serves, padding excluded
  (a packed row's longest document when positions restart), as Hugging Face counts it."""
  if valid_BxL is not None:
    positions_BxL = jnp.where(valid_BxL, positions_BxL, -1)
  return 1 + jnp.max(positions_BxL)


def attention_fields(config: ModelConfig) -> dict:
  """MultiHeadAttention's fields from the model's configuration."""
  return dict(num_heads=config.num_heads, num_kv_heads=config.key_value_heads, head_dim=config.head_width,
              dropout_rate=config.attention_dropout_rate,
              block_size=config.attention_block_size, key_block_size=config.attention_key_block_size,
              implementation=config.attention_implementation, qkv_bias=config.use_bias or config.qkv_bias,
              out_bias=config.use_bias or config.attention_output_bias, qk_norm=config.qk_norm,
              qk_norm_eps=config.layer_norm_eps, softcap=config.attention_softcap, sinks=config.attention_sinks,
              query_scale=config.query_scale)


class TransformerLayer(nn.Module):
  """Encoder layer (self-attention, FFN) or, with cross_attention, decoder layer (masked
  self-attention, attention over the encoder's memory, FFN)."""
  config: ModelConfig
  num_layers: int
  causal: bool
  cross_attention: bool = False
  has_cls: bool = False
  deterministic: bool = True  # no dropout (an attribute, not an argument: nn.remat traces every argument)
  layer_index: int = 0  # this layer's place in its stack (0 first), for its position hooks

  @nn.compact
  def __call__(self, x_BxLxD, *, self_mask, positions_BxL, shared: Shared, memory_BxLsxD=None, memory_mask=None,
               key_positions_BxLk=None, use_cache: bool = False, cache_index=None, valid_BxL=None,
               memory_valid_BxLs=None, kernel_shared: Shared = None, segments_BxL=None,
               rolling: Optional[RollingCache] = None, streaming: Optional[StreamingCache] = None):
    """With config.aligned_cross_attention, target position i and source position i are the same
    step (SAINT's exercises and responses), so cross-attention gets position hooks of its own.
    valid_BxL, memory_valid_BxLs, segments_BxL: the padding and the packed rows' documents the masks were built
    from, which a kernel takes as such (AttentionMask's parts); kernel_shared: the stack's, for the kernel's
    position terms.
    key_positions_BxLk: the keys' positions when they are not the queries' (incremental decoding: the
    cache's slots; aligned cross-attention's source steps are the same); use_cache and cache_index:
    MultiHeadAttention's; rolling: a sliding layer's rolling cache, streaming: StreamingLLM's (rolling_cache.py)."""
    config, deterministic = self.config, self.deterministic
    key_positions_BxLk = positions_BxL if key_positions_BxLk is None else key_positions_BxLk
    cache = dict(use_cache=use_cache, cache_index=cache_index)
    position = config.layer_position(self.layer_index)
    hooks = position.variant.layer(
        **_hook_fields(config, self.num_layers, self.causal, self.has_cls, position, layer_index=self.layer_index,
                       num_kv_heads=config.key_value_heads),
        name='position')
    attention = attention_fields(config)
    self_attention = MultiHeadAttention(**attention, name='self_attention')
    self_positions = AttentionPositions(hooks, positions_BxL, key_positions_BxLk, shared, kernel_shared,
                                        None if use_cache else sequence_length_of(key_positions_BxLk, valid_BxL))
    self_attention_mask = self._self_attention_mask(self_mask, cache_index, valid_BxL, segments_BxL)
    attend = lambda y: self_attention(y, y, mask=self_attention_mask, positions=self_positions,
                                      deterministic=deterministic, rolling=rolling, streaming=streaming, **cache)
    feed_forward = FeedForward(config.feed_forward_dim, config.activation, config.dropout_rate,
                               config.use_bias or config.feed_forward_bias, name='feed_forward')
    if config.parallel_residual:
      if self.cross_attention:
        raise ValueError('parallel_residual: got True in a layer with cross-attention; valid: False for an '
                         'encoder-decoder (the parallel residual serves decoder-only and encoder-only models)')
      attended = _Residual(config, name='self_attention_residual')(x_BxLxD, attend, deterministic, add_input=False)
      fed = _Residual(config, name='feed_forward_residual')(
          x_BxLxD, lambda y: feed_forward(y, deterministic), deterministic, add_input=False)
      return x_BxLxD + attended + fed
    x_BxLxD = _Residual(config, name='self_attention_residual')(x_BxLxD, attend, deterministic)
    if self.cross_attention:
      cross = MultiHeadAttention(**attention, name='cross_attention')
      cross_positions = None
      if config.aligned_cross_attention:
        cross_hooks = config.position.variant.layer(
            **_hook_fields(config, self.num_layers, self.causal, self.has_cls, layer_index=self.layer_index,
                           num_kv_heads=config.key_value_heads),
            name='cross_position')
        cross_positions = AttentionPositions(cross_hooks, positions_BxL, key_positions_BxLk, shared, kernel_shared)
      # Aligned cross-attention's mask is causal by step and the padding: not given as parts.
      cross_mask = AttentionMask(memory_mask, in_parts=not config.aligned_cross_attention,
                                 key_valid_BxLk=None if config.aligned_cross_attention else memory_valid_BxLs)
      x_BxLxD = _Residual(config, name='cross_attention_residual')(
          x_BxLxD, lambda y: cross(y, memory_BxLsxD, mask=cross_mask, positions=cross_positions,
                                   deterministic=deterministic, **cache),
          deterministic)
    return _Residual(config, name='feed_forward_residual')(
        x_BxLxD, lambda y: feed_forward(y, deterministic), deterministic)


  def _self_attention_mask(self, self_mask, cache_index, valid_BxL, segments_BxL) -> AttentionMask:
    """The self-attention's mask and its parts: in a full pass the causal mask, the padding and the documents, and
    a local layer's window or chunk (TransformerStack._layer_mask put them in self_mask); a cached step's mask is
    explicit, its keys the cache's slots."""
    config, full_pass = self.config, cache_index is None
    kind = config.layer_type(self.layer_index)
    # A core takes the window or chunk by index; a packed row's chunks are by position in its document: dense.
    local = dict(window=config.sliding_window if kind == 'sliding' else 0,
                 chunk=config.attention_chunk_size if kind == 'chunked' and segments_BxL is None else 0
                 ) if self.causal and full_pass else {}
    in_parts = full_pass and (kind == 'full' or any(local.values()))  # a packed row's chunks: not as parts
    return AttentionMask(self_mask, causal=self.causal and full_pass, in_parts=in_parts, **local,
                         key_valid_BxLk=valid_BxL if full_pass else None,
                         segments_BxL=segments_BxL if full_pass else None)


CACHE_INDEX = 'index'  # a cache's next write position: the creating call's cache_prefix (0 unless given)
ROLLING_POSITIONS = 'rolling_positions'  # the positions the sliding layers' rolling caches hold, oldest first


class TransformerStack(nn.Module):
  """Embedded inputs -> positional embed hook -> N layers (sharing the stack's shared terms).

  Decoding (use_cache): cache_prefix, the creating call's first positions that the decoding continues after (a
  prompt padded to the capacity; causal, so the padding changes none of them); None: all of them. A sliding layer's
  cache holds the last W positions only (rolling_cache.py; unpacked rows, variants that keep no per-token cache of
  their own), however long the decoding. streaming = (S, N): StreamingLLM's cache in every layer instead
  (rolling_cache.py), one token a call and no creating call: the first S tokens and the most recent ones in N
  slots, positions by slot."""
  config: ModelConfig
  num_layers: int
  causal: bool
  cross_attention: bool = False
  has_cls: bool = False

  @nn.compact
  def __call__(self, x_BxLxD: chex.Array, *, valid_BxL: Optional[chex.Array] = None,
               memory_BxLsxD: Optional[chex.Array] = None, memory_valid_BxLs: Optional[chex.Array] = None,
               deterministic: bool = True, use_cache: bool = False, positions_BxL: Optional[chex.Array] = None,
               segments_BxL: Optional[chex.Array] = None, cache_prefix: Optional[int] = None,
               streaming: Optional[tuple[int, int]] = None) -> chex.Array:
    """use_cache: incremental decoding of a causal stack (the 'cache' collection, mutable). The first
    call creates the cache, sized by its input's length (the capacity: every position the decoding
    will feed), and computes as without it; each later call feeds the next x_BxLxD.shape[1]
    positions (one token, or a whole prompt at once), attending over the cache instead of
    recomputing the prefix. Feeding past the capacity is not detected inside jit: size it for the
    whole decoding. cache_prefix and streaming: the class's docstring.

    positions_BxL, segments_BxL: several documents packed in a row. Each token's position within its
    document (restarting at 0 in each) and its document's id within the row; a token attends only to
    tokens of its own document. None: one sequence per row, at positions 0 .. L-1. With use_cache, every
    call gives the positions and segments of the tokens it feeds, and the cache keeps those of its slots."""
    config = self.config
    chex.assert_rank(x_BxLxD, 3)
    chex.assert_axis_dimension(x_BxLxD, 2, config.model_dim)
    length = x_BxLxD.shape[1]
    packed = positions_BxL is not None or segments_BxL is not None
    positions_BxL, key_positions_BxLk, cache_index, cached_mask = (
        self._streaming_positions(x_BxLxD, packed, valid_BxL, *streaming) if use_cache and streaming else
        self._stack_positions(x_BxLxD, positions_BxL, segments_BxL, valid_BxL, use_cache, cache_prefix))
    stacks = self._position_stacks()
    # a float32 table would promote
    x_BxLxD = batch_split(stacks['position'].embed(x_BxLxD, positions_BxL).astype(config.dtype))
    x_BxLxD = Dropout(config.dropout_rate)(x_BxLxD, deterministic)
    self_mask = cached_mask if cache_index is not None else self._self_mask(valid_BxL, length, segments_BxL)
    rolling = None if not use_cache or packed or streaming else self._rolling(length, cache_index, positions_BxL,
                                                                               cache_prefix)
    terms = {}  # (position name, whether the keys are a rolling cache's) -> its stack's terms, computed once
    memory_mask = None if not self.cross_attention else self._memory_mask(
        memory_BxLsxD, memory_valid_BxLs, key_positions_BxLk.shape[1], None if cache_index is None else self_mask)
    layer_type = TransformerLayer if config.remat == 'none' or use_cache else nn.remat(
        TransformerLayer, policy=REMAT_SAVES[config.remat])
    cached_step = {} if not use_cache else dict(
        key_positions_BxLk=key_positions_BxLk, use_cache=True, cache_index=cache_index,
        streaming=StreamingCache(streaming[1], streaming[0], cache_index) if streaming else None)
    mask_sources = dict(valid_BxL=valid_BxL, memory_valid_BxLs=memory_valid_BxLs, segments_BxL=segments_BxL)
    for index in range(self.num_layers):
      layer_mask, layer_keys, layer_step = self._layer_view(index, self_mask, positions_BxL, key_positions_BxLk,
                                                            cached_step, rolling)
      name, rolled = _position_name(config, index), layer_keys is not key_positions_BxLk
      if (name, rolled) not in terms:
        terms[name, rolled] = self._stack_terms(stacks[name], positions_BxL, layer_keys, self_mask if packed else None)
      shared, kernel_shared = terms[name, rolled]
      layer = layer_type(config, self.num_layers, self.causal, self.cross_attention, self.has_cls,
                         deterministic=deterministic, layer_index=index, name=f'layer_{index}')
      x_BxLxD = batch_split(layer(x_BxLxD, self_mask=layer_mask, positions_BxL=positions_BxL, shared=shared,
                                  memory_BxLsxD=memory_BxLsxD, memory_mask=memory_mask, kernel_shared=kernel_shared,
                                  **layer_step, **mask_sources))
    if config.norm in ('pre', 'output'):
      x_BxLxD = norm_layer(config.norm_type, config.layer_norm_eps, name='final_norm')(x_BxLxD)
    chex.assert_shape(x_BxLxD, (None, length, config.model_dim))
    return x_BxLxD

  def _position_stacks(self) -> dict:
    """{'position': its stack hooks, and 'local_position': the local layers' where model.local_position is set}."""
    config = self.config
    return {name: position.variant.stack(
        **_hook_fields(config, self.num_layers, self.causal, self.has_cls, position), name=name)
            for name, position in (('position', config.position), ('local_position', config.local_position))
            if position is not None}

  def _layer_view(self, index: int, self_mask, positions_BxL, key_positions_BxLk, cached_step: dict, rolling):
    """(mask, keys' positions, the cached step's arguments) of layer `index`: the stack's, with a local layer's
    window (_layer_mask); a sliding layer's rolling cache (_rolling) in a cached call, and in a later one its keys'
    positions and mask."""
    layer_mask = self._layer_mask(index, self_mask, positions_BxL, key_positions_BxLk)
    if rolling is None or not _rolls(self.config, index):
      return layer_mask, key_positions_BxLk, cached_step
    cache, rolled_keys_1xK, rolled_mask = rolling
    if rolled_keys_1xK is None:  # the creating call
      return layer_mask, key_positions_BxLk, dict(cached_step, rolling=cache)
    return rolled_mask, rolled_keys_1xK, dict(cached_step, rolling=cache, key_positions_BxLk=rolled_keys_1xK)

  def _stack_terms(self, hooks, positions_BxL, key_positions_BxLk, packed_mask):
    """(shared, kernel_shared) of one of the stack's positions: the terms every layer of its kind reads, masked to
    the packed documents (packed_mask given). The Pallas kernel computes the terms from kernel_shared: the
    whole-call terms would go unused there."""
    if self.config.attention_implementation == 'pallas':
      return None, hooks.kernel_shared()
    shared = hooks.shared(positions_BxL, key_positions_BxLk)
    return shared if packed_mask is None else hooks.masked(shared, packed_mask), hooks.kernel_shared()

  def _rolling(self, length: int, cache_index, positions_BxL, cache_prefix: Optional[int]):
    """The sliding layers' rolling cache in a cached call of an unpacked stack: (RollingCache, and in a later call
    the keys' positions 1 x (R + n) and the mask of their window 1 x 1 x n x (R + n)); None without sliding
    layers that roll. The creating call keeps the last R of its first cache_prefix positions."""
    config = self.config
    if not self.causal or not any(_rolls(config, index) for index in range(self.num_layers)):
      return None
    size = min(config.sliding_window, length) if cache_index is None else None
    kept = None if size is None else rolling_cache.kept_positions(length if cache_prefix is None else cache_prefix,
                                                                 size)
    slots = self.variable('cache', ROLLING_POSITIONS, lambda: jnp.asarray(kept)[None])
    if cache_index is None:
      return RollingCache(size, np.maximum(kept, 0)), None, None
    key_positions_1xK, slots.value = rolling_cache.rolled(slots.value, positions_BxL)
    window = window_mask(positions_BxL, key_positions_1xK, window=config.sliding_window)
    up_to_own = key_positions_1xK[:, None, None, :] <= positions_BxL[:, None, :, None]
    return RollingCache(slots.value.shape[1]), key_positions_1xK, jnp.logical_and(window, up_to_own)

  def _streaming_positions(self, x_BxLxD, packed: bool, valid_BxL, sinks: int, size: int):
    """(the query's position 1 x 1, the slots' 1 x N, the tokens fed before, the mask of the written slots
    1 x 1 x 1 x N) of a streaming call (StreamingLLM, rolling_cache.py): after t tokens the query sits at slot
    min(t, N - 1) and sees the slots up to its own."""
    config = self.config
    if not 0 <= sinks < size:
      raise ValueError(f'streaming: got {sinks} sink tokens in a cache of {size}; valid: 0 <= sinks < cache size')
    if not self.causal or self.cross_attention or packed or valid_BxL is not None or x_BxLxD.shape[1] != 1:
      raise ValueError('streaming: valid in a decoder-only stack fed one token a call, unpacked and without '
                       'padding')
    refused = [config.layer_position(index).kind for index in range(self.num_layers)
               if not config.layer_position(index).rolling_cache]
    if refused or config.randomized_max_length:
      raise ValueError(f'streaming: got a model of {refused[0] if refused else "randomized positions"}; valid: a '
                       'variant that keeps no per-token cache of its own, at positions 0 .. L - 1')
    count = self.variable('cache', CACHE_INDEX, lambda: jnp.zeros((), jnp.int32))
    fed = count.value
    count.value = fed + 1
    query_1x1 = jnp.minimum(fed, size - 1)[None, None]
    slots_1xN = np.arange(size, dtype=np.int32)[None]
    return query_1x1, slots_1xN, fed, (slots_1xN[:, None, None, :] <= query_1x1[:, None, :, None])

  def _stack_positions(self, x_BxLxD, positions_BxL, segments_BxL, valid_BxL, use_cache: bool,
                       cache_prefix: Optional[int] = None):
    """(query positions, key positions, cache index, a cached step's mask): a packed row's own, 0 .. L-1 or
    randomized ones; in a cached call, from the cache (_cached_positions)."""
    length = x_BxLxD.shape[1]
    if positions_BxL is not None or segments_BxL is not None:
      self._check_packed(x_BxLxD, positions_BxL, segments_BxL)
    else:
      positions_BxL = np.arange(length, dtype=np.int32)[None]  # a constant: hooks see consecutive positions when traced
    if self.config.randomized_max_length:
      positions_BxL = self._randomized(length, valid_BxL)
    if use_cache:
      return self._cached_positions(positions_BxL, segments_BxL, valid_BxL, cache_prefix)
    return positions_BxL, positions_BxL, None, None

  def _self_mask(self, valid_BxL, length: int, segments_BxL):
    """A full pass's self-attention mask: the keys' padding, causal in a decoder, within each packed document."""
    self_mask = self_attention_mask(valid_BxL, length, self.causal)
    if segments_BxL is not None:
      documents = segment_mask(segments_BxL)
      self_mask = documents if self_mask is None else jnp.logical_and(self_mask, documents)
    return self_mask

  def _layer_mask(self, index: int, self_mask, q_positions_BxLq, k_positions_BxLk):
    """Layer index's self-attention mask: the stack's, and for a sliding or chunked layer (model.layer_types) its
    window too (masks.window_mask). Chunks are refused in an encoder."""
    config = self.config
    kind = config.layer_type(index)
    if kind == 'full':
      return self_mask
    if kind == 'chunked' and not self.causal:
      raise ValueError(f'layer_types: got {config.layer_types!r} in bidirectional attention (an encoder); valid: full '
                       'or sliding there (a chunk is a decoder\'s: Llama 4 splits the causal context into chunks)')
    # A full pass's positions are NumPy constants, from which XLA would fold the L x L window at compile time
    # (gigabytes at 32k) though the cores read the window as such: behind a barrier it stays a computation, dropped
    # where nothing reads it.
    q_positions_BxLq, k_positions_BxLk = jax.lax.optimization_barrier(
        (jnp.asarray(q_positions_BxLq), jnp.asarray(k_positions_BxLk)))
    window = window_mask(q_positions_BxLq, k_positions_BxLk, causal=self.causal,
                         window=config.sliding_window if kind == 'sliding' else 0,
                         chunk=config.attention_chunk_size if kind == 'chunked' else 0)
    return window if self_mask is None else jnp.logical_and(self_mask, window)

  def _cached_positions(self, positions_BxL, segments_BxL, valid_BxL, cache_prefix: Optional[int] = None):
    """(positions_BxL, key_positions_BxLk, cache_index, mask) of a cached call. The first call creates the cache
    (its capacity is this call's length) and computes as without one: cache_index and mask None. A later call
    feeds the slots from the cache's index on and attends over every slot up to its own. Unpacked, the tokens
    are at the positions after the index and the slots at 0 .. capacity - 1; packed (segments_BxL given), the
    call's positions and segments are written into the slots, and a query sees its own document's slots only."""
    if not self.causal:
      raise ValueError('use_cache: incremental decoding needs a causal stack (a decoder)')
    step = self.has_variable('cache', CACHE_INDEX)
    next_index = self.variable('cache', CACHE_INDEX, lambda: jnp.asarray(cache_prefix or 0, jnp.int32))
    slots = self.variable('cache', 'positions', lambda: positions_BxL)  # its shape is the capacity
    slot_segments = None if segments_BxL is None else self.variable('cache', 'segments', lambda: segments_BxL)
    if not step:
      return positions_BxL, positions_BxL, None, None
    if valid_BxL is not None:
      raise ValueError('valid_BxL: padding inside the decoded tokens is not supported with use_cache; '
                       'valid: None')
    cache_index = next_index.value
    length = positions_BxL.shape[1]
    next_index.value = cache_index + length
    if slot_segments is not None:
      slots.value = jax.lax.dynamic_update_slice_in_dim(slots.value, positions_BxL, cache_index, axis=1)
      slot_segments.value = jax.lax.dynamic_update_slice_in_dim(slot_segments.value, segments_BxL, cache_index, axis=1)
      capacity = slots.value.shape[1]
      up_to_own_LqxLk = np.arange(capacity)[None, :] <= (cache_index + np.arange(length))[:, None]
      same_document_BxLqxLk = slot_segments.value[:, None, :] == segments_BxL[:, :, None]
      return positions_BxL, slots.value, cache_index, jnp.logical_and(up_to_own_LqxLk, same_document_BxLqxLk)[:, None]
    if self.config.randomized_max_length:  # the positions drawn for the whole capacity by the first call
      positions_BxL = jax.lax.dynamic_slice_in_dim(slots.value, cache_index, length, axis=1)
      key_positions_BxLk = slots.value
    else:
      positions_BxL = cache_index + positions_BxL  # traced: the hooks take their gathering paths
      key_positions_BxLk = np.arange(slots.value.shape[1], dtype=np.int32)[None]
    up_to_own_BxLqxLk = key_positions_BxLk[:, None, :] <= positions_BxL[:, :, None]
    return positions_BxL, key_positions_BxLk, cache_index, up_to_own_BxLqxLk[:, None]

  def _memory_mask(self, memory_BxLsxD, memory_valid_BxLs, target_length: int, cached_step_mask):
    """Cross-attention's mask: the source's padding and, with aligned_cross_attention, causal by step over a
    source as long as the target (the cache's capacity in a cached step, whose mask is cached_step_mask)."""
    memory_mask = cross_attention_mask(memory_valid_BxLs)
    if not self.config.aligned_cross_attention:
      return memory_mask
    if memory_BxLsxD.shape[1] != target_length:
      raise ValueError(f'aligned_cross_attention: source length {memory_BxLsxD.shape[1]} differs from '
                       f'target length {target_length}; valid: aligned sequences of equal length')
    aligned_mask = causal_mask(target_length) if cached_step_mask is None else cached_step_mask
    return aligned_mask if memory_mask is None else jnp.logical_and(aligned_mask, memory_mask)

  def _check_packed(self, x_BxLxD, positions_BxL, segments_BxL) -> None:
    if positions_BxL is None or segments_BxL is None:
      raise ValueError('positions_BxL, segments_BxL: packed rows need both (each token\'s position in its document '
                       'and its document\'s id); valid: both arrays, or neither')
    chex.assert_shape([positions_BxL, segments_BxL], x_BxLxD.shape[:2])
    if self.config.randomized_max_length:
      raise ValueError('positions_BxL: packed rows bring their own positions; valid: no positions with '
                       'model.randomized_max_length (which draws its own)')
    if self.cross_attention and self.config.aligned_cross_attention:
      raise ValueError('positions_BxL: packed rows are not supported with aligned_cross_attention; valid: None')

  def _randomized(self, length: int, valid_BxL: Optional[chex.Array]) -> chex.Array:
    """Randomized positions, from the 'positions' rng; without one (decoding, a tool that passes none),
    from PRNGKey(0), so the same call gives the same positions."""
    key = self.make_rng('positions') if self.has_rng('positions') else jax.random.PRNGKey(0)
    return randomized_positions(key, length, self.config.randomized_max_length, valid_BxL)
