"""Decoding caches whose memory does not grow with the length decoded.

A sliding layer's rolling cache: the keys and values of its last R = min(W, capacity) positions, oldest first
(Mistral's rolling buffer, Jiang et al. 2023). A step of n tokens attends over the R cached keys and its own n (a
query sees the W - 1 keys before it, so never one older than the cache holds), then keeps the newest R of those
R + n; a slot not yet written holds the position EMPTY, outside every window.

StreamingLLM's cache (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"), for every
layer: N slots, the first S tokens of the stream kept for good (attention sinks) and the N - S most recent after
them, one token fed per call. Positions are the slots' (0 .. N - 1, the query at min(t, N - 1) after t tokens), so
the keys are kept before the variant's rotation and rotated at their slot's position at every step."""

import dataclasses
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

EMPTY = -(2 ** 30)  # the position of a slot not yet written: query - EMPTY >= W for every query


@dataclasses.dataclass(frozen=True)
class RollingCache:
  """size: R, the slots. kept_R: in the call that creates the cache, the indices of its positions the slots keep
  (the last R of its first `prefix` positions; 0 for a slot left EMPTY); None in later calls."""
  size: int
  kept_R: Optional[np.ndarray] = None


def kept_positions(prefix: int, size: int) -> np.ndarray:
  """The positions the slots hold after a first call whose first `prefix` positions the decoding continues: the
  last `size` of 0 .. prefix - 1, oldest first, EMPTY before position 0. size, int32."""
  positions = np.arange(prefix - size, prefix, dtype=np.int32)
  return np.where(positions >= 0, positions, EMPTY).astype(np.int32)


def rolled(cached_BxRx___: chex.Array, new_BxLnx___: chex.Array) -> tuple[chex.Array, chex.Array]:
  """(the R cached entries and the n new ones, oldest first: what a step attends over; the newest R of them: the
  cache after the step)."""
  size = cached_BxRx___.shape[1]
  attended = jnp.concatenate([cached_BxRx___, new_BxLnx___.astype(cached_BxRx___.dtype)], axis=1)
  return attended, attended[:, -size:]


@dataclasses.dataclass(frozen=True)
class StreamingCache:
  """size: N slots; sinks: S, the first tokens kept; count: the tokens fed before this call (t, a scalar)."""
  size: int
  sinks: int
  count: Optional[chex.Array] = None


def streamed(cached_BxNx___: chex.Array, new_Bx1x___: chex.Array, cache: StreamingCache) -> chex.Array:
  """The slots after the t-th token (t = cache.count): written at slot t while t < N; then the oldest recent slot
  (S) leaves, the later ones move down one and the token takes the last."""
  new_Bx1x___ = new_Bx1x___.astype(cached_BxNx___.dtype)
  written = jax.lax.dynamic_update_slice_in_dim(cached_BxNx___, new_Bx1x___, jnp.minimum(cache.count, cache.size - 1),
                                                axis=1)
  shifted = jnp.concatenate([cached_BxNx___[:, :cache.sinks], cached_BxNx___[:, cache.sinks + 1:], new_Bx1x___],
                            axis=1)
  return jnp.where(cache.count < cache.size, written, shifted)
