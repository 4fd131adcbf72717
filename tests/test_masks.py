import jax.numpy as jnp
import numpy as np

from transformer import causal_mask, cross_attention_mask, padding_mask, self_attention_mask


def test_causal_mask_is_lower_triangle():
  expected = np.array([[i >= j for j in range(4)] for i in range(4)])
  np.testing.assert_array_equal(causal_mask(4)[0, 0], expected)
  assert causal_mask(4).shape == (1, 1, 4, 4)


def test_padding_mask_hides_padded_keys():
  valid = jnp.array([[1, 1, 0], [1, 1, 1]])
  mask = padding_mask(valid)
  assert mask.shape == (2, 1, 1, 3)
  np.testing.assert_array_equal(mask[:, 0, 0], valid.astype(bool))


def test_self_attention_mask_combines_causal_and_padding():
  valid = jnp.array([[1, 1, 1, 0]])
  mask = jnp.broadcast_to(self_attention_mask(valid, 4, causal=True), (1, 1, 4, 4))[0, 0]
  expected = np.array([[j <= i and j < 3 for j in range(4)] for i in range(4)])
  np.testing.assert_array_equal(mask, expected)
  encoder = jnp.broadcast_to(self_attention_mask(valid, 4, causal=False), (1, 1, 4, 4))[0, 0]
  np.testing.assert_array_equal(encoder, np.array([[j < 3 for j in range(4)]] * 4))
  assert self_attention_mask(None, 4, causal=False) is None


def test_cross_attention_mask_is_source_padding():
  source_valid = jnp.array([[1, 0]])
  np.testing.assert_array_equal(cross_attention_mask(source_valid)[0, 0, 0], [True, False])
  assert cross_attention_mask(None) is None
