"""What one attention call asks of its core: the request every core in attention_core.CORES takes.

A core computes softmax(Q K^T scale + term) V (+ a values term) for one call, or the weights of the
variant's WeightsRule in place of the softmax; the request carries everything it may read, and nothing
about which core will run.
"""

import dataclasses
import functools
from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp

from transformer.positions.base import LayerPositions, Shared


@dataclasses.dataclass(frozen=True)
class AttentionMask:
  """Which keys each query sees.

  mask: True = attend, broadcastable to B x H x Lq x Lk; None: every key.
  causal: the mask is causal and queries and keys are the same positions, so keys after a block of
    queries may be skipped without being computed.
  in_parts: the mask is exactly the causal mask (if causal), key_valid_BxLk (if given) and the same-document
    mask of segments_BxL (if given), so a core may take those parts instead of the mask (is_causal and
    sequence lengths, or a kernel's own test).
  key_valid_BxLk: True for real keys, False for padding; None: every key is real.
  segments_BxL: rows that pack several documents (queries and keys the same tokens): each token's document,
    a query seeing only its own document's keys; None: one document per row.
  window, chunk: the mask holds a sliding window of W keys, or chunks of C positions (masks.window_mask), over
    causal attention of the same positions, so keys before a block of queries' first allowed key may be skipped
    without being computed; 0: none.
  """
  mask: Optional[chex.Array] = None
  causal: bool = False
  in_parts: bool = False
  key_valid_BxLk: Optional[chex.Array] = None
  segments_BxL: Optional[chex.Array] = None
  window: int = 0
  chunk: int = 0

  def block(self, q_slice: slice, k_slice: slice) -> chex.Array:
    """The mask of one block of queries and keys from its parts, never the whole Lq x Lk: causal, the window or
    chunk (by index: within a packed document, positions and indices differ by its start), the keys' padding and
    the documents. B x 1 x bq x bk (B may be 1). For a full pass over the same positions (window or chunk set)."""
    return self.block_at(q_slice.start, k_slice.start, q_slice.stop - q_slice.start, k_slice.stop - k_slice.start)

  def block_at(self, q_start, k_start, q_size: int, k_size: int) -> chex.Array:
    """block() of queries [q_start, q_start + q_size) and keys [k_start, k_start + k_size), the starts possibly
    traced (a rolled loop's); the blocks must lie inside key_valid_BxLk and segments_BxL."""
    query_bqx1 = (q_start + jnp.arange(q_size))[:, None]
    key_1xbk = (k_start + jnp.arange(k_size))[None, :]
    allowed = key_1xbk <= query_bqx1
    if self.window:
      allowed = jnp.logical_and(allowed, query_bqx1 - key_1xbk < self.window)
    if self.chunk:
      allowed = jnp.logical_and(allowed, query_bqx1 // self.chunk == key_1xbk // self.chunk)
    allowed = allowed[None, None]
    if self.key_valid_BxLk is not None:
      key_valid_Bxbk = jax.lax.dynamic_slice_in_dim(self.key_valid_BxLk, k_start, k_size, axis=1)
      allowed = jnp.logical_and(allowed, key_valid_Bxbk[:, None, None, :].astype(bool))
    if self.segments_BxL is not None:
      same = (jax.lax.dynamic_slice_in_dim(self.segments_BxL, q_start, q_size, axis=1)[:, :, None]
              == jax.lax.dynamic_slice_in_dim(self.segments_BxL, k_start, k_size, axis=1)[:, None, :])
      allowed = jnp.logical_and(allowed, same[:, None])
    return allowed

  def first_key(self, q_start: int) -> int:
    """The first key a block of queries starting at q_start may see under the window or chunk (0: any)."""
    if self.window:
      return max(0, q_start - self.window + 1)
    return q_start // self.chunk * self.chunk if self.chunk else 0

  @property
  def given_as_parts(self) -> bool:
    """No mask at all, or one a core may take as its parts."""
    return self.mask is None or self.in_parts


@dataclasses.dataclass(frozen=True)
class WeightsRule:
  """Attention weights that are not a softmax of the logits (stick-breaking): what a variant's
  LayerPositions.weights_rule() returns, and the two forms the cores that serve it call.

  dense(logits_BxHxLqxLk, allowed, q_positions_BxLq, k_positions_BxLk) -> weights B x H x Lq x Lk, the
    logits scaled and with the variant's term, allowed the mask (True = attend; None: every key).
  blockwise(query_BxHxLqxK, key_BxGxLkxK, value_BxGxLkxV, allowed, q_positions_BxLq, k_positions_BxLk,
    logits_term, block_size, key_block_size, skip_future_blocks) -> output B x H x Lq x V: the same
    weights applied to the values in blocks of queries (and keys), the queries already scaled;
    logits_term(q_slice, k_slice) gives a block's term or None.
  """
  name: str
  dense: Callable
  blockwise: Callable


@dataclasses.dataclass(frozen=True)
class AttentionPositions:
  """The layer's positional hooks and what they read in one call.

  hooks: the variant's per-layer hooks (transformer/positions/base.py, LayerPositions).
  q_positions_BxLq, k_positions_BxLk: the positions of the queries and keys (B may be 1).
  shared: the stack's terms for every layer (TUPE's correlation, a shared T5 bias), or None.
  kernel_shared: the stack's parameters that the layer's kernel_term reads (T5's shared table), or None.
  sequence_length: the length of the sequence a full pass serves, 1 + the largest position of a real key
    (a scalar; padding excluded), which a rotation may read (LongRoPE's set by length); None: the keys'
    count, or in a cached decoding the cache's capacity.
  """
  hooks: LayerPositions
  q_positions_BxLq: chex.Array
  k_positions_BxLk: chex.Array
  shared: Shared = None
  kernel_shared: Shared = None
  sequence_length: Optional[chex.Array] = None


@dataclasses.dataclass(frozen=True)
class CoreSettings:
  """The layer's settings that a core reads: its blocks, its attention dropout, the platform."""
  backend: str                       # jax.default_backend(): 'cpu', 'gpu', 'tpu'
  block_size: int = 0                # queries per block (0: no blocks)
  key_block_size: int = 0            # keys per block (0: every key a query block sees, in one block)
  dropout_rate: float = 0.0          # attention dropout on the weights
  dropout_rng: Optional[chex.PRNGKey] = None  # None: no attention dropout in this call
  collect_weights: bool = False      # the caller collects the weights ('intermediates')


@dataclasses.dataclass(frozen=True)
class AttentionRequest:
  """One attention call: query B x Lq x H x K, key B x Lk x H x K, value B x Lk x H x V (the layout
  of jax.nn.dot_product_attention), the logit scale, the mask, and the positional hooks (None: no
  position terms, as in cross-attention).

  softcap c > 0: every logit (the position term included) capped to c tanh(x / c) before the softmax (Gemma 2);
  sink_H: a logit per head that joins every row's softmax denominator and reads no value (GPT-OSS's sinks).
  """
  query_BxLqxHxK: chex.Array
  key_BxLkxHxK: chex.Array
  value_BxLkxHxV: chex.Array
  scale: float
  mask: AttentionMask = AttentionMask()
  positions: Optional[AttentionPositions] = None
  softcap: float = 0.0
  sink_H: Optional[chex.Array] = None

  def __post_init__(self):
    chex.assert_rank([self.query_BxLqxHxK, self.key_BxLkxHxK, self.value_BxLkxHxV], 4)
    chex.assert_equal_shape_prefix([self.key_BxLkxHxK, self.value_BxLkxHxV], 3)

  @functools.cached_property
  def logits_term(self) -> Optional[chex.Array]:
    """The variant's logits term for the whole call, broadcastable to B x H x Lq x Lk; None for none.
    Computed on first reading, by the cores that add it for the whole call (not blocks, not a kernel)."""
    if self.positions is None:
      return None
    return self.positions.hooks.logits(self.query_BxLqxHxK, self.key_BxLkxHxK, self.positions.q_positions_BxLq,
                                       self.positions.k_positions_BxLk, self.positions.shared, self.scale)

  def values_term(self, weights_BxHxLqxLk: chex.Array) -> Optional[chex.Array]:
    """The variant's values term B x Lq x H x V for these weights; None for none."""
    if self.positions is None:
      return None
    return self.positions.hooks.values(weights_BxHxLqxLk, self.positions.q_positions_BxLq,
                                       self.positions.k_positions_BxLk)

  @property
  def weights_rule(self) -> Optional[WeightsRule]:
    """The variant's rule for the weights; None: the softmax."""
    return None if self.positions is None else self.positions.hooks.weights_rule()


@dataclasses.dataclass(frozen=True)
class AttentionResult:
  """A core's output, B x Lq x H x V, and its weights B x H x Lq x Lk where it formed them (else None)."""
  output_BxLqxHxV: chex.Array
  weights_BxHxLqxLk: Optional[chex.Array] = None
