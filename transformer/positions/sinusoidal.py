"""Absolute sinusoidal encoding (Vaswani et al. 2017, section 3.5), added to the embeddings.

PE(pos, 2i) = sin(pos / base^(2i/d)),  PE(pos, 2i+1) = cos(pos / base^(2i/d)).
Computed from the positions by elementwise ops, so it exists at every length. With interpolation_factor
s > 1, PE(pos / s): position interpolation (Chen et al. 2023) carried over from RoPE to the sinusoid, so
positions up to s L fall within the phases seen in training at L.
"""

import dataclasses

import chex
import jax.numpy as jnp

from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require


@dataclasses.dataclass(frozen=True)
class SinusoidalSettings(Settings):
  sinusoidal_base: float = 10000.0  # the wavelength base: wavelengths 2 pi .. 2 pi base
  interpolation_factor: float = 1.0  # s: PE(pos / s), position interpolation for a longer context

  def check(self):
    require(self.sinusoidal_base > 1.0, 'position.sinusoidal_base', self.sinusoidal_base, 'a number > 1')
    require(self.interpolation_factor >= 1.0, 'position.interpolation_factor', self.interpolation_factor,
            'a number >= 1 (positions are read as pos / s)')


def sinusoidal_encoding(positions_BxL: chex.Array, dim: int, base: float = 10000.0) -> chex.Array:
  """PE for arbitrary positions (integers, or fractions when interpolated): B x L x dim, float32."""
  chex.assert_rank(positions_BxL, 2)
  pair_index = jnp.arange((dim + 1) // 2, dtype=jnp.float32)
  inverse_wavelength = base ** (-2.0 * pair_index / dim)
  angle_BxLxP = positions_BxL.astype(jnp.float32)[..., None] * inverse_wavelength
  interleaved = jnp.stack([jnp.sin(angle_BxLxP), jnp.cos(angle_BxLxP)], axis=-1)
  encoding = interleaved.reshape(*angle_BxLxP.shape[:-1], -1)[..., :dim]
  chex.assert_shape(encoding, (*positions_BxL.shape, dim))
  return encoding


def sinusoidal_table(length: int, dim: int, base: float = 10000.0) -> chex.Array:
  """The L x dim table PE(0..L-1)."""
  return sinusoidal_encoding(jnp.arange(length)[None], dim, base)[0]


class Sinusoidal(StackPositions):
  """x + PE(pos)."""

  def embed(self, x_BxLxD, positions_BxL):
    factor = self.settings.interpolation_factor
    positions = positions_BxL if factor == 1.0 else positions_BxL.astype(jnp.float32) / factor
    encoding = sinusoidal_encoding(positions, x_BxLxD.shape[-1], self.settings.sinusoidal_base)
    return x_BxLxD + encoding.astype(x_BxLxD.dtype)


VARIANT = Variant(Sinusoidal, LayerPositions, 'Vaswani et al. 2017', SinusoidalSettings)
