"""Transformer-XL's two ways of computing its position term: by distance (consecutive positions) and
through sin/cos of each position (any positions), against the term formed pair by pair."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.positions import transformer_xl as txl

B, H, K, D = 2, 3, 4, 12


def _pairwise(query_plus_v, projection, q_positions, k_positions, base):
  """(q_i + v) . W_R R_{i-j} for every (i, j): R formed for each pair's distance."""
  distances = np.asarray(q_positions)[0][:, None] - np.asarray(k_positions)[0][None, :]
  relative = np.asarray(txl.relative_sinusoid(jnp.asarray(distances.reshape(-1)), D, base)).reshape(
      *distances.shape, D)
  r = np.einsum('qkd,dhc->qkhc', relative, np.asarray(projection))
  return np.einsum('bqhc,qkhc->bhqk', np.asarray(query_plus_v), r)


@pytest.mark.parametrize('q_positions,k_positions', [
    (range(5), range(5)), (range(7, 9), range(10)), ([3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5])])
def test_both_forms_equal_the_pairwise_term(q_positions, k_positions):
  q_pos, k_pos = jnp.asarray([list(q_positions)]), jnp.asarray([list(k_positions)])
  query = jax.random.normal(jax.random.PRNGKey(0), (B, q_pos.shape[1], H, K))
  projection = jax.random.normal(jax.random.PRNGKey(1), (D, H, K))
  expected = _pairwise(query, projection, q_pos, k_pos, 100.0)
  np.testing.assert_allclose(txl.position_term_any(query, projection, q_pos, k_pos, 100.0), expected,
                             atol=1e-4, rtol=1e-4)
  consecutive, offset = txl.contiguous_offset(q_pos, k_pos)
  if consecutive:
    np.testing.assert_allclose(txl.position_term_consecutive(query, projection, k_pos.shape[1], offset, 100.0),
                               expected, atol=1e-4, rtol=1e-4)
