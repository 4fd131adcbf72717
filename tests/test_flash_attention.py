"""The Pallas flash attention kernel (transformer/flash_attention.py) in Pallas' interpreter against dense
attention (scaled_dot_product_attention with the variant's own dense bias): outputs and gradients of
queries, keys, values and the term's parameters, causal and bidirectional, with padding and with
fewer queries than keys; float32 and bfloat16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.attention import scaled_dot_product_attention
from transformer.flash_attention import KernelTerm, flash_attention
from transformer.positions import alibi, fox, kerple, t5

HEADS = 3


def _term_and_dense_bias(kind: str, causal: bool):
  """The variant's KernelTerm builder and, independently, its dense bias (B x H x Lq x Lk) from the same
  parameters, as the library's dense path computes it."""
  rng = np.random.default_rng(1)
  if kind == 'alibi':
    slopes_Hx1 = jnp.asarray(alibi.alibi_slopes(HEADS))[:, None]

    def term(parameters_HxA):
      return KernelTerm(lambda p, q, k: -p[0] * alibi.alibi_distance(k - q, causal), parameters_HxA)

    def dense(parameters_HxA, q_positions, k_positions):
      distance = alibi.alibi_distance(k_positions[None, :] - q_positions[:, None], causal).astype(jnp.float32)
      return -parameters_HxA[:, 0][None, :, None, None] * distance[None, None]
    return slopes_Hx1, term, dense
  if kind == 't5':
    table_RxH = jnp.asarray(rng.normal(size=(8, HEADS)), jnp.float32)

    def term(parameters_HxA):
      return t5.t5_kernel_term(parameters_HxA.T, bidirectional=not causal, max_distance=12)

    def dense(parameters_HxA, q_positions, k_positions):
      return t5.t5_bias_gathered(parameters_HxA.T, q_positions[None], k_positions[None], bidirectional=not causal,
                                 max_distance=12)
    return table_RxH.T, term, dense
  elementwise = {'kerple_log': kerple.log_kernel, 'kerple_power': kerple.power_kernel}[kind]
  r_Hx2 = jnp.asarray(rng.uniform(0.2, 1.5, size=(HEADS, 2)), jnp.float32)

  def term(parameters_HxA):
    return KernelTerm(lambda p, q, k: elementwise(p[0], p[1], kerple.distance_from_relative(k - q, causal)),
                      parameters_HxA)

  def dense(parameters_HxA, q_positions, k_positions):
    return elementwise(parameters_HxA[:, 0][:, None, None], parameters_HxA[:, 1][:, None, None],
                       kerple.kerple_distance(q_positions[None], k_positions[None], causal))
  return r_Hx2, term, dense


def _inputs(length_q, length_k, dtype, batch=2, width=8):
  rng = np.random.default_rng(0)
  return [jnp.asarray(rng.normal(size=(batch, length, HEADS, width)), dtype)
          for length in (length_q, length_k, length_k)]


def _dense_attention(query, key, value, bias, causal, key_valid):
  length_q, length_k = query.shape[1], key.shape[1]
  mask = key_valid[:, None, None, :]
  if causal:
    mask = mask & (jnp.arange(length_k)[None, :] <= jnp.arange(length_q)[:, None] + length_k - length_q)[None, None]
  return scaled_dot_product_attention(query, key, value, mask=mask, bias=bias)


CASES = [  # (causal, length_q, length_k): a tail block, two query blocks, fewer queries than keys
    (True, 21, 21), (False, 21, 21), (True, 5, 19), (False, 7, 13)]


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['none', 'alibi', 't5', 'kerple_log', pytest.param('kerple_power',
                                                                                  marks=pytest.mark.slow)])
@pytest.mark.parametrize('causal, length_q, length_k', CASES)
def test_the_kernel_equals_dense_attention_forward_and_gradients(kind, causal, length_q, length_k):
  query, key, value = _inputs(length_q, length_k, jnp.float32)
  key_valid = jnp.asarray(np.arange(length_k)[None] < np.array([[length_k], [length_k - 4]]))  # padding in row 2
  q_positions = jnp.arange(length_k - length_q, length_k)  # queries are the last positions, as in the mask
  k_positions = jnp.arange(length_k)
  if kind == 'none':
    parameters, term, dense = jnp.zeros((HEADS, 1)), lambda p: None, lambda p, q, k: None
  else:
    parameters, term, dense = _term_and_dense_bias(kind, causal)

  def kernel_loss(query, key, value, parameters):
    out = flash_attention(query, key, value, causal=causal, key_valid_BxLk=key_valid,
                          q_positions_BxLq=q_positions[None], k_positions_BxLk=k_positions[None],
                          term=term(parameters), block_q=8, block_k=8)
    return jnp.sum(jnp.sin(out)), out

  def dense_loss(query, key, value, parameters):
    out = _dense_attention(query, key, value, dense(parameters, q_positions, k_positions), causal, key_valid)
    return jnp.sum(jnp.sin(out)), out

  (_, kernel_out), kernel_grads = jax.jit(jax.value_and_grad(kernel_loss, argnums=(0, 1, 2, 3), has_aux=True))(
      query, key, value, parameters)
  (_, dense_out), dense_grads = jax.jit(jax.value_and_grad(dense_loss, argnums=(0, 1, 2, 3), has_aux=True))(
      query, key, value, parameters)
  np.testing.assert_allclose(kernel_out, dense_out, atol=1e-5, rtol=1e-5)
  for name, got, expected in zip(('query', 'key', 'value', 'parameters'), kernel_grads, dense_grads):
    if kind == 'none' and name == 'parameters':
      continue
    scale = max(1.0, float(jnp.max(jnp.abs(expected))))  # parameter gradients sum over B x Lq x Lk
    np.testing.assert_allclose(got, expected, atol=1e-5 * scale, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize('causal, length_q, length_k', [(True, 21, 21), (True, 5, 19)])
def test_a_term_of_per_token_data_equals_dense_attention_and_gets_its_gradients(causal, length_q, length_k):
  """A term of a number per (batch, head, query) and per key, a_i b_j + b_j (FoX's c_i - c_j would leave a_i
  no gradient: a row's shift cancels in the softmax): outputs and the gradients of q, k, v and both data
  arrays equal dense attention with the bias formed (padding in the second row)."""
  query, key, value = _inputs(length_q, length_k, jnp.float32)
  key_valid = jnp.asarray(np.arange(length_k)[None] < np.array([[length_k], [length_k - 4]]))
  rng = np.random.default_rng(2)
  q_data, k_data = (jnp.asarray(rng.normal(size=(2, HEADS, n)), jnp.float32) for n in (length_q, length_k))

  def kernel_loss(query, key, value, q_data, k_data):
    term = KernelTerm(lambda p, q, k, a_bqx1, b_1xbk: a_bqx1 * b_1xbk + b_1xbk, jnp.zeros((HEADS, 1)),
                      q_data_BxHxLq=q_data, k_data_BxHxLk=k_data)
    out = flash_attention(query, key, value, causal=causal, key_valid_BxLk=key_valid, term=term, block_q=8, block_k=8)
    return jnp.sum(jnp.sin(out))

  def dense_loss(query, key, value, q_data, k_data):
    bias = q_data[..., :, None] * k_data[..., None, :] + k_data[..., None, :]
    return jnp.sum(jnp.sin(_dense_attention(query, key, value, bias, causal, key_valid)))

  arguments = (query, key, value, q_data, k_data)
  kernel_value, kernel_grads = jax.jit(jax.value_and_grad(kernel_loss, argnums=(0, 1, 2, 3, 4)))(*arguments)
  dense_value, dense_grads = jax.jit(jax.value_and_grad(dense_loss, argnums=(0, 1, 2, 3, 4)))(*arguments)
  np.testing.assert_allclose(kernel_value, dense_value, rtol=1e-5)
  for name, got, expected in zip(('query', 'key', 'value', 'q_data', 'k_data'), kernel_grads, dense_grads):
    assert float(jnp.max(jnp.abs(expected))) > 1e-3, name  # a gradient that is there to compare
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4, err_msg=name)


def test_packed_rows_see_only_their_own_document_as_dense_attention_does():
  """Rows that pack documents (5, 9, 7 and 12, 9 tokens, the second row's last 3 keys padding): positions
  restarting in each and segment ids, causal ALiBi in blocks of 8 that straddle the boundaries. Outputs and
  the gradients of q, k, v and the slopes equal dense attention with the segment mask and the bias of the
  packed positions; refused when only one side's segments are given."""
  query, key, value = _inputs(21, 21, jnp.float32)
  lengths = ((5, 9, 7), (12, 9))
  positions = jnp.asarray([np.concatenate([np.arange(n) for n in row]) for row in lengths], jnp.int32)
  segments = jnp.asarray([np.concatenate([np.full(n, i) for i, n in enumerate(row)]) for row in lengths], jnp.int32)
  key_valid = jnp.asarray(np.arange(21)[None] < np.array([[21], [18]]))
  parameters, term, dense = _term_and_dense_bias('alibi', causal=True)

  def kernel_loss(query, key, value, parameters):
    return jnp.sum(jnp.sin(flash_attention(
        query, key, value, causal=True, key_valid_BxLk=key_valid, q_positions_BxLq=positions,
        k_positions_BxLk=positions, q_segments_BxLq=segments, k_segments_BxLk=segments, term=term(parameters),
        block_q=8, block_k=8)))

  def dense_loss(query, key, value, parameters):
    bias = jnp.concatenate([dense(parameters, row, row) for row in positions])
    same_document = segments[:, None, :, None] == segments[:, None, None, :]
    mask = same_document & key_valid[:, None, None, :] & (jnp.arange(21)[None, :] <= jnp.arange(21)[:, None])
    return jnp.sum(jnp.sin(scaled_dot_product_attention(query, key, value, mask=mask, bias=bias)))

  arguments = (query, key, value, parameters)
  kernel_value, kernel_grads = jax.jit(jax.value_and_grad(kernel_loss, argnums=(0, 1, 2, 3)))(*arguments)
  dense_value, dense_grads = jax.jit(jax.value_and_grad(dense_loss, argnums=(0, 1, 2, 3)))(*arguments)
  np.testing.assert_allclose(kernel_value, dense_value, rtol=1e-5)
  for name, got, expected in zip(('query', 'key', 'value', 'parameters'), kernel_grads, dense_grads):
    scale = max(1.0, float(jnp.max(jnp.abs(expected))))
    np.testing.assert_allclose(got, expected, atol=1e-5 * scale, rtol=1e-5, err_msg=name)
  unpacked = flash_attention(query, key, value, causal=True, key_valid_BxLk=key_valid, term=term(parameters))
  assert not np.allclose(unpacked[:, 5:], flash_attention(
      query, key, value, causal=True, key_valid_BxLk=key_valid, q_positions_BxLq=positions, k_positions_BxLk=positions,
      q_segments_BxLq=segments, k_segments_BxLk=segments, term=term(parameters))[:, 5:], atol=1e-3)
  with pytest.raises(ValueError, match='q_segments_BxLq, k_segments_BxLk: .* valid: both or neither'):
    flash_attention(query, key, value, q_segments_BxLq=segments)


def test_per_token_data_comes_for_queries_and_keys_together():
  query, key, value = _inputs(4, 4, jnp.float32)
  term = KernelTerm(fox.fox_kernel_bias, jnp.zeros((HEADS, 1)), q_data_BxHxLq=jnp.zeros((2, HEADS, 4)))
  with pytest.raises(ValueError, match='q_data_BxHxLq and k_data_BxHxLk come together; valid: both or neither'):
    flash_attention(query, key, value, term=term)


@pytest.mark.slow
def test_the_parameter_gradients_are_not_zero():
  """The comparison above would pass for a term whose parameters had no gradient in either path."""
  parameters, term, _ = _term_and_dense_bias('t5', causal=True)
  query, key, value = _inputs(16, 16, jnp.float32)
  gradient = jax.grad(lambda p: jnp.sum(jnp.sin(flash_attention(query, key, value, causal=True, term=term(p),
                                                                  block_q=8, block_k=8))))(parameters)
  assert float(jnp.min(jnp.sum(jnp.abs(gradient[:, :5]), axis=0))) > 1e-3  # the near buckets, every one


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['alibi', 't5'])
def test_bfloat16_inputs_give_dense_attention_to_bfloat16_rounding(kind):
  """bfloat16 queries, keys and values (logits and softmax in float32 in both): within 2e-2, a few of
  bfloat16's steps (2^-8 relative) on outputs of order 1."""
  query, key, value = _inputs(24, 24, jnp.bfloat16)
  parameters, term, dense = _term_and_dense_bias(kind, causal=True)
  positions = jnp.arange(24)
  valid = jnp.ones((2, 24), bool)
  kernel_out = flash_attention(query, key, value, causal=True, term=term(parameters), block_q=8, block_k=8)
  dense_out = _dense_attention(query, key, value, dense(parameters, positions, positions), True, valid)
  assert kernel_out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(kernel_out, np.float32), np.asarray(dense_out, np.float32), atol=2e-2)
  gradient = jax.grad(lambda q: jnp.sum(flash_attention(q, key, value, causal=True, term=term(parameters),
                                                         block_q=8, block_k=8).astype(jnp.float32)))(query)
  dense_gradient = jax.grad(lambda q: jnp.sum(_dense_attention(
      q, key, value, dense(parameters, positions, positions), True, valid).astype(jnp.float32)))(query)
  np.testing.assert_allclose(np.asarray(gradient, np.float32), np.asarray(dense_gradient, np.float32), atol=5e-2)


def test_a_row_that_sees_no_key_gives_zeros_as_the_explicit_softmax():
  query, key, value = _inputs(4, 8, jnp.float32)
  key_valid = jnp.asarray([[True] * 8, [False] * 8])
  out = flash_attention(query, key, value, key_valid_BxLk=key_valid, block_q=4, block_k=4)
  np.testing.assert_array_equal(out[1], 0.0)
  np.testing.assert_allclose(out[0], _dense_attention(query, key, value, None, False, key_valid)[0], atol=1e-6)


def test_an_unknown_platform_is_refused():
  query, key, value = _inputs(4, 4, jnp.float32)
  with pytest.raises(ValueError, match="platform: got 'cuda'; valid: interpret, gpu, tpu"):
    flash_attention(query, key, value, platform='cuda')


ACCELERATOR = jax.default_backend() in ('gpu', 'tpu')


@pytest.mark.skipif(not ACCELERATOR, reason='compiles the kernels for a GPU (Triton) or TPU (Mosaic); this is a '
                    f'{jax.default_backend()} machine')
@pytest.mark.parametrize('kind', ['none', 'alibi', 't5', 'kerple_log'])
@pytest.mark.parametrize('dtype, tolerance', [(jnp.float32, 2e-3), (jnp.bfloat16, 3e-2)])
def test_the_compiled_kernel_equals_dense_attention_on_this_accelerator(kind, dtype, tolerance):
  """The kernels as the hardware runs them (blocks of 64 or 128, 256 keys, head width 64), forward and
  gradients against dense attention on the same device. float32 matmuls on a GPU may run in TF32, hence
  the looser float32 tolerance than the interpreter's."""
  platform = jax.default_backend()
  query, key, value = _inputs(256, 256, dtype, width=64)
  parameters, term, dense = (jnp.zeros((HEADS, 1)), lambda p: None, lambda p, q, k: None) if kind == 'none' else (
      _term_and_dense_bias(kind, causal=True))
  positions = jnp.arange(256)
  valid = jnp.ones((2, 256), bool)

  def kernel_loss(query, key, value, parameters):
    out = flash_attention(query, key, value, causal=True, term=term(parameters), block_q=64, block_k=64,
                          platform=platform)
    return jnp.sum(jnp.sin(out.astype(jnp.float32))), out

  def dense_loss(query, key, value, parameters):
    out = _dense_attention(query, key, value, dense(parameters, positions, positions), True, valid)
    return jnp.sum(jnp.sin(out.astype(jnp.float32))), out

  (_, got), got_grads = jax.value_and_grad(kernel_loss, argnums=(0, 1, 2, 3), has_aux=True)(query, key, value,
                                                                                             parameters)
  (_, expected), expected_grads = jax.value_and_grad(dense_loss, argnums=(0, 1, 2, 3), has_aux=True)(
      query, key, value, parameters)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32), atol=tolerance)
  for name, a, b in zip(('query', 'key', 'value', 'parameters'), got_grads, expected_grads):
    scale = max(1.0, float(jnp.max(jnp.abs(b.astype(jnp.float32)))))
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tolerance * scale,
                               err_msg=name)


@pytest.mark.slow
def test_replicas_under_vmap_get_what_each_gets_alone():
  """Seeds in one program (experiments/runs/replicas.py) vmap the training step: the kernel and its
  custom gradient must batch."""
  parameters, term, _ = _term_and_dense_bias('kerple_log', causal=True)
  stacked = jnp.stack([jnp.stack(_inputs(12, 12, jnp.float32, batch=1)), jnp.stack(_inputs(12, 12, jnp.float32,
                                                                                           batch=1)) * 0.5])

  def loss(qkv, parameters):
    return jnp.sum(jnp.sin(flash_attention(*qkv, causal=True, term=term(parameters), block_q=4, block_k=4)))
  batched = jax.vmap(jax.value_and_grad(loss, argnums=(0, 1)), in_axes=(0, None))(stacked, parameters)
  for replica in range(2):
    alone = jax.value_and_grad(loss, argnums=(0, 1))(stacked[replica], parameters)
    for got, expected in zip(jax.tree_util.tree_leaves(batched), jax.tree_util.tree_leaves(alone)):
      np.testing.assert_allclose(got[replica], expected, atol=1e-6)
