"""Stick-breaking attention (Tan, Shen, Yang, Panda and Courville, ICLR 2025, "Scaling Stick-Breaking
Attention: An Efficient Implementation and In-depth Study"), in every self-attention layer of a causal model.

No softmax and no position encoding: each key j before query i breaks off a fraction beta_ij of what the
keys between them left over, the nearest first,

  beta_ij = sigmoid(z_ij),   A_ij = beta_ij prod_{j<k<i} (1 - beta_ik),   o_i = sum_j A_ij v_j,

z_ij = q_i . k_j / sqrt(d). The weights sum to at most 1 (the rest is not attended), and order comes from
the product: a key is seen through the ones after it. In log space, with a reverse cumulative sum over
the keys,

  log A_ij = log sigmoid(z_ij) + sum_{k>j, k allowed} log sigmoid(-z_ik),

so nothing underflows before the exponential. Keys are those strictly before the query (the product's
range), or up to and including it with stick_breaking_attend_current. The cores: the explicit one forms
A; blocks of queries run over blocks of keys from the nearest to the farthest, carrying the sum of
log(1 - beta) of the keys already passed; fused softmax kernels refuse it.
"""

import dataclasses
from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp

from transformer.attention import grouped_logits, grouped_output
from transformer.attention_request import WeightsRule
from transformer.blockwise import block_slice
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require
from transformer.softmax import masked_fill_value


@dataclasses.dataclass(frozen=True)
class StickBreakingSettings(Settings):
  stick_breaking_attend_current: bool = False  # false: keys j < i (the paper's product); true: j <= i

  def check(self):
    require(isinstance(self.stick_breaking_attend_current, bool), 'position.stick_breaking_attend_current',
            self.stick_breaking_attend_current, 'true or false')


def keys_allowed(allowed: Optional[chex.Array], q_positions_BxLq: chex.Array, k_positions_BxLk: chex.Array,
                 attend_current: bool) -> chex.Array:
  """The mask without each query's own position (unless attend_current): B x 1 x Lq x Lk (or the mask's)."""
  own_BxLqxLk = k_positions_BxLk[:, None, :] == q_positions_BxLq[:, :, None]
  kept = jnp.logical_not(own_BxLqxLk[:, None]) if not attend_current else jnp.ones_like(own_BxLqxLk[:, None])
  return kept if allowed is None else jnp.logical_and(allowed, kept)


def _log_weights(logits: chex.Array, allowed: chex.Array, later_sum=None):
  """log A_ij over one row block: log sigmoid(z_ij) + the reverse exclusive sum of log sigmoid(-z_ik) over the
  allowed keys after j (plus later_sum, the keys after the block); also the block's whole sum."""
  logits = logits.astype(jnp.float32)
  log_rest = jnp.where(allowed, jax.nn.log_sigmoid(-logits), 0.0)
  after_j = jax.lax.cumsum(log_rest, axis=logits.ndim - 1, reverse=True) - log_rest
  if later_sum is not None:
    after_j = after_j + later_sum
  log_weights = jnp.where(allowed, jax.nn.log_sigmoid(logits) + after_j, masked_fill_value(jnp.float32))
  return log_weights, jnp.sum(log_rest, axis=-1, keepdims=True)


def stick_breaking_weights(logits_BxHxLqxLk: chex.Array, allowed: Optional[chex.Array]) -> chex.Array:
  """A_ij = sigmoid(z_ij) prod_{allowed k > j} (1 - sigmoid(z_ik)) for allowed j, else 0: B x H x Lq x Lk."""
  allowed = jnp.ones(logits_BxHxLqxLk.shape, bool) if allowed is None else jnp.broadcast_to(
      allowed, logits_BxHxLqxLk.shape)
  log_weights, _ = _log_weights(logits_BxHxLqxLk, allowed)
  return jnp.where(allowed, jnp.exp(log_weights), 0.0)


def _block_step(query_BxHxbqxK, key_BxGxbkxK, value_BxGxbkxV, term, allowed, later_sum, accumulator):
  """One key block folded into a query block, the blocks after it already passed: (later_sum, accumulator).
  Query head h reads key and value head h // (H / G)."""
  logits = grouped_logits(query_BxHxbqxK, key_BxGxbkxK)  # the queries come scaled
  if term is not None:
    logits = logits + term.astype(jnp.float32)
  allowed = jnp.broadcast_to(allowed, logits.shape)
  log_weights, block_sum = _log_weights(logits, allowed, later_sum)
  weights = jnp.where(allowed, jnp.exp(log_weights), 0.0)
  output = grouped_output(weights.astype(value_BxGxbkxV.dtype), value_BxGxbkxV).astype(jnp.float32)
  return later_sum + block_sum, accumulator + output


_checkpointed_step = jax.checkpoint(_block_step)  # a block's logits and weights are recomputed, never stored


def stick_breaking_blockwise(query_BxHxLqxK, key_BxGxLkxK, value_BxGxLkxV, allowed, logits_term: Callable,
                             block_size: int, key_block_size: Optional[int], skip_future_blocks: bool) -> chex.Array:
  """sum_j A_ij v_j in blocks of block_size queries, each over blocks of key_block_size keys (None: one) from
  the last the block sees to the first, carrying the sum of log(1 - beta) of the keys passed: B x H x Lq x V.
  Query head h reads key and value head h // (H / G). allowed: the mask broadcastable to B x H x Lq x Lk, the own
  position already removed where it must be."""
  batch, heads, length_q, _ = query_BxHxLqxK.shape
  length_k = key_BxGxLkxK.shape[2]
  outputs = []
  for q_start in range(0, length_q, block_size):
    q_slice = slice(q_start, min(q_start + block_size, length_q))
    last_key = q_slice.stop if skip_future_blocks else length_k
    step = key_block_size or max(last_key, 1)
    starts = list(range(0, last_key, step))
    later_sum = jnp.zeros((batch, heads, q_slice.stop - q_slice.start, 1), jnp.float32)
    accumulator = jnp.zeros((batch, heads, q_slice.stop - q_slice.start, value_BxGxLkxV.shape[-1]), jnp.float32)
    for k_start in reversed(starts):
      k_slice = slice(k_start, min(k_start + step, last_key))
      later_sum, accumulator = _checkpointed_step(
          query_BxHxLqxK[:, :, q_slice], key_BxGxLkxK[:, :, k_slice], value_BxGxLkxV[:, :, k_slice],
          logits_term(q_slice, k_slice), block_slice(allowed, q_slice, k_slice), later_sum, accumulator)
    outputs.append(accumulator)
  return jnp.concatenate(outputs, axis=2)


class StickBreakingLayer(LayerPositions):
  """No term: its rule replaces the softmax."""

  def weights_rule(self):
    attend_current = self.settings.stick_breaking_attend_current

    def dense(logits_BxHxLqxLk, allowed, q_positions_BxLq, k_positions_BxLk):
      return stick_breaking_weights(logits_BxHxLqxLk,
                                    keys_allowed(allowed, q_positions_BxLq, k_positions_BxLk, attend_current))

    def blockwise(query, key, value, allowed, q_positions_BxLq, k_positions_BxLk, logits_term, block_size,
                  key_block_size, skip_future_blocks):
      return stick_breaking_blockwise(query, key, value,
                                      keys_allowed(allowed, q_positions_BxLq, k_positions_BxLk, attend_current),
                                      logits_term, block_size, key_block_size, skip_future_blocks)
    return WeightsRule('stick_breaking', dense, blockwise)


VARIANT = Variant(StackPositions, StickBreakingLayer, 'Tan et al. 2025 (stick-breaking attention)',
                  StickBreakingSettings, shift_invariant=True, causal_only=True)
