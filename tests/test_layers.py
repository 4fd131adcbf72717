import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import (DecoderOnly, Embed, FeedForward, LayerNorm, PositionConfig, dropout, embedding_lookup,
                         feed_forward, layer_norm, linear, tiny_preset)


def test_linear_is_x_w_plus_b():
  x = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
  w = np.random.RandomState(1).randn(4, 5).astype(np.float32)
  b = np.random.RandomState(2).randn(5).astype(np.float32)
  expected = np.einsum('bli,io->blo', x, w) + b
  np.testing.assert_allclose(linear(x, w, b), expected, atol=1e-5)


def test_linear_rejects_wrong_width():
  with pytest.raises(AssertionError, match='4'):
    linear(jnp.ones((2, 3)), jnp.ones((4, 5)))


def test_embedding_is_a_gather_equal_to_one_hot_matmul():
  table = jax.random.normal(jax.random.PRNGKey(0), (11, 6))
  ids = jnp.array([[0, 3, 10], [5, 5, 1]])
  np.testing.assert_allclose(embedding_lookup(table, ids), jax.nn.one_hot(ids, 11) @ table, atol=1e-6)
  primitives = {eq.primitive.name for eq in jax.make_jaxpr(embedding_lookup)(table, ids).eqns}
  assert 'gather' in primitives and 'dot_general' not in primitives, primitives


def test_embed_module_attend_is_transpose_of_table():
  module = Embed(7, 4)
  params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32)))
  x = jnp.ones((1, 2, 4))
  table = params['params']['embedding']
  np.testing.assert_allclose(module.apply(params, x, method=Embed.attend), x @ table.T, atol=1e-6)


def test_layer_norm_matches_flax():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 8)) * 3 + 1
  scale = jax.random.normal(jax.random.PRNGKey(1), (8,))
  offset = jax.random.normal(jax.random.PRNGKey(2), (8,))
  reference = nn.LayerNorm(epsilon=1e-6).apply({'params': {'scale': scale, 'bias': offset}}, x)
  np.testing.assert_allclose(layer_norm(x, scale, offset, 1e-6), reference, atol=1e-5)
  ours = LayerNorm(1e-6).apply({'params': {'scale': scale, 'bias': offset}}, x)
  np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_layer_norm_uses_biased_variance():
  x = jnp.array([[1.0, 3.0]])  # mean 2, biased variance 1 (unbiased would be 2)
  np.testing.assert_allclose(layer_norm(x, jnp.ones(2), jnp.zeros(2), eps=0.0), [[-1.0, 1.0]], atol=1e-6)


def test_dropout_identity_when_deterministic_and_unbiased_in_training():
  x = jnp.ones((200, 200))
  assert dropout(x, 0.3, None, deterministic=True) is x
  y = dropout(x, 0.3, jax.random.PRNGKey(0), deterministic=False)
  zero_fraction = float(jnp.mean(y == 0))
  assert 0.28 < zero_fraction < 0.32
  np.testing.assert_allclose(float(jnp.mean(y)), 1.0, atol=0.02)
  np.testing.assert_allclose(float(y.max()), 1 / 0.7, rtol=1e-6)
  with pytest.raises(ValueError, match='rate'):
    dropout(x, 1.0, jax.random.PRNGKey(0), deterministic=False)


@pytest.mark.parametrize('activation,function', [('relu', lambda h: np.maximum(h, 0)),
                                                 ('gelu', lambda h: jax.nn.gelu(h))])
def test_feed_forward_matches_formula(activation, function):
  rng = np.random.RandomState(0)
  x, w1, b1 = rng.randn(2, 3, 4), rng.randn(4, 8), rng.randn(8)
  w2, b2 = rng.randn(8, 4), rng.randn(4)
  x, w1, b1, w2, b2 = (a.astype(np.float32) for a in (x, w1, b1, w2, b2))
  expected = np.asarray(function(x @ w1 + b1)) @ w2 + b2
  np.testing.assert_allclose(feed_forward(x, w1, b1, w2, b2, activation), expected, atol=1e-4)
  module = FeedForward(8, activation)
  params = {'params': dict(hidden_kernel=w1, hidden_bias=b1, output_kernel=w2, output_bias=b2)}
  np.testing.assert_allclose(module.apply(params, x), expected, atol=1e-4)


def test_feed_forward_rejects_unknown_activation():
  with pytest.raises(ValueError, match="activation: got 'swish'"):
    feed_forward(jnp.ones((1, 2)), jnp.ones((2, 3)), jnp.ones(3), jnp.ones((3, 2)), jnp.ones(2), 'swish')


def test_a_parameter_of_another_shape_is_refused_with_its_name_path_and_both_shapes():
  """Applying a model to parameters made for other sizes (a wider model's kernel, a longer learned table) fails
  at the first such parameter instead of computing with it; one that is absent is refused too."""
  inputs = jnp.ones((1, 5), jnp.int32)
  small = DecoderOnly(tiny_preset(PositionConfig(kind='learned', max_length=8)))
  params = nn.meta.unbox(small.init(jax.random.PRNGKey(0), inputs))
  longer = DecoderOnly(tiny_preset(PositionConfig(kind='learned', max_length=16)))
  with pytest.raises(flax.errors.ScopeParamShapeError, match=r'"table" in "/decoder/position".*\(16, 32\).*\(8, 32\)'):
    longer.apply(params, inputs)
  wider_feed_forward = DecoderOnly(tiny_preset(PositionConfig(kind='learned', max_length=8), feed_forward_dim=96))
  with pytest.raises(flax.errors.ScopeParamShapeError, match='"hidden_kernel" in "/decoder/layer_0/feed_forward"'):
    wider_feed_forward.apply(params, inputs)
  without_scale = {'params': {'bias': jnp.zeros(4)}}
  with pytest.raises(flax.errors.ScopeParamNotFoundError, match='"scale"'):
    LayerNorm().apply(without_scale, jnp.ones((2, 4)))
