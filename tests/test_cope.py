"""CoPE's own claims: with every gate open the contextual position is the count of keys from j to i
(i - j + 1, relative positions again), the clamp at P - 1, and the interpolation between integers."""

import jax.numpy as jnp
import numpy as np

from transformer.positions import cope


def test_open_gates_count_the_keys_and_the_clamp_holds():
  length = 6
  query = jnp.ones((1, length, 1, 2)) * 100.0  # q.k = 2e4 * scale: sigmoid 1
  key = jnp.ones((1, length, 1, 2)) * 100.0
  allowed = jnp.tril(jnp.ones((length, length), bool))[None]
  positions = np.asarray(cope.contextual_positions(query, key, allowed, 1.0, max_positions=100))[0, 0]
  expected = np.tril(np.arange(length)[:, None] - np.arange(length)[None, :] + 1)
  np.testing.assert_allclose(positions, expected, atol=1e-6)
  clamped = np.asarray(cope.contextual_positions(query, key, allowed, 1.0, max_positions=3))[0, 0]
  np.testing.assert_allclose(clamped, np.minimum(expected, 2), atol=1e-6)


def test_interpolation_between_integer_positions():
  query = jnp.asarray([[[[1.0, 2.0]]]])  # B x Lq x H x K = 1 x 1 x 1 x 2
  embeddings = jnp.asarray([[0.0, 1.0, 3.0], [0.0, 0.0, 1.0]])  # K x P: z[p] = q.e[p] = 0, 1, 5
  positions = jnp.asarray([0.0, 0.5, 1.0, 1.25, 2.0])[None, None, None]
  np.testing.assert_allclose(cope.interpolated_term(query, embeddings, positions)[0, 0, 0],
                             [0.0, 0.5, 1.0, 2.0, 5.0], atol=1e-6)
