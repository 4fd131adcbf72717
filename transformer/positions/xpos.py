"""xPos, extrapolatable position embedding (Sun et al. 2022, "A Length-Extrapolatable Transformer"),
as torchscale's reference code computes it: RoPE whose rotated pairs also decay with distance.

Pair p of a query at position n and of a key at position m (d the head width):
  q_n -> R(n) q_n * zeta_p^((n - c) / gamma),   k_m -> R(m) k_m * zeta_p^(-(m - c) / gamma),
  zeta_p = (2p/d + 0.4) / 1.4 in (0.29, 1),     gamma the scale base (512),
so q_n . k_m sums the RoPE terms of pair p times zeta_p^((n - m) / gamma): attention to keys further
back is damped, more in the low pairs. The centre c cancels in the product; it only keeps both factors
near 1. torchscale centres at half of each call's length, which moves when a cache grows, so cached
decoding would scale its keys differently from the full pass; here c is a fixed setting
(xpos_center), and the factors stay finite in float32 for |n - c| below about 70 gamma.
Causal only: for keys after the query (n < m) the factor grows instead of decaying. A context extension
(extension.py) acts on the rotation's frequencies; the decay stays by position.
"""

import dataclasses
import math

import chex
import jax.numpy as jnp

from transformer.positions.base import StackPositions, Variant, require
from transformer.positions.extension import ExtensionSettings
from transformer.positions.rope import RotaryLayer, rope_frequencies

ZETA_MIN = 0.4 / 1.4  # zeta_0, the fastest decay
MAX_EXPONENT = 55  # |n - c| / gamma at most this: (1 / zeta_0)^55 = 1e30, room below float32's 3e38 for q . k


@dataclasses.dataclass(frozen=True)
class XposSettings(ExtensionSettings):
  rope_base: float = 10000.0       # theta_p = base^(-2p/d), as RoPE
  xpos_scale_base: float = 512.0   # gamma: distances are damped by zeta_p^(distance / gamma)
  xpos_center: int = 0             # c: the position where both factors are 1

  def check(self):
    super().check()
    require(self.rope_base > 1.0, 'position.rope_base', self.rope_base, 'a number > 1')
    require(self.xpos_scale_base > 0, 'position.xpos_scale_base', self.xpos_scale_base, 'a positive number')

  def check_positions(self, largest):
    reach = max(abs(largest - self.xpos_center), abs(self.xpos_center))
    require(reach / self.xpos_scale_base <= MAX_EXPONENT, 'position.xpos_scale_base', self.xpos_scale_base,
            f'at least {math.ceil(reach / MAX_EXPONENT)} for positions up to {largest} with xpos_center='
            f'{self.xpos_center}: the scales zeta^(+-(n - c) / gamma) reach {1 / ZETA_MIN:.2f}^{MAX_EXPONENT} = '
            f'{(1 / ZETA_MIN) ** MAX_EXPONENT:.0e} at (n - c) / gamma = {MAX_EXPONENT}, and float32 ends at 3e38')

  def check_attention(self, num_heads, head_dim, causal):
    super().check_attention(num_heads, head_dim, causal)
    require(head_dim % 2 == 0, 'model_dim', num_heads * head_dim,
            f'model_dim / num_heads even (now {head_dim}), since xpos rotates pairs of dimensions')


def xpos_decay(head_dim: int) -> chex.Array:
  """zeta_p = (2p/d + 0.4) / 1.4 for the d / 2 pairs, float32."""
  return (2.0 * jnp.arange(head_dim // 2, dtype=jnp.float32) / head_dim + 0.4) / 1.4


def xpos_scale(positions_BxL: chex.Array, head_dim: int, scale_base: float, center: int,
               sign: float = 1.0) -> chex.Array:
  """zeta_p^(sign (n - c) / gamma): B x L x P, float32 (sign -1 for keys)."""
  exponent_BxLx1 = sign * (positions_BxL.astype(jnp.float32)[..., None] - center) / scale_base
  return xpos_decay(head_dim) ** exponent_BxLx1


class Xpos(RotaryLayer):
  """Rotates queries and keys as RoPE, and scales them by zeta^(+-(position - c) / gamma)."""

  def frequencies(self, head_dim):
    return rope_frequencies(head_dim, self.settings.rope_base)

  def position_scales(self, q_positions_BxLq, k_positions_BxLk, head_dim):
    settings = self.settings
    return (xpos_scale(q_positions_BxLq, head_dim, settings.xpos_scale_base, settings.xpos_center),
            xpos_scale(k_positions_BxLk, head_dim, settings.xpos_scale_base, settings.xpos_center, sign=-1.0))


VARIANT = Variant(StackPositions, Xpos, 'Sun et al. 2022 (xPos)', XposSettings, shift_invariant=True,
                  causal_only=True)
