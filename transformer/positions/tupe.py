"""TUPE, untied positional encoding (Ke, He and Liu 2021, "Rethinking Positional Encoding in
Language Pre-training", eq. 6-8).

Positions are not added to the words. Each self-attention layer computes
  alpha_ij = (x_i W^Q)(x_j W^K)^T / sqrt(2d)  +  (LN(p_i) U^Q)(LN(p_j) U^K)^T / sqrt(2d)
with per-head projections U^Q, U^K. The positional term does not depend on the layer's input, so it
is computed once per forward pass and the same array is handed to every layer. With a [CLS] token
at index 0 the positional term's CLS row becomes a learned per-head theta_1 and its CLS column
(below the first row) a learned theta_2, so [CLS] is not tied to position 0's neighbourhood.
`tupe_r` composes this term with a T5 relative bias (see __init__.py).
"""

import dataclasses
import math
from typing import Optional

import chex
import flax.linen as nn
import jax.numpy as jnp

from transformer.layers import layer_norm, parameter
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require
from transformer.positions.learned import check_length_fits
from transformer.positions.sinusoidal import sinusoidal_encoding


ABSOLUTE_TABLES = ('sinusoidal', 'learned')


@dataclasses.dataclass(frozen=True)
class TupeSettings(Settings):
  absolute_table: str = 'sinusoidal'  # p_i from a fixed sinusoidal table or a learned one
  max_length: int = 512               # rows of the learned table (absolute_table='learned')
  sinusoidal_base: float = 10000.0    # wavelength base of the sinusoidal table
  cls_reset: bool = True              # reset the [CLS] row and column (encoders with a [CLS] token)

  def check(self):
    require(self.absolute_table in ABSOLUTE_TABLES, 'position.absolute_table', self.absolute_table,
            ', '.join(ABSOLUTE_TABLES))
    require(self.max_length > 0, 'position.max_length', self.max_length, 'a positive integer')
    require(self.sinusoidal_base > 1.0, 'position.sinusoidal_base', self.sinusoidal_base, 'a number > 1')

  def longest_sequence(self) -> Optional[int]:
    return self.max_length if self.absolute_table == 'learned' else None


def tupe_scale(head_dim: int) -> float:
  return 1.0 / math.sqrt(2 * head_dim)


def untied_position_term(p_q_BxLqxD, p_k_BxLkxD, query_projection_DxHxK, key_projection_DxHxK,
                         scale: float) -> chex.Array:
  """(p_i U^Q_h)(p_j U^K_h)^T * scale: B x H x Lq x Lk (p already layer-normed)."""
  chex.assert_rank([query_projection_DxHxK, key_projection_DxHxK], 3)
  # Heads first, and the scale on the L x K factor: the L x L product and its gradient then need no
  # transposing copy.
  query_BxHxLqxK = jnp.einsum('bqd,dhk->bhqk', p_q_BxLqxD, query_projection_DxHxK) * scale
  key_BxHxLkxK = jnp.einsum('bsd,dhk->bhsk', p_k_BxLkxD, key_projection_DxHxK)
  return jnp.einsum('bhqk,bhsk->bhqs', query_BxHxLqxK, key_BxHxLkxK)


def reset_cls(term_BxHxLqxLk: chex.Array, theta_2xH: chex.Array) -> chex.Array:
  """Row 0 := theta_1 (from [CLS]), column 0 below row 0 := theta_2 (to [CLS]), per head."""
  theta_from_cls = theta_2xH[0][None, :, None]
  theta_to_cls = theta_2xH[1][None, :, None]
  term = term_BxHxLqxLk.at[:, :, 0, :].set(jnp.broadcast_to(theta_from_cls, term_BxHxLqxLk[:, :, 0, :].shape))
  return term.at[:, :, 1:, 0].set(jnp.broadcast_to(theta_to_cls, term[:, :, 1:, 0].shape))


class TupeStack(StackPositions):
  """Owns the absolute table (if learned), LN and U^Q, U^K; builds the term once per forward pass."""

  def setup(self):
    if self.settings.absolute_table == 'learned':
      self.table = parameter(self, 'table', nn.initializers.normal(stddev=0.02),
                             (self.settings.max_length, self.model_dim))
    self.norm_scale = parameter(self, 'norm_scale', nn.initializers.ones, (self.model_dim,))
    self.norm_offset = parameter(self, 'norm_offset', nn.initializers.zeros, (self.model_dim,))
    init = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal', in_axis=0, out_axis=(1, 2))
    shape = (self.model_dim, self.num_heads, self.head_dim)
    self.query_projection = parameter(self, 'query_projection', init, shape)
    self.key_projection = parameter(self, 'key_projection', init, shape)
    if self._resets_cls:
      self.cls_theta = parameter(self, 'cls_theta', nn.initializers.zeros, (2, self.num_heads))

  @property
  def _resets_cls(self) -> bool:
    return self.has_cls and self.settings.cls_reset

  def absolute(self, positions_BxL) -> chex.Array:
    """LN(p_i): B x L x D."""
    if self.settings.absolute_table == 'learned':
      check_length_fits(positions_BxL.shape[1], self.settings.max_length, "TUPE's learned table")
      p = self.table[positions_BxL]
    else:
      p = sinusoidal_encoding(positions_BxL, self.model_dim, self.settings.sinusoidal_base)
    return layer_norm(p, self.norm_scale, self.norm_offset)

  def shared(self, q_positions_BxLq, k_positions_BxLk):
    term = untied_position_term(self.absolute(q_positions_BxLq), self.absolute(k_positions_BxLk),
                                self.query_projection, self.key_projection, tupe_scale(self.head_dim))
    return reset_cls(term, self.cls_theta) if self._resets_cls else term


class TupeLayer(LayerPositions):
  """Adds the shared positional term and scales the content logits by 1/sqrt(2d)."""

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    return shared

  def scale(self):
    return tupe_scale(self.head_dim)


VARIANT = Variant(TupeStack, TupeLayer, 'Ke et al. 2021 (TUPE-A)', TupeSettings)
