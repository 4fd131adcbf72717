"""Learned absolute positions (Gehring et al. 2017; BERT, GPT-2): x + P[pos], P a max_length x d table.

It knows nothing beyond max_length: a longer sequence raises before tracing rather than clamping
or reading garbage rows. With interpolation_factor s > 1 position pos reads the table at pos / s,
linearly between the rows either side (position interpolation, Chen et al. 2023, carried over to a
table), so (max_length - 1) s + 1 positions fit.
"""

import dataclasses
import math
from typing import Optional

import chex
import flax.linen as nn
import jax.numpy as jnp

from transformer.layers import parameter
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require


@dataclasses.dataclass(frozen=True)
class LearnedSettings(Settings):
  max_length: int = 512  # rows of the table: the longest sequence the model can read
  interpolation_factor: float = 1.0  # s: position pos reads row pos / s, interpolated between rows

  def check(self):
    require(self.max_length > 0, 'position.max_length', self.max_length, 'a positive integer')
    require(self.interpolation_factor >= 1.0, 'position.interpolation_factor', self.interpolation_factor,
            'a number >= 1 (positions are read as pos / s)')

  def longest_sequence(self) -> Optional[int]:
    return int(math.floor((self.max_length - 1) * self.interpolation_factor)) + 1


def check_length_fits(length: int, max_length: int, what: str = 'learned position table') -> None:
  if length > max_length:
    raise ValueError(
        f'sequence length {length} is longer than the {what} ({max_length} rows); learned absolute '
        f'positions cannot extrapolate: raise model.position.max_length to at least {length}, '
        f'or evaluate at lengths <= {max_length}')


class Learned(StackPositions):
  """x + P[pos]."""

  def setup(self):
    self.table = parameter(self, 'table', nn.initializers.normal(stddev=0.02),
                           (self.settings.max_length, self.model_dim))

  def embed(self, x_BxLxD, positions_BxL):
    chex.assert_rank(positions_BxL, 2)
    check_length_fits(positions_BxL.shape[1], self.settings.longest_sequence())
    factor = self.settings.interpolation_factor
    if factor == 1.0:
      return x_BxLxD + self.table[positions_BxL].astype(x_BxLxD.dtype)
    scaled_BxL = positions_BxL.astype(jnp.float32) / factor
    below_BxL = jnp.floor(scaled_BxL).astype(jnp.int32)
    above_BxL = jnp.minimum(below_BxL + 1, self.settings.max_length - 1)
    fraction_BxLx1 = (scaled_BxL - below_BxL)[..., None]
    rows = self.table[below_BxL] * (1.0 - fraction_BxLx1) + self.table[above_BxL] * fraction_BxLx1
    return x_BxLxD + rows.astype(x_BxLxD.dtype)


VARIANT = Variant(Learned, LayerPositions, 'Gehring et al. 2017', LearnedSettings)
