"""relative.py's distance layout against naive loops, and Shaw's and T5's two paths (consecutive
positions through the distance layout, any positions through a gather) against each other."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.positions import relative
from transformer.positions import shaw as shaw_module
from transformer.positions import t5 as t5_module

SIZES = [(1, 1), (1, 5), (5, 1), (3, 7), (7, 3), (6, 6)]


@pytest.mark.parametrize('length_q,length_k', SIZES)
def test_by_distance_to_by_key_matches_a_loop(length_q, length_k):
  x = np.random.default_rng(0).normal(size=(2, length_q, length_q + length_k - 1)).astype(np.float32)
  ours = np.asarray(relative.by_distance_to_by_key(jnp.asarray(x), length_k))
  expected = np.zeros((2, length_q, length_k), np.float32)
  for i, j in itertools.product(range(length_q), range(length_k)):
    expected[:, i, j] = x[:, i, j - i + length_q - 1]
  np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize('length_q,length_k', SIZES)
def test_by_key_to_by_distance_matches_a_loop(length_q, length_k):
  w = np.random.default_rng(1).normal(size=(2, 3, length_q, length_k)).astype(np.float32) + 10.0  # no zeros
  ours = np.asarray(relative.by_key_to_by_distance(jnp.asarray(w)))
  expected = np.zeros((2, 3, length_q, length_q + length_k - 1), np.float32)
  for i, t in itertools.product(range(length_q), range(length_q + length_k - 1)):
    j = t + i - (length_q - 1)
    if 0 <= j < length_k:
      expected[..., i, t] = w[..., i, j]
  np.testing.assert_array_equal(ours, expected)


def test_contiguous_offset_accepts_runs_with_one_offset_only():
  def check(q, k):
    ok, offset = relative.contiguous_offset(jnp.asarray(q), jnp.asarray(k))
    return bool(ok), int(offset)

  assert check([[3, 4, 5]], [[0, 1, 2, 3, 4, 5]]) == (True, -3)
  assert check([[0, 1], [4, 5]], [[2, 3, 4], [6, 7, 8]]) == (True, 2)  # the same offset in both rows
  assert not check([[0, 1], [4, 5]], [[0, 1, 2], [0, 1, 2]])[0]  # offsets 0 and -4
  assert not check([[0, 2, 4]], [[0, 1, 2]])[0]  # not a run
  assert not check([[0, 1, 2]], [[2, 1, 0]])[0]


# (query positions, key positions): same positions, a later block against its prefix, an earlier
# block against later keys, and positions that are not runs (the gather path on both sides).
POSITIONS = [(range(6), range(6)), (range(8, 12), range(0, 12)), (range(0, 3), range(5, 14)),
             ([0, 2, 3, 7], [1, 2, 9, 4, 0])]


@pytest.mark.slow
@pytest.mark.parametrize('q_positions,k_positions', POSITIONS)
def test_shaw_terms_and_gradients_equal_the_gathered_ones(q_positions, k_positions):
  clip = 3
  q_pos, k_pos = jnp.asarray([list(q_positions)]), jnp.asarray([list(k_positions)])
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  query = jax.random.normal(keys[0], (2, q_pos.shape[1], 2, 4))
  weights = jax.random.uniform(keys[1], (2, 2, q_pos.shape[1], k_pos.shape[1]))
  key_table, value_table = (jax.random.normal(k, (2 * clip + 1, 2, 4)) for k in keys[2:])
  buckets = shaw_module.shaw_buckets(q_pos, k_pos, clip)
  ok, offset = relative.contiguous_offset(q_pos, k_pos)

  def fast(query, weights, key_table, value_table):
    return (shaw_module.shaw_logits_consecutive(query, key_table, k_pos.shape[1], offset, clip),
            shaw_module.shaw_values_consecutive(weights, value_table, offset, clip))

  def gathered(query, weights, key_table, value_table):
    return shaw_module.shaw_logits(query, key_table, buckets), shaw_module.shaw_values(weights, value_table, buckets)

  args = (query, weights, key_table, value_table)
  if not bool(ok):  # not runs: the layer must fall back to the gather, whose result differs from fast()'s
    layer = shaw_module.Shaw(settings=shaw_module.ShawSettings(clip_distance=clip, per_head=True), num_heads=2, head_dim=4, model_dim=8, num_layers=1,
                             causal=False)
    params = {'params': {'key_table': key_table, 'value_table': value_table}}
    logits = layer.apply(params, query, None, q_pos, k_pos, None, 1.0, method='logits')
    np.testing.assert_allclose(logits, gathered(*args)[0], rtol=1e-6, atol=1e-6)
    return
  for ours, expected in zip(jax.jit(fast)(*args), jax.jit(gathered)(*args)):
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
  loss = lambda f: lambda *a: sum(jnp.sum(jnp.sin(t)) for t in f(*a))
  for ours, expected in zip(jax.jit(jax.grad(loss(fast), argnums=(0, 1, 2, 3)))(*args),
                            jax.jit(jax.grad(loss(gathered), argnums=(0, 1, 2, 3)))(*args)):
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('q_positions,k_positions', POSITIONS)
@pytest.mark.parametrize('bidirectional', [False, True])
def test_t5_bias_and_its_gradient_equal_the_gathered_ones(q_positions, k_positions, bidirectional):
  q_pos, k_pos = jnp.asarray([list(q_positions)]), jnp.asarray([list(k_positions)])
  table = jax.random.normal(jax.random.PRNGKey(0), (8, 3))
  kwargs = dict(bidirectional=bidirectional, max_distance=6)
  ours = lambda table: t5_module.t5_bias(table, q_pos, k_pos, **kwargs)
  gathered = lambda table: t5_module.t5_bias_gathered(table, q_pos, k_pos, **kwargs)
  np.testing.assert_array_equal(ours(table), gathered(table))
  cotangent = jax.random.normal(jax.random.PRNGKey(1), ours(table).shape)
  np.testing.assert_allclose(jax.vjp(ours, table)[1](cotangent)[0], jax.vjp(gathered, table)[1](cotangent)[0],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('q_positions,k_positions', POSITIONS)
def test_positions_known_only_at_run_time_take_the_same_path(q_positions, k_positions):
  """Traced positions (decided by a lax.cond) give what constant positions (decided while tracing) give."""
  q_pos, k_pos = jnp.asarray([list(q_positions)]), jnp.asarray([list(k_positions)])
  layer = shaw_module.Shaw(settings=shaw_module.ShawSettings(clip_distance=3), num_heads=2, head_dim=4, model_dim=8,
                           num_layers=1, causal=False)
  query = jax.random.normal(jax.random.PRNGKey(0), (2, q_pos.shape[1], 2, 4))
  weights = jax.random.uniform(jax.random.PRNGKey(1), (2, 2, q_pos.shape[1], k_pos.shape[1]))
  params = layer.init(jax.random.PRNGKey(2), query, None, q_pos, k_pos, None, 1.0, method='logits')

  def terms(q_pos, k_pos):
    return (layer.apply(params, query, None, q_pos, k_pos, None, 0.5, method='logits'),
            layer.apply(params, weights, q_pos, k_pos, method='values'),
            t5_module.t5_bias(jnp.arange(24.0).reshape(8, 3), q_pos, k_pos, bidirectional=True, max_distance=6))

  assert isinstance(relative.contiguous_offset(q_pos, k_pos)[0], bool)
  for traced, constant in zip(jax.jit(terms)(q_pos, k_pos), terms(q_pos, k_pos)):
    np.testing.assert_allclose(traced, constant, rtol=1e-5, atol=1e-5)
