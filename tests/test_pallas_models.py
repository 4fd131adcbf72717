"""model.attention_implementation='pallas' in whole models: every variant the kernel serves gives the
explicit core's logits and parameter gradients (Pallas' interpreter on this CPU), the others are refused
naming the field; and the training step lowers for GPU (Triton) and TPU (Mosaic) on this CPU-only
machine with the kernels in it and no B x H x L x L term."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import transformer as T
from transformer import attention_core
from tests.helpers import init, random_positions, tiny, tokens

FAST = ('alibi', 't5', 'rope')  # the fast tier's; the others under -m slow
SERVED = [pytest.param(kind, marks=() if kind in FAST else pytest.mark.slow)
          for kind in ('none', 'sinusoidal', 'learned', 'rope', 'p_rope', 'xpos', 'alibi', 't5', 'kerple_log',
                       'kerple_power', 'fox', 'layer_pattern')]
NOT_SERVED = ['shaw', 'tupe_a', 'tupe_r', 'fire', 'cope', 'transformer_xl', 'stick_breaking', 'path']


def _assert_gradients_close(got, expected):
  """Every parameter's gradient within 1e-4 of the largest gradient of all (a key projection's bias has a
  gradient of exactly 0 in exact arithmetic, so a leaf's own scale would be rounding error)."""
  largest = max(float(jnp.max(jnp.abs(leaf))) for leaf in jax.tree_util.tree_leaves(expected))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_allclose(a, b, atol=1e-4 * largest, rtol=0, err_msg=jax.tree_util.keystr(path))


def _decoder_loss(model, inputs, valid):
  def loss(params):
    logits = model.apply(params, inputs, valid_BxL=valid)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, inputs) * valid), logits
  return loss


@pytest.mark.slow
@pytest.mark.parametrize('kind', SERVED)
def test_a_decoder_with_the_kernel_gives_the_explicit_logits_and_gradients(kind):
  """Length 11 in blocks of 4 (a tail block), padding at the end of the second row, the variant's
  parameters made non-zero; one layer, two where something crosses layers (T5's shared bias, a pattern)."""
  inputs = tokens(2, 11)
  valid = jnp.asarray(np.arange(11)[None] < np.array([[11], [8]]))
  position = dict(layer_pattern='alibi,none') if kind == 'layer_pattern' else {}
  layers = dict(num_decoder_layers=2 if kind in ('t5', 'layer_pattern') else 1)
  explicit = T.DecoderOnly(tiny(kind, position=position, attention_implementation='explicit', **layers))
  kernel = T.DecoderOnly(tiny(kind, position=position, attention_implementation='pallas', attention_block_size=4,
                              **layers))
  params = random_positions(init(explicit, inputs))
  (_, explicit_logits), explicit_grads = jax.jit(jax.value_and_grad(_decoder_loss(explicit, inputs, valid),
                                                                    has_aux=True))(params)
  (_, kernel_logits), kernel_grads = jax.jit(jax.value_and_grad(_decoder_loss(kernel, inputs, valid),
                                                                has_aux=True))(params)
  np.testing.assert_allclose(kernel_logits, explicit_logits, atol=2e-5, rtol=1e-5)
  _assert_gradients_close(kernel_grads, explicit_grads)


@pytest.mark.parametrize('kind', ['alibi', pytest.param('fox', marks=pytest.mark.slow),
                                  pytest.param('t5', marks=pytest.mark.slow)])
def test_packed_rows_through_the_kernel_give_the_explicit_logits_and_gradients(kind):
  """Documents of 3, 5 and 3 tokens packed in a row of 11 (positions restarting, segment ids), blocks of 4
  that straddle them, padding at the end of the second row: the kernel takes the documents as a part of
  the mask and gives the explicit core's logits and gradients; so does XLA's fused core, which takes the
  whole mask."""
  inputs = tokens(2, 11)
  valid = jnp.asarray(np.arange(11)[None] < np.array([[11], [9]]))
  positions = jnp.asarray([[0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2]] * 2, jnp.int32)
  segments = jnp.asarray([[0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2]] * 2, jnp.int32)
  explicit = T.DecoderOnly(tiny(kind, attention_implementation='explicit', num_decoder_layers=1))
  kernel = T.DecoderOnly(tiny(kind, attention_implementation='pallas', attention_block_size=4, num_decoder_layers=1))
  params = random_positions(init(explicit, inputs))

  def loss(model):
    def packed_loss(params):
      logits = model.apply(params, inputs, valid_BxL=valid, positions_BxL=positions, segments_BxL=segments)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, inputs) * valid), logits
    return jax.jit(jax.value_and_grad(packed_loss, has_aux=True))(params)

  (_, explicit_logits), explicit_grads = loss(explicit)
  (_, kernel_logits), kernel_grads = loss(kernel)
  np.testing.assert_allclose(kernel_logits, explicit_logits, atol=2e-5, rtol=1e-5)
  _assert_gradients_close(kernel_grads, explicit_grads)
  xla = T.DecoderOnly(tiny(kind, attention_implementation='xla', num_decoder_layers=1))
  np.testing.assert_allclose(jax.jit(xla.apply)(params, inputs, valid_BxL=valid, positions_BxL=positions,
                                                segments_BxL=segments), explicit_logits, atol=2e-5, rtol=1e-5)
  unpacked = explicit.apply(params, inputs, valid_BxL=valid)
  assert not np.allclose(unpacked[:, 3:], explicit_logits[:, 3:], atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['t5', 'alibi', 'rope'])
def test_an_encoder_decoder_with_the_kernel_gives_the_explicit_logits(kind):
  """Bidirectional self-attention with padded sources, causal self-attention, cross-attention over the
  padded memory (no position hooks there)."""
  source, target = tokens(2, 9, seed=1), tokens(2, 6, seed=2)
  source_valid = jnp.asarray(np.arange(9)[None] < np.array([[9], [5]]))
  explicit = T.EncoderDecoder(tiny(kind, attention_implementation='explicit'))
  kernel = T.EncoderDecoder(tiny(kind, attention_implementation='pallas', attention_block_size=4))
  params = random_positions(init(explicit, source, target))
  np.testing.assert_allclose(jax.jit(kernel.apply)(params, source, target, source_valid_BxLs=source_valid),
                             jax.jit(explicit.apply)(params, source, target, source_valid_BxLs=source_valid),
                             atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('kind', NOT_SERVED)
def test_a_variant_the_kernel_does_not_serve_is_refused_naming_the_field(kind):
  model = T.DecoderOnly(tiny(kind, attention_implementation='pallas'))
  reason = {'shaw': "a values term such as Shaw's",
            'stick_breaking': "the positional variant's weights are not a softmax"}.get(
                kind, "the positional variant's term is not one the kernel computes")
  with pytest.raises(ValueError, match=r"model.attention_implementation: got 'pallas', but ") as error:
    init(model, tokens(2, 5))
  assert reason in str(error.value)


def test_dynamic_ntk_is_refused_by_the_kernel():
  model = T.DecoderOnly(tiny('rope', attention_implementation='pallas',
                             position=dict(rope_extension='dynamic_ntk', original_length=4)))
  with pytest.raises(ValueError, match='not one the kernel computes'):
    init(model, tokens(2, 5))


@pytest.mark.slow
def test_a_cached_decoding_step_is_refused_by_the_kernel():
  """A cached step's mask covers the cache's slots, not the causal mask and padding as parts."""
  model = T.DecoderOnly(tiny('alibi', attention_implementation='pallas'))
  params = init(model, tokens(1, 6))
  _, cache = model.apply(params, tokens(1, 6), use_cache=True, mutable=['cache'])
  with pytest.raises(ValueError, match='the mask is not the causal mask, padding and documents given as such'):
    model.apply({**params, **cache}, tokens(1, 1), use_cache=True, mutable=['cache'])


LENGTH, HEADS = 256, 4


def _lowered_train_step(kind: str, backend: str, platform: str, monkeypatch, num_kv_heads: int = 0) -> str:
  """The StableHLO of one decoder training step (loss, gradients, an Adam update) lowered for platform."""
  monkeypatch.setattr(attention_core, 'current_backend', lambda: backend)
  config = tiny(kind, attention_implementation='pallas', num_heads=HEADS, model_dim=128, attention_block_size=64,
                compute_dtype='bfloat16', vocab_size=64, num_kv_heads=num_kv_heads)
  model = T.DecoderOnly(config)
  inputs = jnp.zeros((2, LENGTH), jnp.int32)
  params = jax.eval_shape(lambda: T.DecoderOnly(tiny(kind, num_heads=HEADS, model_dim=128, vocab_size=64,
                                                     num_kv_heads=num_kv_heads)).init(jax.random.PRNGKey(0), inputs))
  optimizer = optax.adam(1e-3)

  def step(params, opt_state, inputs):
    def loss(params):
      logits = model.apply(params, inputs)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), inputs))
    grads = jax.grad(loss)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state = jax.eval_shape(optimizer.init, params)
  return jax.jit(step).trace(params, opt_state, inputs).lower(lowering_platforms=(platform,)).as_text()


KERNEL_CALL = {'cuda': '__gpu$xla.gpu.triton', 'tpu': 'tpu_custom_call'}


@pytest.mark.slow
@pytest.mark.parametrize('platform, backend', [('cuda', 'gpu'), ('tpu', 'tpu')])
@pytest.mark.parametrize('kind', ['t5', pytest.param('alibi', marks=pytest.mark.slow),
                                  pytest.param('kerple_log', marks=pytest.mark.slow), 'rope', 'fox'])
def test_the_training_step_lowers_with_the_kernels_and_no_full_position_term(kind, platform, backend, monkeypatch):
  """Per layer a forward kernel and two backward kernels (dK dV with the term's gradient, dQ): 2 layers,
  6 calls; and no array of L x L elements anywhere (no term, no mask, no weights)."""
  text = _lowered_train_step(kind, backend, platform, monkeypatch)
  calls = re.findall(r'custom_call @([\w$.]+)', text)
  assert calls.count(KERNEL_CALL[platform]) == 6, calls
  assert not re.search(rf'tensor<(\d+x)*{LENGTH}x{LENGTH}x', text)


@pytest.mark.slow
@pytest.mark.parametrize('platform, backend', [('cuda', 'gpu'), ('tpu', 'tpu')])
def test_grouped_query_attention_lowers_with_the_kernels_on_both_accelerators(platform, backend, monkeypatch):
  """ALiBi with one key and value head for 4 (multi-query) through the kernels: Triton and Mosaic lower the key and
  value blocks' index maps (head h // 4), 6 kernel calls for 2 layers, no L x L array."""
  text = _lowered_train_step('alibi', backend, platform, monkeypatch, num_kv_heads=1)
  calls = re.findall(r'custom_call @([\w$.]+)', text)
  assert calls.count(KERNEL_CALL[platform]) == 6, calls
  assert not re.search(rf'tensor<(\d+x)*{LENGTH}x{LENGTH}x', text)


def test_the_lowering_check_finds_a_full_position_term_where_there_is_one(monkeypatch):
  """The same check on the XLA core, which broadcasts T5's bias to B x H x L x L, finds it: the assertion
  above can fail."""
  monkeypatch.setattr(attention_core, 'current_backend', lambda: 'gpu')
  model = T.DecoderOnly(tiny('t5', attention_implementation='xla', num_heads=HEADS))
  inputs = jnp.zeros((2, LENGTH), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), inputs))
  text = jax.jit(model.apply).trace(params, inputs).lower(lowering_platforms=('cuda',)).as_text()
  assert re.search(rf'tensor<(\d+x)*{LENGTH}x{LENGTH}x', text)
