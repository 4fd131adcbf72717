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


_reflected_logits = jax.jit(path.reflected_logits, static_argnames='chunk_size')


def _carried(q, k, w, beta, chunk_size=path.CHUNK_SIZE):
  index = jnp.arange(q.shape[1])[None]
  return _reflected_logits(q, k, jnp.transpose(w, (0, 2, 3, 1)), jnp.transpose(beta, (0, 2, 1)), index, index,
                               chunk_size=chunk_size)


def test_the_chunked_form_is_the_product_of_reflections():
  """Every (i, j <= i): q_i^T H_i ... H_{j+1} k_j with each d x d matrix formed (numpy, float64), against the
  chunked form with one key per chunk (the plain carry), chunks that leave padding (5 and 7 of 24), and one
  chunk of all the keys (the UT transform alone)."""
  q, k, _, w, beta = _inputs()
  q64, k64, w64, beta64 = (np.asarray(x, np.float64)[0] for x in (q, k, w, beta))
  length, heads, _ = q64.shape
  expected = np.zeros((heads, length, length))
  for h in range(heads):
    for i in range(length):
      carried = q64[i, h]
      for j in range(i, -1, -1):
        expected[h, i, j] = carried @ k64[j, h]
        carried = carried - beta64[j, h] * (carried @ w64[j, h]) * w64[j, h]  # q_i^T ... H_j, H_j symmetric
  causal = np.tril(np.ones((length, length), bool))
  for chunk_size in (1, 5, 7, length, 64):
    ours = np.asarray(_carried(q, k, w, beta, chunk_size=chunk_size))[0]
    np.testing.assert_allclose(ours[:, causal], expected[:, causal], rtol=1e-4, atol=1e-4, err_msg=str(chunk_size))


def test_a_prefix_of_the_keys_has_the_chunk_transforms_of_its_own_chunks():
  """A layer computes its chunks' T once and each block of queries takes the columns of its keys: the first m
  columns must be the T of the first m keys alone, m at a chunk's edge or inside one (the inverse's leading
  block), and the logits from them those computed from scratch."""
  q, k, _, w, beta = _inputs(length=40, seed=4)
  w_BxHxKxL, beta_BxHxL = jnp.transpose(w, (0, 2, 3, 1)), jnp.transpose(beta, (0, 2, 1))
  whole = path.chunk_transform_columns(w_BxHxKxL, beta_BxHxL, 16)
  assert whole.shape == (1, 2, 16, 40)
  index = jnp.arange(40)[None]
  for m in (5, 16, 21, 40):
    alone = path.chunk_transform_columns(w_BxHxKxL[..., :m], beta_BxHxL[..., :m], 16)
    np.testing.assert_allclose(np.asarray(whole[..., :m]), np.asarray(alone), atol=1e-5, err_msg=str(m))
    shared = path.reflected_logits(q[:, :m], k[:, :m], w_BxHxKxL[..., :m], beta_BxHxL[..., :m], index[:, :m],
                                   index[:, :m], transform_BxGxCxLk=whole[..., :m])
    causal = np.tril(np.ones((m, m), bool))
    np.testing.assert_allclose(np.asarray(shared)[0][:, causal],
                               np.asarray(_carried(q[:, :m], k[:, :m], w[:, :m], beta[:, :m], chunk_size=1))[0][:, causal],
                               rtol=1e-4, atol=1e-4, err_msg=str(m))


def test_queries_at_any_index_get_their_rows():
  """Decoding asks for a few queries against every key: the rows of those queries in the whole matrix."""
  q, k, _, w, beta = _inputs(length=37, seed=3)
  whole = _carried(q, k, w, beta, chunk_size=8)
  index = jnp.arange(37)[None]
  some = _reflected_logits(q[:, 30:34], k, jnp.transpose(w, (0, 2, 3, 1)), jnp.transpose(beta, (0, 2, 1)),
                               index[:, 30:34], index, chunk_size=8)
  causal = np.tril(np.ones((37, 37), bool))[30:34]
  np.testing.assert_allclose(np.asarray(some)[0][:, causal], np.asarray(whole)[0, :, 30:34][:, causal], atol=1e-5)


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


def test_the_triangular_inverse_by_doubling_is_numpys_inverse():
  """(I + X)^-1 for strictly upper triangular X of sizes that are and are not powers of 2, against
  numpy.linalg.inv in float64; the result is upper triangular."""
  for size in (1, 5, 24, 64):
    x = np.triu(np.random.default_rng(size).normal(size=(3, size, size)) * 0.5, 1)
    ours = np.asarray(jax.jit(path.unit_upper_triangular_inverse)(jnp.asarray(x, jnp.float32)), np.float64)
    expected = np.linalg.inv(np.eye(size) + x)
    np.testing.assert_allclose(ours, expected, atol=1e-6 * np.abs(expected).max(), err_msg=str(size))
    assert not np.any(np.tril(ours, -1))
