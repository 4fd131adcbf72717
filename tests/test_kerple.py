"""KERPLE's own claims beyond the shared suite: the kernels' values at known distances, the clamps of
r1 and r2 (forward clamped, gradient passed through), and a finite gradient of the power kernel at
distance 0, where d^r has no derivative in r."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer.positions import kerple


def test_kernels_at_known_distances():
  distance = jnp.asarray([0.0, 1.0, 4.0])[None, None, None]  # B x 1 x Lq x Lk = 1 x 1 x 1 x 3
  r1, r2 = jnp.asarray([2.0]), jnp.asarray([0.5])
  np.testing.assert_allclose(kerple.kerple_log_bias(r1, r2, distance)[0, 0, 0],
                             [0.0, -2 * np.log(1.5), -2 * np.log(3.0)], rtol=1e-6)
  np.testing.assert_allclose(kerple.kerple_power_bias(r1, r2, distance)[0, 0, 0], [0.0, -2.0, -4.0], rtol=1e-6)


def test_distance_is_the_past_in_causal_attention_and_absolute_in_encoders():
  positions = jnp.arange(3)[None]
  np.testing.assert_array_equal(kerple.kerple_distance(positions, positions, causal=True)[0, 0],
                                [[0, 0, 0], [1, 0, 0], [2, 1, 0]])
  np.testing.assert_array_equal(kerple.kerple_distance(positions, positions, causal=False)[0, 0],
                                [[0, 1, 2], [1, 0, 1], [2, 1, 0]])


def test_clamps_take_the_value_and_pass_the_gradient():
  values = jnp.asarray([-1.0, 0.005, 0.5, 3.0])
  np.testing.assert_allclose(kerple.straight_through_clip(values, 0.01, 2.0), [0.01, 0.01, 0.5, 2.0], rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(kerple.straight_through_clip(v, 0.01, 2.0) * 3.0))(values),
                             [3.0, 3.0, 3.0, 3.0])


def test_power_kernel_gradient_is_finite_at_distance_zero():
  distance = jnp.asarray([0.0, 2.0])[None, None, None]

  def total(r1, r2):
    return jnp.sum(kerple.kerple_power_bias(r1, r2, distance))

  grads = jax.grad(total, argnums=(0, 1))(jnp.asarray([1.0]), jnp.asarray([1.5]))
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
  np.testing.assert_allclose(grads[1], [-(2.0 ** 1.5) * np.log(2.0)], rtol=1e-5)  # d/dr (-d^r) at d = 2
