import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import attention_core
from tests.helpers import assert_causal, bidirectional, init, random_positions, tiny, tokens

L = 6


@pytest.mark.slow
@pytest.mark.parametrize('norm', ['post', 'pre'])
def test_decoder_only_is_causal(norm):
  config = tiny(norm=norm)
  model = T.DecoderOnly(config)
  x = tokens(1, L)
  assert_causal(model, init(model, x), (x,), L, config.model_dim)


@pytest.mark.slow
def test_encoder_decoder_decoder_is_causal():
  config = tiny()
  model = T.EncoderDecoder(config)
  source, target = tokens(1, 4, seed=1), tokens(1, L)
  assert_causal(model, init(model, source, target), (source, target), L, config.model_dim)


@pytest.mark.slow
def test_encoder_is_not_causal():
  """The gradient test can fail: the bidirectional encoder does see the future."""
  config = tiny()
  model = T.EncoderOnly(config.replace(pooling='mean'))
  x = tokens(1, L)
  params = init(model, x)
  grad = jax.grad(lambda p: model.apply(p, x.at[0, -1].set(3)).sum())(params)
  assert float(jnp.abs(grad['params']['encoder']['layer_0']['self_attention']['key']['kernel']).sum()) > 0
  stack = T.TransformerStack(config, 1, causal=False)
  embedded = jax.random.normal(jax.random.PRNGKey(0), (1, L, config.model_dim))
  stack_params = nn.meta.unbox(stack.init(jax.random.PRNGKey(1), embedded))
  # A random readout, not a plain sum: the pre-norm stack ends in a layer norm whose features sum to a
  # constant at initialisation (scale 1, bias 0), so the sum's gradient is zero up to rounding.
  readout = jax.random.normal(jax.random.PRNGKey(2), (config.model_dim,))
  jacobian = jax.jacrev(lambda e: stack.apply(stack_params, e)[0, 0] @ readout)(embedded)
  per_input_position = jnp.abs(jacobian[0]).sum(-1)
  assert bool(jnp.all(per_input_position > 1e-3)), per_input_position  # the first output sees every position


def _pad(x, extra, value=0):
  return jnp.concatenate([x, jnp.full((x.shape[0], extra), value, x.dtype)], axis=1)


@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_padding_does_not_change_unpadded_outputs(kind):
  config = tiny(kind)
  source, target = tokens(2, 5, seed=1), tokens(2, 4, seed=2)
  padded_source, padded_target = _pad(source, 3), _pad(target, 2)
  source_valid = jnp.arange(8)[None] < jnp.array([[5], [5]])
  target_valid = jnp.arange(6)[None] < jnp.array([[4], [4]])

  decoder_only = T.DecoderOnly(config)
  params = random_positions(init(decoder_only, padded_target))
  np.testing.assert_allclose(decoder_only.apply(params, padded_target, valid_BxL=target_valid)[:, :4],
                             decoder_only.apply(params, target), atol=1e-5)
  if not bidirectional(kind):
    return  # causal only: no encoder

  encoder_decoder = T.EncoderDecoder(config)
  params = random_positions(init(encoder_decoder, padded_source, padded_target))
  plain = encoder_decoder.apply(params, source, target)
  padded = encoder_decoder.apply(params, padded_source, padded_target, source_valid_BxLs=source_valid,
                                 target_valid_BxLt=target_valid)
  np.testing.assert_allclose(padded[:, :4], plain, atol=1e-5)

  encoder = T.TransformerStack(config, 2, causal=False)
  embedded = jax.random.normal(jax.random.PRNGKey(0), (2, 8, config.model_dim))
  params = random_positions(nn.meta.unbox(encoder.init(jax.random.PRNGKey(1), embedded)))
  np.testing.assert_allclose(encoder.apply(params, embedded, valid_BxL=source_valid)[:, :5],
                             encoder.apply(params, embedded[:, :5]), atol=1e-5)

  for pooling in ('mean', 'last'):
    classifier = T.EncoderOnly(config.replace(pooling=pooling))
    params = random_positions(init(classifier, padded_source))
    np.testing.assert_allclose(classifier.apply(params, padded_source, valid_BxL=source_valid),
                               classifier.apply(params, source), atol=1e-5, err_msg=pooling)


def test_last_pooling_reads_each_rows_last_valid_position():
  """Against a loop over the rows: row b's vector at index (valid length - 1), for ragged lengths."""
  hidden = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 4))
  lengths = [5, 1, 3]
  valid = jnp.arange(5)[None] < jnp.array(lengths)[:, None]
  expected = np.stack([np.asarray(hidden)[b, n - 1] for b, n in enumerate(lengths)])
  np.testing.assert_array_equal(T.models.pool(hidden, valid, 'last'), expected)
  np.testing.assert_array_equal(T.models.pool(hidden, None, 'last'), np.asarray(hidden)[:, -1])


def _models_and_inputs():
  config = tiny(dropout_rate=0.1, num_encoder_layers=1, num_decoder_layers=1)
  x = tokens(2, L)
  features = jax.random.normal(jax.random.PRNGKey(3), (2, L, 3))
  return [
      ('decoder_only', T.DecoderOnly(config), (x,)),
      ('encoder_decoder', T.EncoderDecoder(config), (x, tokens(2, 4, seed=5))),
      ('classifier', T.EncoderOnly(config), (x,)),
      ('regression', T.EncoderOnly(config.replace(input_features=3, num_outputs=1, pooling='mean')), (features,)),
      ('lstm_decoder_only', T.RecurrentDecoderOnly(config.replace(architecture='lstm')), (x,)),
      ('rnn_encoder_decoder', T.RecurrentEncoderDecoder(config.replace(architecture='rnn')),
       (x, tokens(2, 4, seed=5))),
      ('lstm_classifier', T.RecurrentEncoderOnly(config.replace(architecture='lstm')), (x,)),
  ]


@pytest.mark.slow
def test_jit_gives_the_results_of_eager_execution():
  """Eager against jitted, in training (dropout on) and in evaluation, for every model kind; one
  compile per model (both modes in one program)."""
  rngs = {'dropout': jax.random.PRNGKey(7)}
  for name, model, args in _models_and_inputs():
    params = init(model, *args)
    expected_eval = model.apply(params, *args)
    expected_train = model.apply(params, *args, deterministic=False, rngs=rngs)
    both = jax.jit(lambda p, *a, m=model: (m.apply(p, *a), m.apply(p, *a, deterministic=False, rngs=rngs)))
    jitted_eval, jitted_train = both(params, *args)
    np.testing.assert_allclose(jitted_train, expected_train, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(jitted_eval, expected_eval, atol=1e-5, err_msg=name)
    assert not np.allclose(expected_eval, expected_train), f'{name}: dropout had no effect'


def test_wrong_rank_or_width_names_expected_and_actual_shape():
  config = tiny()
  model = T.DecoderOnly(config)
  params = init(model, tokens(1, 4))
  with pytest.raises(ValueError, match=r'expected token ids of shape \[batch, length\], got shape \(4,\)'):
    model.apply(params, jnp.ones((4,), jnp.int32))
  regression = T.EncoderOnly(config.replace(input_features=3, pooling='mean'))
  features = jnp.ones((1, 4, 3))
  params = init(regression, features)
  with pytest.raises(ValueError, match=r'expected features of shape \[batch, length, 3\].*got shape \(1, 4, 5\)'):
    regression.apply(params, jnp.ones((1, 4, 5)))
  stack = T.TransformerStack(config, 1, causal=True)
  with pytest.raises(AssertionError, match=r'32.*16|16.*32'):
    stack.init(jax.random.PRNGKey(0), jnp.ones((1, 4, 16)))


def test_tied_embeddings_share_the_table_and_untied_add_an_output_layer():
  x = tokens(1, 4)
  tied = init(T.DecoderOnly(tiny(tie_embeddings=True)), x)['params']['embedding']
  untied = init(T.DecoderOnly(tiny(tie_embeddings=False)), x)['params']['embedding']
  assert set(tied) == {'embedding'}
  assert set(untied) == {'embedding', 'output'}


def test_presets():
  base = T.base_preset()
  assert (base.model_dim, base.num_heads, base.head_dim, base.feed_forward_dim) == (512, 8, 64, 2048)
  assert (base.num_encoder_layers, base.num_decoder_layers, base.dropout_rate, base.norm) == (6, 6, 0.1, 'post')
  params = jax.eval_shape(lambda: T.EncoderDecoder(base.replace(vocab_size=37000)).init(
      jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)))
  count = sum(np.prod(p.shape) for p in jax.tree_util.tree_leaves(params))
  assert 60e6 < count < 66e6, count  # the paper's base model has about 65M parameters
  assert T.small_preset().model_dim < 512


@pytest.mark.parametrize('field,value,message', [
    ('model_dim', 30, 'num_heads: got 4; valid: a divisor of model_dim=30'),
    ('num_heads', 0, 'num_heads: got 0; valid: a positive integer'),
    ('norm', 'middle', "norm: got 'middle'; valid: post, pre"),
    ('dropout_rate', 1.5, 'dropout_rate: got 1.5'),
])
def test_invalid_model_config_names_field_value_and_valid(field, value, message):
  with pytest.raises(ValueError, match=message):
    tiny(**{field: value})


def test_unknown_position_kind_lists_valid_ones():
  with pytest.raises(ValueError, match="position.kind: got 'fourier'; valid: " + ', '.join(sorted(T.VARIANTS)) + '$'):
    T.PositionConfig(kind='fourier')


@pytest.mark.slow
def test_greedy_generate_matches_a_naive_argmax_loop():
  config = tiny()
  model = T.DecoderOnly(config)
  prompt = tokens(2, 3)
  params = init(model, prompt)
  generated = jax.jit(lambda p, x: T.decoder_only_generate(model, p, x, 4))(params, prompt)
  naive = prompt
  for _ in range(4):
    naive = jnp.concatenate([naive, jnp.argmax(model.apply(params, naive)[:, -1], -1)[:, None]], axis=1)
  np.testing.assert_array_equal(generated, naive)


@pytest.mark.slow
def test_encoder_decoder_greedy_decode_matches_a_naive_loop():
  config = tiny()
  model = T.EncoderDecoder(config)
  source = tokens(2, 5)
  params = init(model, source, source)
  decoded = T.greedy_decode(model, params, source, bos_id=1, max_length=4)
  assert decoded.shape == (2, 4)
  target = jnp.ones((2, 1), jnp.int32)
  for _ in range(4):
    target = jnp.concatenate([target, jnp.argmax(model.apply(params, source, target)[:, -1], -1)[:, None]], 1)
  np.testing.assert_array_equal(decoded, target[:, 1:])


@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_fused_attention_path_gives_the_explicit_paths_outputs(kind, monkeypatch):
  """Where fused attention is preferred (GPUs) and no caller collects the weights, attention goes
  through jax.nn.dot_product_attention (except Shaw, whose values term needs the weights); the
  outputs must not change."""
  calls = []
  monkeypatch.setattr(attention_core, 'current_backend', lambda: 'gpu')  # float32: XLA's fused attention, not cuDNN
  original = attention_core.fused_attention
  monkeypatch.setattr(attention_core, 'fused_attention', lambda *a, **k: calls.append(1) or original(*a, **k))
  shaw = kind in ('shaw', 'stick_breaking')  # a values term, or weights that are not a softmax: never fused
  # (model, inputs, attention layers that may fuse): 2 layers per stack; cross-attention without
  # alignment carries no position hooks, so it fuses even for Shaw.
  cases = [(T.DecoderOnly(tiny(kind)), (tokens(2, 7),), 0 if shaw else 2)]
  if bidirectional(kind):
    cases += [
        (T.EncoderDecoder(tiny(kind)), (tokens(2, 6), tokens(2, 7, seed=1)), 2 if shaw else 6),
        (T.EncoderDecoder(tiny(kind, aligned_cross_attention=True)), (tokens(2, 7), tokens(2, 7, seed=1)),
         0 if shaw else 6),
        (T.EncoderOnly(tiny(kind)), (tokens(2, 7),), 0 if shaw else 2)]
  for model, args, fusable in cases:
    params = random_positions(init(model, *args))
    calls.clear()
    fused = model.apply(params, *args)
    assert len(calls) == fusable, (kind, type(model).__name__, len(calls))
    calls.clear()
    explicit, _ = model.apply(params, *args, mutable=['intermediates'])
    assert not calls
    np.testing.assert_allclose(fused, explicit, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('kind, policy', [pytest.param('shaw', 'block', marks=pytest.mark.slow),
                                          pytest.param('t5', 'block', marks=pytest.mark.slow), ('rope', 'block'),
                                          ('t5', 'matmuls')])
def test_rematerialised_layers_give_the_same_outputs_and_gradients(kind, policy):
  inputs = tokens(2, 7)
  plain = T.DecoderOnly(tiny(kind, dropout_rate=0.1))
  remat = T.DecoderOnly(tiny(kind, dropout_rate=0.1, remat=policy))
  params = init(plain, inputs)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(init(remat, inputs))

  def loss(model, p):
    logits = model.apply(p, inputs, deterministic=False, rngs={'dropout': jax.random.PRNGKey(3)})
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  plain_value, plain_grads = jax.value_and_grad(lambda p: loss(plain, p))(params)
  remat_value, remat_grads = jax.value_and_grad(lambda p: loss(remat, p))(params)
  np.testing.assert_allclose(plain_value, remat_value, rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(plain_grads), jax.tree_util.tree_leaves(remat_grads)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_bfloat16_compute_keeps_float32_parameters_and_close_outputs(kind):
  """Activations in bfloat16, parameters and logits in float32; outputs within bfloat16's
  precision (8 bits of mantissa) of the float32 model with the same parameters."""
  inputs = tokens(2, 7)
  full = T.DecoderOnly(tiny(kind))
  half = T.DecoderOnly(tiny(kind, compute_dtype='bfloat16'))
  params = init(half, inputs)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(params))
  hidden = {}

  def record(next_fun, args, kwargs, context):
    output = next_fun(*args, **kwargs)
    if isinstance(context.module, T.TransformerStack) and context.method_name == '__call__':
      hidden[context.module.name] = output.dtype
    return output

  with nn.intercept_methods(record):
    low = half.apply(params, inputs)
  assert hidden == {'decoder': jnp.bfloat16}
  assert low.dtype == jnp.float32
  high = full.apply(params, inputs)
  scale = float(jnp.abs(high).max())
  np.testing.assert_allclose(low, high, atol=0.05 * scale)
  grads = jax.grad(lambda p: jnp.mean(half.apply(p, inputs)))(params)
  assert all(bool(jnp.all(jnp.isfinite(g))) and g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(grads))


def test_unknown_compute_dtype_names_the_field():
  with pytest.raises(ValueError, match="compute_dtype: got 'float16'; valid: float32, bfloat16"):
    tiny('rope', compute_dtype='float16')
