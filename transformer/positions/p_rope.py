"""Partial rotation: RoPE on a fraction of each head's pairs of dimensions, the rest left as they are.

Two forms are in use, chosen by rotary_frequencies (d the head width, n = floor(fraction d / 2) the
rotated pairs, pair p made of dimensions 2p and 2p + 1):
  'truncated'  p-RoPE (Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional
               Encodings useful?"): RoPE's own frequencies theta_p = base^(-2p/d) for the n highest
               (p < n); the lowest-frequency pairs are not rotated (theta_p = 0), so they carry
               content free of position at every distance.
  'rescaled'   GPT-NeoX's rotary_pct (the partial_rotary_factor of current models): the first 2n
               dimensions are a RoPE of width 2n, theta_p = base^(-2p/(2n)) for p < n; the rest are not
               rotated. (GPT-NeoX rotates halves, not interleaved pairs: the same up to a permutation of
               dimensions, which the projections absorb.)
Either way q_m . k_n still depends on m - n only. A context extension (extension.py) acts on the rotated
pairs' frequencies.
"""

import dataclasses
import math

import chex
import jax.numpy as jnp

from transformer.positions.base import StackPositions, Variant, require
from transformer.positions.extension import ExtensionSettings
from transformer.positions.rope import RotaryLayer, rotate_by

FREQUENCIES = ('truncated', 'rescaled')


@dataclasses.dataclass(frozen=True)
class PartialRopeSettings(ExtensionSettings):
  rope_base: float = 10000.0            # theta_p = base^(-2p/d) ('truncated') or base^(-2p/(2n)) ('rescaled')
  rotary_fraction: float = 0.25         # of each head's pairs rotated: n = floor(fraction d / 2)
  rotary_frequencies: str = 'truncated'  # 'truncated' (p-RoPE) or 'rescaled' (GPT-NeoX's rotary_pct)

  def check(self):
    super().check()
    require(self.rope_base > 1.0, 'position.rope_base', self.rope_base, 'a number > 1')
    require(0.0 < self.rotary_fraction <= 1.0, 'position.rotary_fraction', self.rotary_fraction,
            'a fraction in (0, 1]')
    require(self.rotary_frequencies in FREQUENCIES, 'position.rotary_frequencies', self.rotary_frequencies,
            ', '.join(FREQUENCIES))

  def check_attention(self, num_heads, head_dim, causal):
    super().check_attention(num_heads, head_dim, causal)
    require(head_dim % 2 == 0, 'model_dim', num_heads * head_dim,
            f'model_dim / num_heads even (now {head_dim}), since p_rope rotates pairs of dimensions')
    require(rotated_pairs(head_dim, self.rotary_fraction) >= 1, 'position.rotary_fraction', self.rotary_fraction,
            f'at least 2 / head_dim = {2 / head_dim:g} (head_dim {head_dim}), so that one pair is rotated')


def rotated_pairs(head_dim: int, fraction: float) -> int:
  """n = floor(fraction d / 2), with a tolerance for fractions such as 0.3 that floats store just below."""
  return int(math.floor(fraction * head_dim / 2 + 1e-9))


def partial_frequencies(head_dim: int, base: float, fraction: float, scheme: str) -> chex.Array:
  """theta_p for the d / 2 pairs: the n rotated ones first, then zeros. float32."""
  pairs = rotated_pairs(head_dim, fraction)
  width = head_dim if scheme == 'truncated' else 2 * pairs
  rotated = base ** (-2.0 * jnp.arange(pairs, dtype=jnp.float32) / width)
  return jnp.concatenate([rotated, jnp.zeros(head_dim // 2 - pairs, jnp.float32)])


class PartialRope(RotaryLayer):
  """Rotates the first n pairs of queries and keys."""

  def frequencies(self, head_dim):
    settings = self.settings
    return partial_frequencies(head_dim, settings.rope_base, settings.rotary_fraction, settings.rotary_frequencies)


VARIANT = Variant(StackPositions, PartialRope, 'Barbero et al. 2025 (p-RoPE)', PartialRopeSettings,
                  shift_invariant=True)
