import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import MultiHeadAttention, causal_mask, scaled_dot_product_attention

B, LQ, LK, H, K = 2, 5, 6, 3, 8


def _qkv(seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (jax.random.normal(keys[0], (B, LQ, H, K)), jax.random.normal(keys[1], (B, LK, H, K)),
          jax.random.normal(keys[2], (B, LK, H, K)))


def test_matches_jax_nn_dot_product_attention():
  q, k, v = _qkv()
  np.testing.assert_allclose(scaled_dot_product_attention(q, k, v), jax.nn.dot_product_attention(q, k, v),
                             atol=1e-5)


def test_matches_jax_with_mask():
  q, k, v = _qkv(1)
  mask = jax.random.bernoulli(jax.random.PRNGKey(9), 0.7, (B, 1, LQ, LK)).at[..., 0].set(True)
  np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, mask=mask),
                             jax.nn.dot_product_attention(q, k, v, mask=mask), atol=1e-5)


def test_matches_jax_with_bias_and_mask():
  q, k, v = _qkv(2)
  bias = jax.random.normal(jax.random.PRNGKey(3), (B, H, LQ, LK))
  mask = jnp.broadcast_to(causal_mask(LK)[..., :LQ, :], (B, H, LQ, LK))
  np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, bias=bias),
                             jax.nn.dot_product_attention(q, k, v, bias=bias), atol=1e-5)
  np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, bias=bias, mask=mask),
                             jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask), atol=1e-5)


def test_returns_weights_that_match_the_formula():
  q, k, v = _qkv(4)
  out, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
  logits = np.einsum('bqhk,bshk->bhqs', q, k) / np.sqrt(K)
  expected = np.exp(logits - logits.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(weights, expected, atol=1e-5)
  np.testing.assert_allclose(out, np.einsum('bhqs,bshv->bqhv', expected, v), atol=1e-5)


def test_fully_masked_query_row_outputs_zeros():
  q, k, v = _qkv(5)
  mask = jnp.ones((B, 1, LQ, LK), bool).at[:, :, 0].set(False)
  out = scaled_dot_product_attention(q, k, v, mask=mask)
  np.testing.assert_array_equal(out[:, 0], 0.0)
  assert bool(jnp.all(jnp.isfinite(out)))


def test_rejects_mismatched_shapes():
  q, k, v = _qkv()
  with pytest.raises(AssertionError):
    scaled_dot_product_attention(q[..., :4], k, v)
  with pytest.raises(AssertionError):
    scaled_dot_product_attention(q[0], k[0], v[0])


@pytest.mark.parametrize('head_dim', [0, 3 * K])  # 0: width / heads; heads wider than that (Gemma 3, Qwen3)
def test_multi_head_attention_matches_flax_with_copied_weights(head_dim):
  width = H * K
  heads_width = H * (head_dim or K)
  x = jax.random.normal(jax.random.PRNGKey(0), (B, LQ, width))
  memory = jax.random.normal(jax.random.PRNGKey(1), (B, LK, width))
  mask = jax.random.bernoulli(jax.random.PRNGKey(2), 0.8, (B, 1, LQ, LK)).at[..., 0].set(True)
  reference = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=heads_width, out_features=width)
  reference_params = nn.meta.unbox(reference.init(jax.random.PRNGKey(3), x, memory)['params'])
  copied = {
      name: {'kernel': reference_params[name]['kernel'].reshape(width, heads_width),
             'bias': reference_params[name]['bias'].reshape(heads_width)}
      for name in ('query', 'key', 'value')
  }
  copied['out'] = {'kernel': reference_params['out']['kernel'].reshape(heads_width, width),
                   'bias': reference_params['out']['bias']}
  ours = MultiHeadAttention(num_heads=H, head_dim=head_dim).apply({'params': copied}, x, memory, mask=mask)
  theirs = reference.apply({'params': reference_params}, x, memory, mask=mask)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_self_attention_fuses_its_projections_into_one_matmul_with_the_same_result():
  """Self-attention (the same array as queries and keys) projects with one D x 3D matmul; the
  result, the gradients and the parameter names equal three separate projections' (the path a
  distinct but equal key array takes)."""
  width = H * K
  x = jax.random.normal(jax.random.PRNGKey(0), (B, LQ, width))
  module = MultiHeadAttention(num_heads=H)
  params = nn.meta.unbox(module.init(jax.random.PRNGKey(1), x, x)['params'])
  assert sorted(params) == ['key', 'out', 'query', 'value']
  assert params['query']['kernel'].shape == (width, width)
  fused = lambda p: module.apply({'params': p}, x, x, mask=causal_mask(LQ))
  separate = lambda p: module.apply({'params': p}, x, x + 0.0, mask=causal_mask(LQ))
  matmuls = lambda attend: str(jax.make_jaxpr(attend)(params)).count('dot_general')
  assert matmuls(separate) - matmuls(fused) == 2  # q, k and v in one matmul instead of three
  np.testing.assert_allclose(fused(params), separate(params), atol=1e-5)
  loss = lambda attend: lambda p: jnp.sum(jnp.sin(attend(p)))
  for got, expected in zip(jax.tree_util.tree_leaves(jax.grad(loss(fused))(params)),
                           jax.tree_util.tree_leaves(jax.grad(loss(separate))(params))):
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_multi_head_attention_rejects_width_not_divisible_by_heads():
  with pytest.raises(ValueError, match='not divisible by num_heads=3'):
    MultiHeadAttention(num_heads=3).init(jax.random.PRNGKey(0), jnp.ones((1, 2, 8)), jnp.ones((1, 2, 8)))
