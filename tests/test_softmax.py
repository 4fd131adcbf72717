import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import softmax


def test_matches_jax_nn_softmax():
  logits = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 7)) * 4
  np.testing.assert_allclose(softmax(logits), jax.nn.softmax(logits), atol=1e-5, rtol=0)


@pytest.mark.parametrize('magnitude', [1e4, -1e4])
def test_stable_at_huge_logits(magnitude):
  logits = jnp.array([[magnitude, magnitude - 1.0, 0.0, magnitude - 3.0]])
  weights = softmax(logits)
  assert bool(jnp.all(jnp.isfinite(weights)))
  np.testing.assert_allclose(weights, jax.nn.softmax(logits), atol=1e-5, rtol=0)
  np.testing.assert_allclose(jnp.sum(weights), 1.0, atol=1e-6)


def test_naive_softmax_would_overflow_where_ours_does_not():
  logits = jnp.array([1e4, 0.0])
  naive = jnp.exp(logits) / jnp.sum(jnp.exp(logits))
  assert bool(jnp.isnan(naive).any())
  np.testing.assert_allclose(softmax(logits), [1.0, 0.0], atol=1e-7)


def test_masked_entries_get_zero_weight_and_rest_renormalise():
  logits = jnp.array([[1.0, 2.0, 3.0, 4.0]])
  mask = jnp.array([[True, False, True, False]])
  expected = jax.nn.softmax(jnp.array([1.0, 3.0]))
  np.testing.assert_allclose(softmax(logits, mask), [[expected[0], 0.0, expected[1], 0.0]], atol=1e-6)


def test_fully_masked_row_gives_zeros_not_nan():
  logits = jnp.array([[1.0, 2.0], [3.0, 4.0]])
  mask = jnp.array([[False, False], [True, True]])
  weights = softmax(logits, mask)
  np.testing.assert_array_equal(weights[0], [0.0, 0.0])
  np.testing.assert_allclose(weights[1], jax.nn.softmax(logits[1]), atol=1e-6)
  readout = jnp.array([[1.0, 2.0], [3.0, 5.0]])  # weighted: a row's plain sum is 1, whose gradient is 0
  gradient = jax.grad(lambda x: (softmax(x, mask) * readout).sum())(logits)
  assert bool(jnp.all(jnp.isfinite(gradient)))
  np.testing.assert_array_equal(gradient[0], [0.0, 0.0])
  expected = jax.grad(lambda x: (jax.nn.softmax(x) * readout[1]).sum())(logits[1])
  np.testing.assert_allclose(gradient[1], expected, rtol=1e-6)
