"""Blockwise attention (online softmax, per-block position terms, skipped causal blocks) against
the one-softmax attention: the function itself, then every variant inside every model kind."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import attention_core
from transformer.blockwise import blockwise_attention
from tests.helpers import bidirectional, init, random_positions, tiny, tokens


def qkv(length_q=13, length_k=13, heads=2, width=8, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  query = jax.random.normal(keys[0], (2, length_q, heads, width)) * 2.0  # peaked rows stress the rescaling
  key = jax.random.normal(keys[1], (2, length_k, heads, width)) * 2.0
  value = jax.random.normal(keys[2], (2, length_k, heads, width))
  return query, key, value


@pytest.mark.parametrize('block_size,key_block_size', [(1, None), (4, None), (5, 5), (4, 3), (13, 2), (64, None)])
def test_causal_blocks_equal_one_softmax_with_padding_and_a_bias(block_size, key_block_size):
  query, key, value = qkv()
  valid = jnp.arange(13)[None] < jnp.asarray([[13], [9]])
  mask = T.self_attention_mask(valid, 13, causal=True)
  bias = jax.random.normal(jax.random.PRNGKey(7), (1, 2, 13, 13))
  expected = T.scaled_dot_product_attention(query, key, value, mask=mask, bias=bias)
  got = jax.jit(lambda q, k, v: blockwise_attention(
      q, k, v, block_size=block_size, mask=mask, skip_future_blocks=True,
      logits_term=lambda query_block, rows, columns: bias[..., rows, columns], key_block_size=key_block_size))(
          query, key, value)
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_cross_attention_blocks_with_unequal_lengths_equal_one_softmax():
  query, key, value = qkv(length_q=7, length_k=11)
  mask = T.cross_attention_mask(jnp.arange(11)[None] < jnp.asarray([[11], [3]]))
  expected = T.scaled_dot_product_attention(query, key, value, mask=mask, scale=0.3)
  for key_block_size in (None, 4):
    got = jax.jit(lambda q, k, v: blockwise_attention(q, k, v, block_size=3, mask=mask, scale=0.3,
                                                      key_block_size=key_block_size))(query, key, value)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('key_block_size', [None, 4])
def test_future_keys_are_never_computed_and_a_values_term_adds_linearly(key_block_size):
  """With 4 blocks of 4 queries, a causal sweep computes 4 + 8 + 12 + 16 = 40 query-key columns
  (10 blocks of 4 x 4 with key blocks of 4), not 64; a values term linear in the weights gives
  sum_j w_ij u_j, as when added after normalising."""
  query, key, value = qkv(length_q=16, length_k=16)
  extra = jax.random.normal(jax.random.PRNGKey(3), (2, 16, 2, 8))  # u_j, one vector per key
  computed = []

  def logits_term(query_block, rows, columns):
    computed.append((rows, columns))
    return None

  def values_term(weights, rows, columns):
    return jnp.einsum('bhqs,bshv->bqhv', weights, extra[:, columns])

  got = blockwise_attention(query, key, value, block_size=4, mask=T.causal_mask(16), skip_future_blocks=True,
                            logits_term=logits_term, values_term=values_term, key_block_size=key_block_size)
  assert sum(columns.stop - columns.start for _, columns in computed) == 40
  assert all(columns.stop <= rows.stop for rows, columns in computed)
  assert len(computed) == (10 if key_block_size else 4)
  expected, weights = T.scaled_dot_product_attention(query, key, value, mask=T.causal_mask(16),
                                                     return_weights=True)
  expected = expected + jnp.einsum('bhqs,bshv->bqhv', weights, extra)
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_fully_masked_row_gives_zeros_and_bad_block_sizes_are_named():
  query, key, value = qkv(length_q=5, length_k=5)
  mask = jnp.ones((2, 1, 5, 5), bool).at[1, :, 2].set(False)
  for key_block_size in (None, 2):
    got = blockwise_attention(query, key, value, block_size=2, mask=mask, key_block_size=key_block_size)
    np.testing.assert_array_equal(got[1, 2], 0.0)
  with pytest.raises(ValueError, match='attention_block_size: got 0'):
    blockwise_attention(query, key, value, block_size=0)
  with pytest.raises(ValueError, match='attention_key_block_size: got -2'):
    blockwise_attention(query, key, value, block_size=2, key_block_size=-2)
  with pytest.raises(ValueError, match='attention_block_size: got -1'):
    tiny(attention_block_size=-1)


@pytest.mark.slow
def test_a_masked_first_key_block_leaves_no_trace_in_outputs_values_terms_or_gradients():
  """Left padding: the first key block of every row is fully masked (its weights are exp(0) = 1
  until a later block sets the row's maximum), and must contribute nothing."""
  query, key, value = qkv(length_q=6, length_k=6)
  extra = jax.random.normal(jax.random.PRNGKey(4), (2, 6, 2, 8))
  mask = jnp.ones((1, 1, 6, 6), bool).at[..., :2].set(False)

  def blocked(q, k, v):
    return blockwise_attention(q, k, v, block_size=3, mask=mask, key_block_size=2,
                               values_term=lambda w, rows, columns: jnp.einsum('bhqs,bshv->bqhv', w,
                                                                               extra[:, columns]))

  def dense(q, k, v):
    output, weights = T.scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    return output + jnp.einsum('bhqs,bshv->bqhv', weights, extra)

  np.testing.assert_allclose(blocked(query, key, value), dense(query, key, value), atol=1e-5, rtol=1e-5)
  loss = lambda attend: lambda *args: jnp.sum(jnp.sin(attend(*args)))
  for got, expected in zip(jax.grad(loss(blocked), argnums=(0, 1, 2))(query, key, value),
                           jax.grad(loss(dense), argnums=(0, 1, 2))(query, key, value)):
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_every_variant_gives_the_same_outputs_and_gradients_blockwise(kind, monkeypatch):
  """Against the same parameters without blocks, one layer, blocks of 3 queries over 7 positions:
  decoder-only (causal, later keys skipped, keys all at once): outputs and gradients, and at other
  block sizes (1, 2, 3, 6 queries; keys all at once or 1, 2, 5 at a time): outputs; encoder-only
  with [CLS] (TUPE's reset falls in the first block) and the aligned encoder-decoder, both through
  the online softmax 4 keys at a time: outputs. Every attention layer must take the blockwise path (a causal
  layer without terms its rolled tiles, tiled_attention.py)."""
  calls = []
  original, rule = attention_core.blockwise_attention, attention_core._blockwise_rule  # pylint: disable=protected-access
  tiled = attention_core.tiled_causal_attention
  monkeypatch.setattr(attention_core, 'blockwise_attention', lambda *a, **k: calls.append(1) or original(*a, **k))
  monkeypatch.setattr(attention_core, 'tiled_causal_attention', lambda *a, **k: calls.append(1) or tiled(*a, **k))
  monkeypatch.setattr(attention_core, '_blockwise_rule', lambda *a, **k: calls.append(1) or rule(*a, **k))  # stick-breaking
  length = 7
  decoder_args = (tokens(2, length),)
  one_layer = dict(num_encoder_layers=1, num_decoder_layers=1)
  dense = T.DecoderOnly(tiny(kind, **one_layer))
  blocked = T.DecoderOnly(tiny(kind, attention_block_size=3, **one_layer))
  params = random_positions(init(dense, *decoder_args))

  def value_and_grad(model):
    return jax.jit(jax.value_and_grad(lambda p: jnp.sum(jnp.tanh(model.apply(p, *decoder_args)))))(params)

  blocked_value, blocked_grads = value_and_grad(blocked)
  assert len(calls) == 1
  dense_value, dense_grads = value_and_grad(dense)
  np.testing.assert_allclose(blocked_value, dense_value, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(dense_grads), jax.tree_util.tree_leaves(blocked_grads)):
    np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)  # float32, another summation order
  calls.clear()
  dense_outputs = dense.apply(params, *decoder_args)
  block_sizes = ((3, 2), (1, 0), (2, 5), (6, 1))
  models = [T.DecoderOnly(tiny(kind, attention_block_size=block_size, attention_key_block_size=key_block_size,
                               **one_layer)) for block_size, key_block_size in block_sizes]
  outputs = jax.jit(lambda p, *args: [model.apply(p, *args) for model in models])(params, *decoder_args)
  for (block_size, key_block_size), blocked_outputs in zip(block_sizes, outputs):
    np.testing.assert_allclose(blocked_outputs, dense_outputs, atol=2e-5, rtol=1e-5,
                               err_msg=f'blocks of {block_size}, key blocks of {key_block_size}')
  assert len(calls) == 4

  if not bidirectional(kind):
    return  # causal only: no encoder to run in blocks
  encoder_args = (tokens(2, length),)
  params_encoder = random_positions(init(T.EncoderOnly(tiny(kind, **one_layer)), *encoder_args))
  for make, args, blockwise_layers in (
      (lambda **c: T.EncoderOnly(tiny(kind, **one_layer, **c)), (tokens(2, length),), 1),
      (lambda **c: T.EncoderDecoder(tiny(kind, aligned_cross_attention=True, **one_layer, **c)),
       (tokens(2, length), tokens(2, length, seed=1)), 3)):
    dense, blocked = make(), make(attention_block_size=3, attention_key_block_size=4)
    params = random_positions(init(dense, *args))
    calls.clear()
    blocked_outputs = blocked.apply(params, *args)
    assert len(calls) == blockwise_layers, (kind, type(dense).__name__, len(calls))
    np.testing.assert_allclose(blocked_outputs, dense.apply(params, *args), atol=2e-5, rtol=1e-5)
  calls.clear()  # bidirectional attention without key blocks would only recompute: it stays dense
  T.EncoderOnly(tiny(kind, **one_layer, attention_block_size=3)).apply(params_encoder, *encoder_args)
  assert not calls



@pytest.mark.slow
@pytest.mark.parametrize('clip_distance,key_block_size', [(1, 0), (3, 2), (4, 0)])
def test_shaws_causal_band_gives_the_outputs_and_gradients_of_the_whole_term(clip_distance, key_block_size,
                                                                              monkeypatch):
  """Shaw in causal blocks of 3 over 11 positions, terms on each block's band only (distances up to
  k back, k below, at and above the block size; the keys before the band in one block or in blocks
  of 2), against the one-softmax layer with the whole terms, padding included."""
  bands = []
  original = attention_core.blockwise_attention
  monkeypatch.setattr(attention_core, 'blockwise_attention', lambda *a, **k: bands.append(k['band']) or original(*a, **k))
  length = 11
  args = (tokens(2, length),)
  valid = jnp.arange(length)[None] < jnp.array([[length], [8]])
  config = dict(num_decoder_layers=1, position=dict(clip_distance=clip_distance))
  dense = T.DecoderOnly(tiny('shaw', **config))
  blocked = T.DecoderOnly(tiny('shaw', attention_block_size=3, attention_key_block_size=key_block_size, **config))
  params = init(dense, *args)
  # Rows start apart: the re-centred tables are exact only if they differ from the untouched ones.
  params = jax.tree_util.tree_map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(4), x.shape), params)

  def value_and_grad(model):
    loss = lambda p: jnp.sum(jnp.tanh(model.apply(p, *args, valid_BxL=valid)) * valid[..., None])
    return jax.jit(jax.value_and_grad(loss))(params)

  blocked_value, blocked_grads = value_and_grad(blocked)
  assert bands == [clip_distance]
  dense_value, dense_grads = value_and_grad(dense)
  np.testing.assert_allclose(blocked_value, dense_value, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(dense_grads), jax.tree_util.tree_leaves(blocked_grads)):
    np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize('length_q,columns,width', [(4, 3, 9), (5, 7, 3), (1, 2, 2), (6, 6, 6)])
def test_row_shifts_of_the_causal_band_against_loops(length_q, columns, width):
  from transformer.positions.shaw import shift_rows_left, shift_rows_right
  z = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (2, length_q, columns)))
  right, left = np.zeros((2, length_q, width)), np.zeros((2, length_q, width))
  for i in range(length_q):
    for c in range(width):
      if 0 <= c - i < columns:
        right[:, i, c] = z[:, i, c - i]
      if c + i < columns:
        left[:, i, c] = z[:, i, c + i]
  np.testing.assert_array_equal(shift_rows_right(jnp.asarray(z), width), right)
  np.testing.assert_array_equal(shift_rows_left(jnp.asarray(z), width), left)


def test_shared_terms_cut_by_query_block_equal_slices_of_the_whole_term():
  """Each block's shared terms (rows cut once, then a column slice) equal the block sliced out of
  the whole term, for a term with rows and one broadcast over rows; the gradient is 1 exactly
  where a causal sweep in blocks of 4 reads the term (rows 0-3 keys 0-3, rows 4-7 keys 0-7, rows
  8-9 keys 0-9) and 0 elsewhere."""
  from transformer.blockwise import block_slice, shared_by_query_block
  shared = {'term': jax.random.normal(jax.random.PRNGKey(0), (2, 10, 10)),
            'row_broadcast': jax.random.normal(jax.random.PRNGKey(1), (2, 1, 10))}
  blocks = [(slice(start, min(start + 4, 10)), slice(0, min(start + 4, 10))) for start in range(0, 10, 4)]
  block_terms = shared_by_query_block(shared, 10, 4)
  for rows, columns in blocks:
    for name, whole in shared.items():
      np.testing.assert_array_equal(block_terms(rows, columns)[name], block_slice(whole, rows, columns))
  gradient = jax.grad(lambda s: sum(jnp.sum(shared_by_query_block(s, 10, 4)(rows, columns)['term'])
                                    for rows, columns in blocks))(shared)['term']
  expected = np.zeros((10, 10))
  for rows, columns in blocks:
    expected[rows, columns] = 1.0
  np.testing.assert_array_equal(gradient, np.broadcast_to(expected, (2, 10, 10)))


@pytest.mark.parametrize('term_shape', [(1, 2, 3, 5), (1, 1, 3, 5), (3, 5), (2, 1, 5), (4, 2, 3, 5), (1, 2, 1, 5)])
def test_adding_a_broadcast_term_has_the_gradient_of_a_plain_add(term_shape):
  from transformer.blockwise import add_broadcast_term
  logits = jax.random.normal(jax.random.PRNGKey(0), (4, 2, 3, 5))
  term = jax.random.normal(jax.random.PRNGKey(1), term_shape)
  loss = lambda add: lambda a, b: jnp.sum(jnp.sin(add(a, b)))
  np.testing.assert_array_equal(add_broadcast_term(logits, term), logits + term)
  for got, expected in zip(jax.grad(loss(add_broadcast_term), argnums=(0, 1))(logits, term),
                           jax.grad(loss(jnp.add), argnums=(0, 1))(logits, term)):
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
