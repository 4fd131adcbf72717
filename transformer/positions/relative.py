"""Terms that depend on the distance j - i, laid out by distance instead of by key (the "skewing"
of Huang et al. 2018, Music Transformer, section 3.4.1), for Shaw and T5.

When queries and keys are consecutive runs of positions with one offset c = k_0 - q_0 (every
sequence this library's models build, and every block of blockwise attention), row i of an
Lq x Lk term f(j - i + c) is a window of one vector indexed by t = j - i + Lq - 1, t in [0, Lq + Lk - 1).
A term built on the t axis (Lq + Lk - 1 entries, or Lq rows of them) and skewed into place by a pad,
a reshape and a slice costs memory moves only; a gather by an Lq x Lk index costs an Lq x Lk
scatter-add in the backward pass, which on a CPU is several times the cost of the attention itself.
Callers keep the gather for positions that are not consecutive runs; the check is made while
tracing when the positions are constants (the models build them with numpy), else by a lax.cond.
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np


def contiguous_offset(q_positions_BxLq: chex.Array, k_positions_BxLk: chex.Array):
  """(whether q and k are runs q_0 + i and k_0 + j with one k_0 - q_0 for the whole batch, that offset):
  Python values when the positions are known while tracing (the models' own), traced ones otherwise."""
  chex.assert_rank([q_positions_BxLq, k_positions_BxLk], 2)
  known = not any(isinstance(p, jax.core.Tracer) for p in (q_positions_BxLq, k_positions_BxLk))
  xp = np if known else jnp
  q_positions_BxLq, k_positions_BxLk = xp.asarray(q_positions_BxLq), xp.asarray(k_positions_BxLk)
  q_start, k_start = q_positions_BxLq[:, :1], k_positions_BxLk[:, :1]
  runs = (xp.all(q_positions_BxLq == q_start + xp.arange(q_positions_BxLq.shape[1]))
          & xp.all(k_positions_BxLk == k_start + xp.arange(k_positions_BxLk.shape[1])))
  offsets = (k_start - q_start).reshape(-1)
  consecutive, offset = runs & xp.all(offsets == offsets[0]), offsets[0]
  return (bool(consecutive), int(offset)) if known else (consecutive, offset)


def consecutive_or_gathered(consecutive, fast: Callable[[], chex.Array], gathered: Callable[[], chex.Array]):
  """fast() for consecutive positions, gathered() otherwise; a lax.cond only when that is decided at run time."""
  if isinstance(consecutive, jax.core.Tracer):
    return jax.lax.cond(consecutive, fast, gathered)
  return fast() if consecutive else gathered()


def distance_axis(length_q: int, length_k: int, offset: chex.Array) -> chex.Array:
  """j - i + c along t = j - i + Lq - 1: the Lq + Lk - 1 distances an Lq x Lk block covers."""
  return jnp.arange(length_q + length_k - 1, dtype=jnp.int32) - (length_q - 1) + jnp.asarray(offset, jnp.int32)


def by_distance_to_by_key(x_NxLqxLd: chex.Array, length_k: int) -> chex.Array:
  """out[..., i, j] = x[..., i, j - i + Lq - 1]: ... x Lq x (Lq + Lk - 1) -> ... x Lq x Lk."""
  *leading, length_q, width = x_NxLqxLd.shape
  chex.assert_equal(width, length_q + length_k - 1)
  padded = jnp.pad(x_NxLqxLd, [(0, 0)] * (len(leading) + 1) + [(0, 1)])  # rows of Lq + Lk
  flat = padded.reshape(*leading, length_q * (width + 1))
  # Row i of the result starts at flat index (Lq - 1) + i (Lq + Lk - 1) = i (Lq + Lk) + (Lq - 1 - i).
  window = flat[..., length_q - 1:length_q - 1 + length_q * width]
  return window.reshape(*leading, length_q, width)[..., :length_k]


def by_key_to_by_distance(w_NxLqxLk: chex.Array) -> chex.Array:
  """out[..., i, t] = w[..., i, t + i - (Lq - 1)], zero where that key is outside [0, Lk):
  ... x Lq x Lk -> ... x Lq x (Lq + Lk - 1)."""
  *leading, length_q, length_k = w_NxLqxLk.shape
  width = length_q + length_k - 1
  shifted = jnp.pad(w_NxLqxLk, [(0, 0)] * (len(leading) + 1) + [(length_q - 1, 0)])  # rows of width
  flat = jnp.pad(shifted.reshape(*leading, length_q * width), [(0, 0)] * len(leading) + [(0, length_q)])
  # Rows of width + 1 start one further along each row: row i begins at shifted[i, i]; what runs past
  # a row's end is the next row's left padding (or the final padding), so it is zero.
  return flat.reshape(*leading, length_q, width + 1)[..., :width]
