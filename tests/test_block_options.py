"""The block by configuration (model.norm_type, layer_norm_eps, the gated activations, use_bias, qkv_bias,
parallel_residual): RMSNorm against flax.linen.RMSNorm, the gated feed-forward against its formula, and a whole
one-layer decoder of the Llama-style block against a NumPy transcription, sequential and parallel."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import layers
from tests.helpers import init, tiny, tokens


@pytest.mark.parametrize('eps', [1e-6, 1e-5, 0.5])
def test_rms_norm_is_flax_rms_norm(eps):
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 16)) * 3.0 + 1.0
  scale = jax.random.uniform(jax.random.PRNGKey(1), (16,), minval=0.5, maxval=1.5)
  reference = nn.RMSNorm(epsilon=eps).apply({'params': {'scale': scale}}, x)
  np.testing.assert_allclose(layers.rms_norm(x, scale, eps), reference, rtol=1e-6, atol=1e-6)
  module = layers.RMSNorm(eps)
  np.testing.assert_allclose(module.apply({'params': {'scale': scale}}, x), reference, rtol=1e-6, atol=1e-6)
  assert not np.allclose(layers.rms_norm(x[..., :1] * 1e-3, scale[:1], eps), layers.rms_norm(x[..., :1] * 1e-3,
                                                                                                scale[:1], 2 * eps))


def _silu(x):
  return x / (1.0 + np.exp(-x))


def _gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize('activation, act', [('swiglu', _silu), ('geglu', _gelu_tanh)])
def test_the_gated_feed_forward_is_its_formula(activation, act):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 8)).astype(np.float32)
  gate, up, down = (rng.normal(size=shape).astype(np.float32) * 0.3 for shape in ((8, 12), (8, 12), (12, 8)))
  gate_bias, up_bias, down_bias = (rng.normal(size=n).astype(np.float32) for n in (12, 12, 8))
  expected = (act(x @ gate + gate_bias) * (x @ up + up_bias)) @ down + down_bias
  got = layers.gated_feed_forward(jnp.asarray(x), gate, gate_bias, up, up_bias, down, down_bias, activation)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="activation: got 'relu'"):
    layers.gated_feed_forward(jnp.asarray(x), gate, gate_bias, up, up_bias, down, down_bias, 'relu')


def test_gelu_is_the_tanh_approximation_and_gelu_exact_is_x_phi_x():
  """gelu: GPT-2's gelu_new, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); gelu_exact: x Phi(x), Phi the normal
  CDF (scipy.stats), which GPT-NeoX and Pythia use. The two differ by up to ~5e-4."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  x = np.linspace(-6.0, 6.0, 241)
  tanh_form = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
  np.testing.assert_allclose(np.asarray(layers.ACTIVATIONS['gelu'](jnp.asarray(x))), tanh_form, atol=1e-6)
  np.testing.assert_allclose(np.asarray(layers.ACTIVATIONS['gelu_exact'](jnp.asarray(x))), x * stats.norm.cdf(x),
                             atol=1e-6)
  assert np.abs(tanh_form - x * stats.norm.cdf(x)).max() > 1e-4  # the check above can tell them apart


def test_the_default_block_keeps_its_parameters_and_the_options_change_them():
  """Defaults are today's block (every recorded run keeps its meaning): the same parameter names; the options
  add the gate, drop the biases, keep the query, key and value biases, and swap LayerNorm's offset away."""
  x = tokens(2, 6)

  def names(**changes):
    params = init(T.DecoderOnly(tiny('rope', num_decoder_layers=1, **changes)), x)
    return {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}

  default = names()
  assert "['params']['decoder']['layer_0']['feed_forward']['hidden_bias']" in default
  assert "['params']['decoder']['layer_0']['self_attention_residual']['LayerNorm_0']['bias']" in default
  llama = names(norm_type='rmsnorm', activation='swiglu', use_bias=False)
  assert not any(name.endswith("bias']") for name in llama)
  assert "['params']['decoder']['layer_0']['feed_forward']['gate_kernel']" in llama
  assert "['params']['decoder']['layer_0']['self_attention_residual']['RMSNorm_0']['scale']" in llama
  qwen = names(norm_type='rmsnorm', activation='swiglu', use_bias=False, qkv_bias=True)
  assert sorted(name for name in qwen if name.endswith("bias']")) == [
      f"['params']['decoder']['layer_0']['self_attention']['{p}']['bias']" for p in ('key', 'query', 'value')]


def _transcription(params, ids, parallel: bool, eps: float):
  """The one-layer pre-LN decoder-only model with RMSNorm, SwiGLU and no positions, in NumPy."""
  p = jax.tree_util.tree_map(np.asarray, params)['params']
  layer, table = p['decoder']['layer_0'], p['embedding']['embedding']['embedding']
  width = table.shape[1]
  heads = 4

  def norm(x, scale):
    return x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + eps) * scale

  def project(x, name):
    weights = layer['self_attention'][name]
    return x @ weights['kernel'] + weights.get('bias', 0.0)

  def attention(x):
    q, k, v = (project(x, name).reshape(*x.shape[:2], heads, width // heads) for name in ('query', 'key', 'value'))
    logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(width // heads)
    length = x.shape[1]
    logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum('bhqk,bkhd->bqhd', weights, v).reshape(x.shape)
    return out @ layer['self_attention']['out']['kernel']

  def feed_forward(x):
    weights = layer['feed_forward']
    return (_silu(x @ weights['gate_kernel']) * (x @ weights['hidden_kernel'])) @ weights['output_kernel']

  x = table[np.asarray(ids)] * np.sqrt(width)
  attention_norm = layer['self_attention_residual']['RMSNorm_0']['scale']
  feed_forward_norm = layer['feed_forward_residual']['RMSNorm_0']['scale']
  if parallel:
    x = x + attention(norm(x, attention_norm)) + feed_forward(norm(x, feed_forward_norm))
  else:
    x = x + attention(norm(x, attention_norm))
    x = x + feed_forward(norm(x, feed_forward_norm))
  return norm(x, p['decoder']['final_norm']['scale']) @ table.T


@pytest.mark.parametrize('parallel', [False, True])
@pytest.mark.parametrize('qkv_bias', [False, True])
def test_a_llama_style_decoder_is_its_transcription(parallel, qkv_bias):
  """RMSNorm (an eps of 0.5, large enough that ignoring it shows), SwiGLU, no biases but Qwen2's optional query, key
  and value ones, sequential or parallel residual: the model's logits are the NumPy transcription's, and the
  parallel block differs from the sequential."""
  ids = tokens(2, 7)
  changes = dict(num_decoder_layers=1, norm_type='rmsnorm', layer_norm_eps=0.5, activation='swiglu', use_bias=False,
                 qkv_bias=qkv_bias, attention_block_size=0)
  model = T.DecoderOnly(tiny('none', parallel_residual=parallel, **changes))
  params = init(model, ids)
  params = jax.tree_util.tree_map(lambda w: w + 0.1 * jax.random.normal(jax.random.PRNGKey(w.size), w.shape), params)
  np.testing.assert_allclose(model.apply(params, ids), _transcription(params, ids, parallel, 0.5), rtol=2e-4,
                             atol=2e-4)
  other = T.DecoderOnly(tiny('none', parallel_residual=not parallel, **changes))
  assert not np.allclose(other.apply(params, ids), model.apply(params, ids), atol=1e-3)


def test_block_options_that_cannot_be_served_are_refused():
  with pytest.raises(ValueError, match="norm_type: got 'batchnorm'"):
    tiny(norm_type='batchnorm')
  with pytest.raises(ValueError, match="activation: got 'swish'"):
    tiny(activation='swish')
  with pytest.raises(ValueError, match='parallel_residual: got True.*norm=.post.'):
    tiny(norm='post', parallel_residual=True)
  with pytest.raises(ValueError, match='layer_norm_eps: got 0.0'):
    tiny(layer_norm_eps=0.0)
  model = T.EncoderDecoder(tiny('rope', parallel_residual=True))
  with pytest.raises(ValueError, match='parallel_residual: got True in a layer with cross-attention'):
    init(model, tokens(2, 5), tokens(2, 5))


def test_the_preflight_counts_the_gate_and_the_biases_before_anything_is_spent():
  """The parameter and optimizer bytes the preflight says before a run (runs/preflight.planned, from shapes) grow
  by the gate's D x F matrix (and its bias) per layer and shrink by every bias dropped."""
  from configs import smoke
  from experiments.runs import preflight, settings
  from tests.helpers import with_overrides

  def planned(**changes):
    experiment = settings.from_config_dict(with_overrides(smoke.get_config(), changes), 1)
    return experiment.model, preflight.planned(experiment, 1)[4]

  model, relu = planned()
  _, swiglu = planned(**{'model.activation': 'swiglu'})
  gate = model.num_decoder_layers * (model.model_dim + 1) * model.feed_forward_dim * 4  # its kernel and bias
  assert swiglu['parameters'] - relu['parameters'] == gate
  assert swiglu['optimizer_state'] - relu['optimizer_state'] == 2 * gate  # Adam's two moments
  _, unbiased = planned(**{'model.use_bias': False})
  biases = model.num_decoder_layers * (4 * model.model_dim + model.feed_forward_dim + model.model_dim) * 4
  assert relu['parameters'] - unbiased['parameters'] == biases


def _qk_model(qk_norm):
  config = T.tiny_preset(T.PositionConfig('rope'), num_encoder_layers=0, num_decoder_layers=1, vocab_size=16,
                         num_kv_heads=2, qk_norm=qk_norm, layer_norm_eps=1e-12)
  return T.DecoderOnly(config)


def _scaled_query_rows(variables, rows: slice, factor: float):
  """The variables with the query projection's output features `rows` multiplied by factor."""
  params = jax.tree_util.tree_map(lambda x: x, nn.meta.unbox(variables))
  kernel = params['params']['decoder']['layer_0']['self_attention']['query']['kernel']
  params['params']['decoder']['layer_0']['self_attention']['query']['kernel'] = kernel.at[:, rows].multiply(factor)
  return params


@pytest.mark.parametrize('qk_norm', ['none', 'head', 'projection'])
def test_qk_norm_removes_the_scale_of_each_head_or_of_the_whole_projection(qk_norm):
  """RMSNorm of the queries over each head's width (Qwen3, Gemma 3) makes a head's query scale irrelevant; over the
  whole projection (OLMo 2) only a scale of every head at once. Scales: K (head) or H K and G K (projection)."""
  model = _qk_model(qk_norm)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 16, (2, 9)))
  variables = model.init(jax.random.PRNGKey(0), tokens)
  attention = nn.meta.unbox(variables)['params']['decoder']['layer_0']['self_attention']
  head_dim = model.config.head_dim
  if qk_norm == 'none':
    assert 'query_norm' not in attention
  else:
    widths = {'head': (head_dim, head_dim), 'projection': (4 * head_dim, 2 * head_dim)}[qk_norm]
    assert (attention['query_norm']['scale'].shape[0], attention['key_norm']['scale'].shape[0]) == widths
  base = np.asarray(model.apply(variables, tokens))
  one_head = np.asarray(model.apply(_scaled_query_rows(variables, slice(0, head_dim), 5.0), tokens))
  every_head = np.asarray(model.apply(_scaled_query_rows(variables, slice(None), 5.0), tokens))
  assert np.allclose(one_head, base, atol=1e-5) == (qk_norm == 'head')
  assert np.allclose(every_head, base, atol=1e-5) == (qk_norm != 'none')


def test_the_final_logit_softcap_is_c_tanh_of_the_logits():
  config = T.tiny_preset(T.PositionConfig('rope'), num_encoder_layers=0, num_decoder_layers=1, vocab_size=16)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 16, (2, 9)))
  plain = T.DecoderOnly(config)
  variables = plain.init(jax.random.PRNGKey(0), tokens)
  variables = jax.tree_util.tree_map(lambda x: x, nn.meta.unbox(variables))
  variables['params']['embedding']['embedding']['embedding'] *= 8  # logits well past the cap
  logits = np.asarray(plain.apply(variables, tokens), np.float64)
  capped = np.asarray(T.DecoderOnly(config.replace(final_logit_softcap=3.0)).apply(variables, tokens))
  assert np.abs(capped).max() < 3.0 < np.abs(logits).max()
  np.testing.assert_allclose(capped, 3.0 * np.tanh(logits / 3.0), atol=1e-4, rtol=1e-4)
  with pytest.raises(ValueError, match=r'final_logit_softcap: got -1.0; valid: a finite number >= 0'):
    config.replace(final_logit_softcap=-1.0)
  with pytest.raises(ValueError, match=r"qk_norm: got 'layer'; valid: none, head, projection"):
    config.replace(qk_norm='layer')
