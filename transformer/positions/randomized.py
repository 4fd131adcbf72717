"""Randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers"): a training option for every variant that reads position indices.

Instead of 0 .. L-1, a sequence's positions are a random subset of [0, R) of size L, in increasing order,
with R (randomized_max_length) at least the longest length evaluated: the model meets, while training
on short sequences, the position values a long one will have. A permutation of [0, R) is drawn per call
(one subset for the whole batch, as the paper's code draws one per batch); a row with n valid
positions (right padding) takes the first n entries of it, sorted, so its valid positions are a sorted
random n-subset whatever the padded width. Order is kept, so causal masks and relative distances stay
meaningful; the distances are now random gaps. A variant that reads no positions (none) is unchanged.
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp


def randomized_positions(key: chex.PRNGKey, length: int, max_length: int,
                         valid_BxL: Optional[chex.Array] = None) -> chex.Array:
  """A sorted random subset of [0, max_length) of size L: 1 x L int32 (B x L with valid_BxL, each row's
  first n valid positions a sorted random n-subset, its padded positions max_length - 1, at or beyond
  every valid one and still inside a table of max_length rows)."""
  if length > max_length:
    raise ValueError(f'randomized_max_length: got {max_length}; valid: at least the sequence length {length} '
                     f'(positions are drawn from [0, randomized_max_length) without repetition)')
  drawn_L = jax.random.permutation(key, max_length)[:length].astype(jnp.int32)
  if valid_BxL is None:
    return jnp.sort(drawn_L)[None]
  chex.assert_shape(valid_BxL, (None, length))
  count_Bx1 = jnp.sum(valid_BxL, axis=1, keepdims=True)
  index_L = jnp.arange(length, dtype=jnp.int32)
  candidates_BxL = jnp.where(index_L < count_Bx1, drawn_L, max_length - 1)
  return jnp.sort(candidates_BxL, axis=1)
