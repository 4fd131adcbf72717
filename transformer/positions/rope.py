"""Rotary position embedding (Su et al. 2021, RoFormer, eq. 34).

Each pair of dimensions (2i, 2i+1) of a query or key at position m is rotated by the angle
m * theta_i, theta_i = base^(-2i/d):  [x'_2i, x'_2i+1] = [x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos].
Then q_m . k_n depends on m - n only. Elementwise ops; no table, no gather.
"""

import dataclasses

import chex
import jax.numpy as jnp

from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require


@dataclasses.dataclass(frozen=True)
class RopeSettings(Settings):
  rope_base: float = 10000.0  # theta_i = base^(-2i/d)

  def check(self):
    require(self.rope_base > 1.0, 'position.rope_base', self.rope_base, 'a number > 1')

  def check_attention(self, num_heads, head_dim, causal):
    require(head_dim % 2 == 0, 'model_dim', num_heads * head_dim,
            f'model_dim / num_heads even (now {head_dim}), since rope rotates pairs of dimensions')


def rotate(x_BxLxHxK: chex.Array, positions_BxL: chex.Array, base: float = 10000.0) -> chex.Array:
  """R(pos) x for every position and head, in float32, returned in x's dtype."""
  chex.assert_rank([x_BxLxHxK, positions_BxL], [4, 2])
  head_dim = x_BxLxHxK.shape[-1]
  if head_dim % 2:
    raise ValueError(f'rope rotates pairs of dimensions: head_dim must be even, got {head_dim}')
  theta_P = base ** (-2.0 * jnp.arange(head_dim // 2, dtype=jnp.float32) / head_dim)
  angle_BxLx1xP = (positions_BxL.astype(jnp.float32)[..., None] * theta_P)[:, :, None, :]
  cos, sin = jnp.cos(angle_BxLx1xP), jnp.sin(angle_BxLx1xP)
  pairs = x_BxLxHxK.astype(jnp.float32).reshape(*x_BxLxHxK.shape[:-1], head_dim // 2, 2)
  even, odd = pairs[..., 0], pairs[..., 1]
  rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
  result = rotated.reshape(x_BxLxHxK.shape).astype(x_BxLxHxK.dtype)
  chex.assert_equal_shape([result, x_BxLxHxK])
  return result


class Rope(LayerPositions):
  """Rotates queries and keys."""

  def rotate(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk):
    return (rotate(query_BxLqxHxK, q_positions_BxLq, self.config.rope_base),
            rotate(key_BxLkxHxK, k_positions_BxLk, self.config.rope_base))


VARIANT = Variant(StackPositions, Rope, 'Su et al. 2021 (RoFormer)', RopeSettings, shift_invariant=True)
