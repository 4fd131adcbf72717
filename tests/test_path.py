"""PaTH attention (transformer/positions/path.py) beyond the shared suite: the O(L^2 d) carried-query form
against the product of reflections formed matrix by matrix, flash-linear-attention's reference on the same
numbers, and the reflections' properties."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers import fla_reference
from transformer.attention import scaled_dot_product_attention
from transformer.masks import causal_mask
from transformer.positions import path


def _inputs(length=24, heads=2, head_dim=8, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  q, k, v = (jax.random.normal(key, (1, length, heads, head_dim)) for key in keys[:3])
  w = jax.random.normal(keys[3], (1, length, heads, head_dim))
  w = w / jnp.linalg.norm(w, axis=-1, keepdims=True)
  beta = 2.0 * jax.nn.sigmoid(jax.random.normal(keys[4], (1, length, heads)))
  return q, k, v, w, beta


def _carried(q, k, w, beta):
  index = jnp.arange(q.shape[1])[None]
  return path.reflected_logits(q, k, jnp.transpose(w, (0, 2, 3, 1)), jnp.transpose(beta, (0, 2, 1)), index, index)


def test_the_carried_form_is_the_product_of_reflections():
  """Every (i, j <= i): q_i^T H_i ... H_{j+1} k_j with each d x d matrix formed (jnp, float32)."""
  q, k, _, w, beta = _inputs()
  ours = _carried(q, k, w, beta)
  eye = jnp.eye(q.shape[-1])
  for h in range(q.shape[2]):
    reflections = eye - beta[0, :, h, None, None] * jnp.einsum('sa,sb->sab', w[0, :, h], w[0, :, h])
    for i in range(q.shape[1]):
      product = eye
      for j in range(i, -1, -1):
        expected = q[0, i, h] @ product @ k[0, j, h]
        np.testing.assert_allclose(ours[0, h, i, j], expected, rtol=1e-4, atol=1e-4)
        product = product @ reflections[j]


def test_reflections_keep_lengths_when_beta_is_two_and_vanish_when_zero():
  """beta = 2: each H is orthogonal, so |q^T P k| <= |q| |k|; beta = 0: H = I and the logits are q . k."""
  q, k, _, w, _ = _inputs(seed=1)
  flipped = _carried(q, k, w, jnp.full(w.shape[:3], 2.0))
  bound = jnp.einsum('bqh,bsh->bhqs', jnp.linalg.norm(q, axis=-1), jnp.linalg.norm(k, axis=-1))
  assert bool(jnp.all(jnp.tril(jnp.abs(flipped) - bound) <= 1e-4))
  identity = _carried(q, k, w, jnp.zeros(w.shape[:3]))
  np.testing.assert_allclose(jnp.tril(identity[0, 0]), jnp.tril(jnp.einsum('qk,sk->qs', q[0, :, 0], k[0, :, 0])),
                             atol=1e-5)


def test_outputs_are_flash_linear_attentions_reference():
  """fla-core's naive_path_attn (chunked by 16, with the UT transform) on the same q, k, v, w, beta, no
  forget gate, length 40 (with the `[peer]` extra and fla-core)."""
  torch, naive_path_attn = fla_reference('path_attn', 'naive_path_attn')
  q, k, v, w, beta = _inputs(length=40, heads=2, head_dim=16, seed=2)
  theirs = naive_path_attn(*(torch.from_numpy(np.asarray(x).copy()) for x in (q, k, v, w, beta)),
                                  g=torch.zeros(1, 40, 2), scale=0.25, chunk_size=16)
  ours = scaled_dot_product_attention(q, k, v, mask=causal_mask(40), scale=0.25,
                                      bias=0.25 * (_carried(q, k, w, beta) - jnp.einsum('bqhk,bshk->bhqs', q, k)))
  np.testing.assert_allclose(ours, theirs.numpy(), atol=2e-5, rtol=1e-4)
