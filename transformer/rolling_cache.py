"""A sliding layer's decoding cache: the keys and values of its last R = min(W, capacity) positions, oldest first,
whatever the length decoded (Mistral's rolling buffer, Jiang et al. 2023). A step of n tokens attends over the R
cached keys and its own n (a query sees the W - 1 keys before it, so never one older than the cache holds), then
keeps the newest R of those R + n; a slot not yet written holds the position EMPTY, outside every window."""

import dataclasses
from typing import Optional

import chex
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
