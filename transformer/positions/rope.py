"""Rotary position embedding (Su et al. 2021, RoFormer, eq. 34).

Each pair of dimensions (2i, 2i+1) of a query or key at position m is rotated by the angle
m * theta_i, theta_i = base^(-2i/d):  [x'_2i, x'_2i+1] = [x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos].
Then q_m . k_n depends on m - n only. Elementwise ops; no table, no gather. The settings carry a
context extension (extension.py: position interpolation, NTK, dynamic NTK, YaRN, Llama 3), off by default.
"""

import dataclasses
from typing import Optional

import chex
import flax.linen as nn
import jax.numpy as jnp

from transformer.positions.base import LayerPositions, StackPositions, Variant, require
from transformer.positions.extension import ExtensionSettings, dynamic_ntk_logits, extended_frequencies


@dataclasses.dataclass(frozen=True)
class RopeSettings(ExtensionSettings):
  rope_base: float = 10000.0  # theta_i = base^(-2i/d)

  def check(self):
    super().check()
    require(self.rope_base > 1.0, 'position.rope_base', self.rope_base, 'a number > 1')

  def check_attention(self, num_heads, head_dim, causal):
    super().check_attention(num_heads, head_dim, causal)
    require(head_dim % 2 == 0, 'model_dim', num_heads * head_dim,
            f'model_dim / num_heads even (now {head_dim}), since rope rotates pairs of dimensions')


def rope_frequencies(head_dim: int, base: float = 10000.0) -> chex.Array:
  """theta_p = base^(-2p/d) for the head_dim / 2 pairs of dimensions, float32."""
  return base ** (-2.0 * jnp.arange(head_dim // 2, dtype=jnp.float32) / head_dim)


def rotate_by(x_BxLxHxK: chex.Array, positions_BxL: chex.Array, theta_P: chex.Array,
              scale_BxLxP: Optional[chex.Array] = None, magnitude=1.0) -> chex.Array:
  """Pair p of every head rotated by pos * theta_p (and multiplied by scale[pos, p], xPos, and by
  magnitude, YaRN), in float32, returned in x's dtype. A zero frequency leaves its pair exactly as it
  is (cos 0 = 1, sin 0 = 0)."""
  chex.assert_rank([x_BxLxHxK, positions_BxL, theta_P], [4, 2, 1])
  head_dim = x_BxLxHxK.shape[-1]
  if head_dim % 2:
    raise ValueError(f'rope rotates pairs of dimensions: head_dim must be even, got {head_dim}')
  chex.assert_shape(theta_P, (head_dim // 2,))
  angle_BxLx1xP = (positions_BxL.astype(jnp.float32)[..., None] * theta_P.astype(jnp.float32))[:, :, None, :]
  cos, sin = jnp.cos(angle_BxLx1xP), jnp.sin(angle_BxLx1xP)
  if scale_BxLxP is not None:
    scale_BxLx1xP = scale_BxLxP.astype(jnp.float32)[:, :, None, :]
    cos, sin = cos * scale_BxLx1xP, sin * scale_BxLx1xP
  if not (isinstance(magnitude, float) and magnitude == 1.0):
    cos, sin = cos * magnitude, sin * magnitude
  pairs = x_BxLxHxK.astype(jnp.float32).reshape(*x_BxLxHxK.shape[:-1], head_dim // 2, 2)
  even, odd = pairs[..., 0], pairs[..., 1]
  rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
  result = rotated.reshape(x_BxLxHxK.shape).astype(x_BxLxHxK.dtype)
  chex.assert_equal_shape([result, x_BxLxHxK])
  return result


def rotate(x_BxLxHxK: chex.Array, positions_BxL: chex.Array, base: float = 10000.0) -> chex.Array:
  """R(pos) x for every position and head, in float32, returned in x's dtype."""
  chex.assert_rank(x_BxLxHxK, 4)
  head_dim = x_BxLxHxK.shape[-1]
  if head_dim % 2:
    raise ValueError(f'rope rotates pairs of dimensions: head_dim must be even, got {head_dim}')
  return rotate_by(x_BxLxHxK, positions_BxL, rope_frequencies(head_dim, base))


def _keeping_first(x_BxLxHxK, positions_BxL, theta_P, trained_P, scale_BxLxP, magnitude, keep_first: int):
  """x rotated by theta and the magnitude, but at positions below keep_first by the trained frequencies and
  no magnitude: LongRoPE's n-hat."""
  kept_BxLx1x1 = (positions_BxL < keep_first)[:, :, None, None]
  return jnp.where(kept_BxLx1x1, rotate_by(x_BxLxHxK, positions_BxL, trained_P, scale_BxLxP),
                   rotate_by(x_BxLxHxK, positions_BxL, theta_P, scale_BxLxP, magnitude))


CAPACITY = 'longrope_capacity'  # the cache's entry for its capacity, with longrope_by_length


class RotaryLayer(LayerPositions):
  """Rotates queries and keys by frequencies(head_dim), scaled by position_scales (xPos), under the
  settings' context extension; dynamic NTK's rotation by query is a logits term instead (extension.py)."""

  def frequencies(self, head_dim: int) -> chex.Array:
    """theta_p for the head's d / 2 pairs (0: not rotated)."""
    raise NotImplementedError

  def position_scales(self, q_positions_BxLq, k_positions_BxLk, head_dim: int):
    """Per-pair factors of queries and keys by position (B x L x P each), or (None, None)."""
    del q_positions_BxLq, k_positions_BxLk, head_dim
    return None, None

  @nn.compact
  def from_inputs(self, inputs_BxLqxD, shared, use_cache=False, cache_index=None):
    """With frequencies chosen by the sequence's length (LongRoPE's set by length, dynamic_ntk_sequence), the
    first call of a cached decoding keeps the cache's capacity (its input's length), which later calls' rotate()
    reads."""
    if use_cache and self.settings.reads_sequence_length():
      self.variable('cache', CAPACITY, lambda: jnp.asarray(inputs_BxLqxD.shape[1], jnp.int32))
    return shared

  def rotate(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, sequence_length=None):
    head_dim = query_BxLqxHxK.shape[-1]
    q_scale, k_scale = self.position_scales(q_positions_BxLq, k_positions_BxLk, head_dim)
    if self.settings.per_query():  # scaled only (xPos); logits() rotates
      if q_scale is None:
        return query_BxLqxHxK, key_BxLkxHxK
      theta_P, magnitude = jnp.zeros(head_dim // 2, jnp.float32), 1.0
    else:
      if sequence_length is None:
        sequence_length = k_positions_BxLk.shape[1]
      if self.has_variable('cache', CAPACITY):  # a cached decoding: its capacity
        sequence_length = self.get_variable('cache', CAPACITY)
      trained_P = self.frequencies(head_dim)
      theta_P, magnitude = extended_frequencies(trained_P, self.settings, sequence_length)
      keep_first = self.settings.longrope_keeps_first()
      if keep_first:
        return (_keeping_first(query_BxLqxHxK, q_positions_BxLq, theta_P, trained_P, q_scale, magnitude, keep_first),
                _keeping_first(key_BxLkxHxK, k_positions_BxLk, theta_P, trained_P, k_scale, magnitude, keep_first))
    return (rotate_by(query_BxLqxHxK, q_positions_BxLq, theta_P, q_scale, magnitude),
            rotate_by(key_BxLkxHxK, k_positions_BxLk, theta_P, k_scale, magnitude))

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    if not self.settings.per_query():
      return None
    return dynamic_ntk_logits(query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk,
                              self.frequencies(query_BxLqxHxK.shape[-1]), self.settings.original_length, scale)

  def kernel_serves(self):
    return not self.settings.per_query()  # dynamic NTK's per-query rotation is a logits term of q and k


class Rope(RotaryLayer):
  """Rotates queries and keys."""

  def frequencies(self, head_dim):
    return rope_frequencies(head_dim, self.settings.rope_base)


VARIANT = Variant(StackPositions, Rope, 'Su et al. 2021 (RoFormer)', RopeSettings, shift_invariant=True)
