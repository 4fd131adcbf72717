"""Learned absolute positions (Gehring et al. 2017; BERT, GPT-2): x + P[pos], P a max_length x d table.

It knows nothing beyond max_length: a longer sequence raises before tracing rather than clamping
or reading garbage rows.
"""

import dataclasses
from typing import Optional

import chex
import flax.linen as nn

from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require


@dataclasses.dataclass(frozen=True)
class LearnedSettings(Settings):
  max_length: int = 512  # rows of the table: the longest sequence the model can read

  def check(self):
    require(self.max_length > 0, 'position.max_length', self.max_length, 'a positive integer')

  def longest_sequence(self) -> Optional[int]:
    return self.max_length


def check_length_fits(length: int, max_length: int, what: str = 'learned position table') -> None:
  if length > max_length:
    raise ValueError(
        f'sequence length {length} is longer than the {what} ({max_length} rows); learned absolute '
        f'positions cannot extrapolate: raise model.position.max_length to at least {length}, '
        f'or evaluate at lengths <= {max_length}')


class Learned(StackPositions):
  """x + P[pos]."""

  def setup(self):
    self.table = self.param('table', nn.initializers.normal(stddev=0.02),
                            (self.config.max_length, self.model_dim))

  def embed(self, x_BxLxD, positions_BxL):
    chex.assert_rank(positions_BxL, 2)
    check_length_fits(positions_BxL.shape[1], self.config.max_length)
    return x_BxLxD + self.table[positions_BxL].astype(x_BxLxD.dtype)


VARIANT = Variant(Learned, LayerPositions, 'Gehring et al. 2017', LearnedSettings)
