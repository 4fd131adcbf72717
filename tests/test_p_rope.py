"""Partial rotation's own claims: its frequencies worked by hand for both forms, a fraction of 1 is
RoPE exactly, the unrotated pairs pass through untouched, and too small a fraction is refused."""

import jax
import numpy as np
import pytest

import transformer as T
from transformer.positions import p_rope


def test_frequencies_worked_by_hand():
  # head_dim 8: 4 pairs; fraction 0.5 rotates 2. RoPE's: base^(-2p/8) = 1, 100^(-1/4); rescaled: base^(-2p/4) = 1, 1/10.
  np.testing.assert_allclose(p_rope.partial_frequencies(8, 100.0, 0.5, 'truncated'), [1.0, 100 ** -0.25, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(p_rope.partial_frequencies(8, 100.0, 0.5, 'rescaled'), [1.0, 0.1, 0, 0], rtol=1e-6)
  assert p_rope.rotated_pairs(10, 0.3) == 1  # floor(1.5)
  assert p_rope.rotated_pairs(20, 0.3) == 3  # 0.3 * 10 is stored as 2.9999...: still 3


def test_full_fraction_is_rope_and_unrotated_pairs_pass_through():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 3, 8))
  positions = np.arange(6)[None] + 11
  full = p_rope.rotate_by(x, positions, p_rope.partial_frequencies(8, 10000.0, 1.0, 'truncated'))
  np.testing.assert_allclose(full, T.positions.rotate(x, positions), atol=1e-6)
  half = p_rope.rotate_by(x, positions, p_rope.partial_frequencies(8, 10000.0, 0.5, 'truncated'))
  np.testing.assert_array_equal(half[..., 4:], x[..., 4:])
  np.testing.assert_allclose(half[..., :4], T.positions.rotate(x, positions)[..., :4], atol=1e-6)


def test_too_small_a_fraction_is_refused_naming_the_smallest():
  settings = T.PositionConfig('p_rope', rotary_fraction=0.2).settings
  with pytest.raises(ValueError, match=r'position.rotary_fraction: got 0.2; valid: at least 2 / head_dim = 0.25 \(head_dim 8\)'):
    settings.check_attention(num_heads=4, head_dim=8, causal=True)
  with pytest.raises(ValueError, match=r'position.rotary_frequencies: got .halves.; valid: truncated, rescaled'):
    T.PositionConfig('p_rope', rotary_frequencies='halves')
