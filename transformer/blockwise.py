"""Attention one block of queries at a time, with an online softmax over blocks of keys
(Milakov and Gimelshein 2018; Rabe and Staats 2021; the forward pass of Dao et al. 2022,
FlashAttention), in plain JAX.

For each block b of queries, a running row maximum m, a running sum l and an output accumulator o
are carried over the blocks c of keys:

  s = Q_b K_c^T * scale + term_bc (masked: fill)   m' = max(m, rowmax s)   p = exp(s - m')
  l = exp(m - m') l + rowsum p           o = exp(m - m') o + p V_c (+ values_term(p))
  output_b = o / l

Position terms are computed per block: per-layer terms (Shaw, unshared T5) by calling the variant's
hooks with the block's positions, shared terms (TUPE, ALiBi, shared T5) by slicing the stack's
shared pytree; terms that vanish beyond a causal band (Shaw, re-centred) only on the keys of the
band, the keys before it folded in as a block without terms. In causal self-attention (queries and
keys at the same positions) keys after a query block's last query are never computed: about half
the work at long lengths. Each block's logits and weights are recomputed in the backward pass
rather than stored.

Key blocks: by default one block, every key a query block may see (its causal prefix), which on a
CPU is the fastest (few, large matmuls; a compiled program that grows with L / block, not
(L / block)^2); key_block_size bounds the logits held at once to block x key_block, for lengths
where even one block row of the L x L logits is too much. The result equals softmax attention up to
float rounding (tests/test_blockwise.py checks every variant).
"""

import functools
import math
from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp

from transformer.attention import grouped_logits, grouped_output
from transformer.softmax import masked_fill_value, soft_cap


def block_slice(term: Optional[chex.Array], q_slice: slice, k_slice: slice) -> Optional[chex.Array]:
  """term[..., q_slice, k_slice] for a term broadcast to ... x Lq x Lk (size-1 axes stay whole)."""
  if term is None:
    return None
  rows = q_slice if term.shape[-2] > 1 else slice(None)
  columns = k_slice if term.shape[-1] > 1 else slice(None)
  return term[..., rows, columns]


def blockwise_attention(query: chex.Array, key: chex.Array, value: chex.Array, *, block_size: int,
                        mask: Optional[chex.Array | Callable] = None, scale: Optional[float] = None,
                        skip_future_blocks: bool = False,
                        logits_term: Optional[Callable] = None,
                        values_term: Optional[Callable] = None,
                        key_block_size: Optional[int] = None, band: Optional[int] = None,
                        value_offset_HxV: Optional[chex.Array] = None,
                        first_key: Optional[Callable[[int], int]] = None, softcap: float = 0.0,
                        sink_H: Optional[chex.Array] = None) -> chex.Array:
  """softmax(cap(Q K^T * scale + term), sink) V (+ the values term), block_size queries at a time, over
  key_block_size keys at a time (None: all the keys the query block may see, in one block).

  query B x Lq x H x K, key B x Lk x G x K, value B x Lk x G x V (the layout of
  jax.nn.dot_product_attention; query head h reads key and value head h // (H / G)); mask (True = attend)
  broadcasts to B x H x Lq x Lk, or is mask(q_slice, k_slice) -> one block's (AttentionMask.block: never the whole).
  logits_term(query_block, q_slice, k_slice) -> a term broadcastable to B x H x bq x bk, or None.
  values_term(p_BxHxbqxbk, q_slice, k_slice) -> B x bq x H x V, or None; it must be linear in p,
  since it receives unnormalised, running-max-shifted weights (Shaw's a^V term is).
  skip_future_blocks: the mask is causal with query i and key i at the same position, so keys
  after a query block's last query are skipped without being computed.
  band: with skip_future_blocks, the terms vanish for keys more than `band` positions before the
  query; each query block's keys before its first query's band then go in without terms (in
  key_block_size blocks), and the terms are computed on one block of the rest: the block's queries
  and the `band` keys before them.
  value_offset_HxV: a vector per query head added to every value it reads (Shaw's re-centred band), added to
  the output instead (each row's weights sum to one), so that values shared by a group of query heads stay as
  they are.
  first_key(q_start): with skip_future_blocks, the first key a query block starting at q_start may see (a
  sliding window's or a chunk's, which the mask holds): the keys before it are skipped without being computed.
  softcap c > 0: each logit capped to c tanh(x / c); sink_H: a logit per head in every row's denominator, which
  starts the online softmax (m = s, l = 1, o = 0). A query row whose keys are all masked gets zeros (as
  scaled_dot_product_attention gives).
  """
  _check_arguments(query, key, value, block_size, key_block_size, skip_future_blocks, band)
  batch, length_q, heads, head_dim = query.shape
  length_k = key.shape[1]
  if scale is None:
    scale = 1.0 / math.sqrt(head_dim)
  # Heads first (B x H x L x K) once, so that every block's two matmuls are plain batched matmuls
  # over contiguous rows, which XLA's CPU backend runs faster than contractions over the B x L x H x K
  # layout (`python -m experiments.benchmark attention`).
  # Scaled once here (B x H x L x K numbers) rather than in every block's logits (L x L per head).
  query_BxHxLqxK = jnp.transpose(query, (0, 2, 1, 3)).astype(jnp.float32) * scale
  key_BxGxLkxK = jnp.transpose(key, (0, 2, 1, 3)).astype(jnp.float32)
  value_BxGxLkxV = jnp.transpose(value, (0, 2, 1, 3))
  outputs = []
  for q_start in range(0, length_q, block_size):
    q_slice = slice(q_start, min(q_start + block_size, length_q))
    last_key = q_slice.stop if skip_future_blocks else length_k
    start_key = first_key(q_slice.start) if skip_future_blocks and first_key is not None else 0
    blocks = _key_blocks(q_slice.start, last_key, key_block_size, band, start_key)
    start = None if sink_H is None else sink_start(sink_H, batch, q_slice.stop - q_slice.start, value.shape[-1])
    outputs.append(_query_block(query[:, q_slice], query_BxHxLqxK[:, :, q_slice], key_BxGxLkxK, value_BxGxLkxV,
                                q_slice, blocks, mask, logits_term, values_term, value_offset_HxV, softcap, start))
  output = jnp.transpose(jnp.concatenate(outputs, axis=2), (0, 2, 1, 3)).astype(value.dtype)
  chex.assert_shape(output, (batch, length_q, heads, value.shape[-1]))
  return output


def sink_start(sink_H: chex.Array, batch: int, block: int, value_dim: int):
  """The online softmax's state before any key when the sink s_h is in every denominator: m = s, l = exp(s - m)
  (one, with s's gradient), o = 0."""
  sink_BxHxbqx1 = jnp.broadcast_to(sink_H.astype(jnp.float32)[None, :, None, None], (batch, len(sink_H), block, 1))
  running_max = jax.lax.stop_gradient(sink_BxHxbqx1)
  return running_max, jnp.exp(sink_BxHxbqx1 - running_max), jnp.zeros((batch, len(sink_H), block, value_dim))


def _query_block(query_block, query_BxHxbqxK, key_BxGxLkxK, value_BxGxLkxV, q_slice: slice, blocks: list, mask,
                 logits_term, values_term, value_offset_HxV, softcap: float = 0.0, start=None):
  """One block of queries over its key blocks ((slice, with terms) pairs): B x H x bq x V, an online softmax
  from `start` (None: set by the first key block)."""
  plain = _updates(softcap, with_weights=False)
  update = _updates(softcap, with_weights=True) if values_term is not None else plain
  running_max, running_sum, accumulator = start or (None, None, None)
  for k_slice, with_terms in blocks:
    term = logits_term(query_block, q_slice, k_slice) if logits_term is not None and with_terms else None
    block_update = update if with_terms else plain
    running_max, running_sum, accumulator, weights = block_update(
        query_BxHxbqxK, key_BxGxLkxK[:, :, k_slice], value_BxGxLkxV[:, :, k_slice], term,
        mask(q_slice, k_slice) if callable(mask) else block_slice(mask, q_slice, k_slice), running_max, running_sum,
        accumulator)
    if values_term is not None and with_terms:
      extra_BxbqxHxV = values_term(weights, q_slice, k_slice)
      if extra_BxbqxHxV is not None:
        accumulator = accumulator + jnp.transpose(extra_BxbqxHxV, (0, 2, 1, 3)).astype(jnp.float32)
  return normalised_output(running_max, running_sum, accumulator, value_offset_HxV)


def normalised_output(running_max_BxHxbqx1, running_sum_BxHxbqx1, accumulator_BxHxbqxV,
                      value_offset_HxV: Optional[chex.Array] = None) -> chex.Array:
  """o / l once every key block is folded in (+ the value offset); zeros for a row that saw no allowed key."""
  # Such a row still has the fill value as its maximum (and weights of exp(0) = 1 for its masked keys). Any
  # allowed key later sets the maximum, and the correction exp(fill - maximum) = 0 clears what came before.
  seen_a_key = running_max_BxHxbqx1 > masked_fill_value(jnp.float32)
  output = accumulator_BxHxbqxV / jnp.where(seen_a_key, running_sum_BxHxbqx1, 1.0)
  if value_offset_HxV is not None:
    output = output + value_offset_HxV.astype(jnp.float32)[None, :, None, :]
  return jnp.where(seen_a_key, output, 0.0)


def _check_arguments(query, key, value, block_size, key_block_size, skip_future_blocks, band) -> None:
  """ValueError naming the argument for block sizes, causal skipping or a band that cannot apply."""
  chex.assert_rank([query, key, value], 4)
  chex.assert_equal_shape_prefix([key, value], 3)
  chex.assert_equal_shape([query[:, :1, :1], key[:, :1, :1]])  # same batch and head width
  for name, size in (('attention_block_size', block_size), ('attention_key_block_size', key_block_size)):
    if size is not None and size <= 0:
      raise ValueError(f'{name}: got {size}; valid: a positive number of positions')
  if skip_future_blocks and query.shape[1] != key.shape[1]:
    raise ValueError(f'skip_future_blocks needs queries and keys at the same positions; got lengths '
                     f'{query.shape[1]} and {key.shape[1]}')
  if band is not None and (not skip_future_blocks or band < 0):
    raise ValueError(f'band: got {band} (skip_future_blocks={skip_future_blocks}); valid: a distance >= 0, '
                     f'in causal attention (skip_future_blocks=True)')


def _key_blocks(q_start: int, last_key: int, key_block_size: Optional[int], band: Optional[int],
                first_key: int = 0):
  """(key slice, whether the terms apply) for one query block: keys [first_key, last_key) in key_block_size
  blocks (None: one block), all with terms; with a band, the keys before q_start - band in such
  blocks without terms, then the rest in one block with them."""
  def blocks(start: int, stop: int, with_terms: bool):
    step = key_block_size or max(stop - start, 1)  # a range step of at least 1, when there are no keys
    return [(slice(begin, min(begin + step, stop)), with_terms) for begin in range(start, stop, step)]
  if band is None:
    return blocks(first_key, last_key, True)
  band_start = max(q_start - band, first_key)
  return blocks(first_key, band_start, False) + [(slice(band_start, last_key), True)]


@jax.custom_vjp
def add_broadcast_term(logits: chex.Array, term: chex.Array) -> chex.Array:
  """logits + term, term broadcast over the batch (and any other size-1 axes), whose gradient sums
  the batch's slices one add at a time: XLA's CPU backend reduces a leading axis of a block's
  logits about 10x slower than it adds B slices (TUPE at length 1024: 1.37x the no-position step
  with the reduce)."""
  return logits + term


def _add_broadcast_term_forward(logits, term):
  return logits + term, term.shape


def _add_broadcast_term_backward(term_shape, gradient):
  aligned_shape = (1,) * (gradient.ndim - len(term_shape)) + tuple(term_shape)  # broadcasting's alignment
  term_gradient = gradient
  if aligned_shape[0] == 1 and gradient.shape[0] > 1:  # the batch: one add per slice
    term_gradient = sum(gradient[index] for index in range(gradient.shape[0]))[None]
  other_axes = tuple(axis for axis in range(1, gradient.ndim) if aligned_shape[axis] == 1 and gradient.shape[axis] > 1)
  if other_axes:
    term_gradient = jnp.sum(term_gradient, axis=other_axes, keepdims=True)
  return gradient, term_gradient.reshape(term_shape)


add_broadcast_term.defvjp(_add_broadcast_term_forward, _add_broadcast_term_backward)


def online_softmax_update(softcap, query_BxHxbqxK, key_BxGxbkxK, value_BxGxbkxV, term, allowed,
                           running_max_BxHxbqx1, running_sum_BxHxbqx1, accumulator_BxHxbqxV):
  """One key block folded into a query block's running (max, sum, output), all heads first (None
  before the first block); also the block's unnormalised weights, which only a values term needs."""
  logits = grouped_logits(query_BxHxbqxK, key_BxGxbkxK)  # the queries come scaled
  if term is not None:
    logits = add_broadcast_term(logits, term.astype(jnp.float32))
  logits = soft_cap(logits, softcap)
  if allowed is not None:
    allowed = jnp.broadcast_to(allowed, logits.shape)
    logits = jnp.where(allowed, logits, masked_fill_value(jnp.float32))
  # The output does not depend on the shift (it cancels between o and l), so no gradient flows
  # through the maximum: skipping it saves the backward pass a compare and select over the logits.
  new_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  if running_max_BxHxbqx1 is not None:
    new_max = jnp.maximum(running_max_BxHxbqx1, new_max)
  weights = jnp.exp(logits - new_max)  # masked keys: exp(fill - max) = 0 once the row has an allowed key
  block_sum = jnp.sum(weights, axis=-1, keepdims=True)
  block_output = grouped_output(weights.astype(value_BxGxbkxV.dtype), value_BxGxbkxV).astype(jnp.float32)
  if running_max_BxHxbqx1 is None:
    return new_max, block_sum, block_output, weights
  correction = jnp.exp(running_max_BxHxbqx1 - new_max)
  running_sum = running_sum_BxHxbqx1 * correction + block_sum
  accumulator = accumulator_BxHxbqxV * correction + block_output
  return new_max, running_sum, accumulator, weights


@functools.lru_cache(maxsize=None)
def _updates(softcap: float, with_weights: bool) -> Callable:
  """online_softmax_update with its cap, recomputed in the backward pass rather than stored (as FlashAttention
  does): the block's logits and weights never stay in memory, only its inputs. With a values term
  (with_weights) the weights are an output and are kept."""
  update = functools.partial(online_softmax_update, softcap)
  return jax.checkpoint(update if with_weights else lambda *args: update(*args)[:3] + (None,))


def shared_by_query_block(shared, length_q: int, block_size: int) -> Callable:
  """The stack's shared terms cut once into rows of block_size queries, and a function giving one
  block's terms (q_slice, k_slice) -> pytree as a column slice of its rows.

  Slicing each block out of the whole ... x Lq x Lk term instead makes each block's gradient a
  full-size pad, summed over blocks and layers (TUPE at length 2048, batch 1: 20x the no-position
  step and 9.6 GB); the gradient of one split is one concatenation, and of a column slice a pad of
  the block's rows only."""
  leaves, treedef = jax.tree_util.tree_flatten(shared)
  boundaries = list(range(block_size, length_q, block_size))
  rows = [jnp.split(leaf, boundaries, axis=-2) if leaf.shape[-2] > 1 else [leaf] * (len(boundaries) + 1)
          for leaf in leaves]

  def block_terms(q_slice: slice, k_slice: slice):
    index = q_slice.start // block_size
    return treedef.unflatten([block_slice(leaf_rows[index], slice(None), k_slice) for leaf_rows in rows])
  return block_terms
