"""LongRoPE (rope_extension=longrope, transformer/positions/extension.py) against Hugging Face's published
formula for rope_type 'longrope', its choice of factors, the cache, its refusals, and the reader of a
Hugging Face config (experiments/evaluation/rope_scaling.py)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from experiments.evaluation import rope_scaling
from tests.helpers import cached_logits, init, tiny, tokens
from transformer.blocks import sequence_length_of
from transformer.positions import extension, rope

HEAD_DIM, BASE, ORIGINAL = 16, 10000.0, 64
SHORT = np.array([1.0, 1.02, 1.05, 1.1, 1.2, 1.4, 1.7, 2.0])
LONG = np.array([1.0, 1.3, 1.9, 2.8, 4.4, 7.5, 12.0, 20.0])


def _settings(factor, **fields):
  return rope.RopeSettings(**dict(dict(rope_extension='longrope', extension_factor=factor, original_length=ORIGINAL,
                                       longrope_short_factors=' '.join(map(str, SHORT)),
                                       longrope_long_factors=' '.join(map(str, LONG))), **fields))


def hugging_face_longrope(factor, sequence_length, attention_factor=None):
  """transformers' _compute_longrope_parameters and its rotary embedding, transcribed in numpy: the factor
  list is long_factor when the sequence passes original_max_position_embeddings, else short_factor;
  inv_freq = 1 / (ext_factors * base^(arange(0, dim, 2) / dim)); attention_factor, when the config gives
  none, sqrt(1 + log(factor) / log(original)) for factor > 1, else 1; cos and sin are multiplied by it."""
  ext = LONG if sequence_length > ORIGINAL else SHORT
  inv_freq = 1.0 / (ext * BASE ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM))
  if attention_factor is None:
    attention_factor = math.sqrt(1 + math.log(factor) / math.log(ORIGINAL)) if factor > 1.0 else 1.0
  return inv_freq, attention_factor


@pytest.mark.parametrize('factor,attention', [(4.0, None), (1.0, None), (8.0, 1.3)])
def test_frequencies_and_attention_factor_are_hugging_faces(factor, attention):
  """A model run at s = 4 or 8 (a sequence of 4 or 8 times the original) takes the long set, one at s = 1 the
  short set; the attention factor is HF's default or the config's."""
  fields = {} if attention is None else dict(longrope_attention_factor=attention)
  theta, magnitude = extension.extended_frequencies(rope.rope_frequencies(HEAD_DIM, BASE), _settings(factor, **fields))
  expected_theta, expected_magnitude = hugging_face_longrope(factor, int(factor * ORIGINAL), attention)
  np.testing.assert_allclose(theta, expected_theta, rtol=1e-6)
  assert math.isclose(magnitude, expected_magnitude, rel_tol=1e-7)


def test_the_rotation_multiplies_cos_and_sin_by_the_attention_factor():
  """Pair p of a vector at position m: (x_2p cos - x_2p+1 sin, x_2p sin + x_2p+1 cos) times the attention
  factor, angle m inv_freq_p (HF rotates halves instead of neighbours; per pair it is this)."""
  x_1xLx1xK = jax.random.normal(jax.random.PRNGKey(0), (1, 300, 1, HEAD_DIM))
  positions = jnp.arange(300)[None]
  theta, magnitude = extension.extended_frequencies(rope.rope_frequencies(HEAD_DIM, BASE), _settings(4.0))
  ours = np.asarray(rope.rotate_by(x_1xLx1xK, positions, theta, magnitude=magnitude))[0, :, 0]
  inv_freq, attention_factor = hugging_face_longrope(4.0, 256)
  angle = np.arange(300)[:, None] * inv_freq[None]
  cos, sin = np.cos(angle) * attention_factor, np.sin(angle) * attention_factor
  x = np.asarray(x_1xLx1xK, np.float64)[0, :, 0]
  even, odd = x[:, 0::2], x[:, 1::2]
  np.testing.assert_allclose(ours[:, 0::2], even * cos - odd * sin, atol=2e-5)
  np.testing.assert_allclose(ours[:, 1::2], even * sin + odd * cos, atol=2e-5)


def test_factors_of_one_at_s_1_are_rope():
  ones = ' '.join(['1'] * (HEAD_DIM // 2))
  theta, magnitude = extension.extended_frequencies(
      rope.rope_frequencies(HEAD_DIM), _settings(1.0, longrope_short_factors=ones))
  np.testing.assert_array_equal(theta, rope.rope_frequencies(HEAD_DIM))
  assert magnitude == 1.0


@pytest.mark.parametrize('kind', ['rope', 'p_rope'])
def test_cached_decoding_equals_the_full_pass(kind):
  """Chunks of 2, 1, 1 and 3 tokens through the cache give the full pass's logits at s = 2.5, and the
  long factors changed them."""
  inputs = tokens(2, 7, seed=3)
  factors = dict(longrope_short_factors='1 1 1 1', longrope_long_factors='1 1.5 3 6')
  model = T.DecoderOnly(tiny(kind, position=dict(rope_extension='longrope', extension_factor=2.5, original_length=3,
                                                 **factors)))
  params = init(model, inputs)
  whole = model.apply(params, inputs)
  np.testing.assert_allclose(cached_logits(model, params, inputs, (2, 1, 1, 3)), whole, atol=2e-5, rtol=1e-5)
  assert not np.allclose(whole, T.DecoderOnly(tiny(kind)).apply(params, inputs), atol=1e-4)


@pytest.mark.parametrize('factor,served', [(4.0, ORIGINAL - 1), (4.0, ORIGINAL), (4.0, ORIGINAL + 1), (4.0, 1000),
                                           (1.0, ORIGINAL + 1), (1.0, ORIGINAL)])
def test_by_length_the_sequence_picks_the_set_as_hugging_face_does(factor, served):
  """With longrope_by_length the served length picks the set (long once it passes the original length) and
  the attention factor is s's at every length, as HF's rotary embedding computes them; None is s L."""
  settings = _settings(factor, longrope_by_length=True)
  theta_P = rope.rope_frequencies(HEAD_DIM, BASE)
  expected_theta, expected_magnitude = hugging_face_longrope(factor, served)
  for length in (served, jnp.asarray(served, jnp.int32)):  # a full pass's static length, a cache's traced one
    theta, magnitude = extension.extended_frequencies(theta_P, settings, length)
    np.testing.assert_allclose(theta, expected_theta, rtol=1e-6)
    assert math.isclose(magnitude, expected_magnitude, rel_tol=1e-7)
  np.testing.assert_allclose(extension.extended_frequencies(theta_P, settings)[0],
                             hugging_face_longrope(factor, int(factor * ORIGINAL))[0], rtol=1e-6)


def _by_length_model(original, long_factors='1 1.5 3 6', by_length=True, **position):
  return T.DecoderOnly(tiny('rope', position=dict(
      rope_extension='longrope', extension_factor=2.5, original_length=original, longrope_by_length=by_length,
      longrope_short_factors='1 1.2 0.8 2', longrope_long_factors=long_factors, **position)))


def test_by_length_a_model_reads_the_short_set_up_to_the_original_length_and_the_long_set_past_it():
  """At s = 2.5 a 7-token input past L = 6 is the model with the long set (the default, by factor); one
  within L = 8 is the model whose long set is the short one, the attention factor s's in both."""
  inputs = tokens(2, 7, seed=5)
  params = init(_by_length_model(6), inputs)
  past = _by_length_model(6).apply(params, inputs)
  np.testing.assert_allclose(past, _by_length_model(6, by_length=False).apply(params, inputs), atol=1e-6)
  within = _by_length_model(8).apply(params, inputs)
  np.testing.assert_allclose(within, _by_length_model(8, '1 1.2 0.8 2', by_length=False).apply(params, inputs),
                             atol=1e-6)
  assert not np.allclose(within, _by_length_model(8, by_length=False).apply(params, inputs), atol=1e-3)


def test_by_length_padding_changes_nothing():
  """7 real tokens padded to 12 (valid False past them) within L = 8: the short set, as unpadded. Read as
  12 real tokens (no valid mask) the same row passes L and takes the long set: the causal outputs of the
  first 7 then differ."""
  inputs = tokens(2, 7, seed=6)
  padded = jnp.pad(inputs, ((0, 0), (0, 5)))
  valid = jnp.arange(12)[None, :] < 7
  model = _by_length_model(8)
  params = init(model, inputs)
  unpadded = model.apply(params, inputs)
  np.testing.assert_allclose(model.apply(params, padded, valid_BxL=valid)[:, :7], unpadded, atol=2e-5, rtol=1e-5)
  assert not np.allclose(model.apply(params, padded)[:, :7], unpadded, atol=1e-3)


def test_the_sequence_length_is_one_past_the_largest_position_of_a_real_token():
  """Hugging Face's count: padding excluded, and a packed row's longest document where positions restart."""
  positions = jnp.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 2]])
  assert int(sequence_length_of(positions, None)) == 6
  assert int(sequence_length_of(positions, positions < 3)) == 3
  assert int(sequence_length_of(positions[1:], None)) == 3
  assert int(sequence_length_of(jnp.arange(6)[None], jnp.array([[True] * 4 + [False] * 2] * 2))) == 4  # 1 x L, B x L


def test_keep_first_rotates_the_first_positions_as_trained_as_the_authors_code_does():
  """n-hat = 5: the authors' mixed embedding, cos and sin of the long set times the attention factor with
  their first 5 rows replaced by RoPE's own (no factor), transcribed in numpy."""
  layer = rope.Rope(settings=_settings(4.0, longrope_keep_first=5), num_heads=1, head_dim=HEAD_DIM,
                    model_dim=HEAD_DIM, num_layers=1, causal=True)
  x_1xLx1xK = jax.random.normal(jax.random.PRNGKey(2), (1, 40, 1, HEAD_DIM))
  positions = jnp.arange(40)[None]
  rotated, _ = layer.apply({}, x_1xLx1xK, x_1xLx1xK, positions, positions, method=layer.rotate)
  inv_freq, attention_factor = hugging_face_longrope(4.0, 256)
  angle = np.arange(40)[:, None] * inv_freq[None]
  cos, sin = np.cos(angle) * attention_factor, np.sin(angle) * attention_factor
  trained_angle = np.arange(5)[:, None] * BASE ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)[None]
  cos[:5], sin[:5] = np.cos(trained_angle), np.sin(trained_angle)
  x = np.asarray(x_1xLx1xK, np.float64)[0, :, 0]
  even, odd = x[:, 0::2], x[:, 1::2]
  ours = np.asarray(rotated)[0, :, 0]
  np.testing.assert_allclose(ours[:, 0::2], even * cos - odd * sin, atol=2e-5)
  np.testing.assert_allclose(ours[:, 1::2], even * sin + odd * cos, atol=2e-5)


def test_keep_first_cached_decoding_is_the_full_pass_and_zero_keeps_nothing():
  inputs = tokens(2, 7, seed=4)
  model = _by_length_model(3, by_length=False, longrope_keep_first=2)
  params = init(model, inputs)
  whole = model.apply(params, inputs)
  np.testing.assert_allclose(cached_logits(model, params, inputs, (2, 1, 1, 3)), whole, atol=2e-5, rtol=1e-5)
  assert not np.allclose(whole, _by_length_model(3, by_length=False).apply(params, inputs), atol=1e-4)
  np.testing.assert_array_equal(_by_length_model(3, by_length=False, longrope_keep_first=0).apply(params, inputs),
                                _by_length_model(3, by_length=False).apply(params, inputs))


@pytest.mark.parametrize('original', [3, 8])
def test_by_length_cached_decoding_is_the_full_pass_over_the_capacity(original):
  """A capacity of 7 past L = 3 rotates with the long set from the first chunk (2 tokens, within L), one
  within L = 8 with the short set: chunks of 2, 1, 1 and 3 give the full pass's logits either way."""
  inputs = tokens(2, 7, seed=3)
  model = _by_length_model(original)
  params = init(model, inputs)
  whole = model.apply(params, inputs)
  np.testing.assert_allclose(cached_logits(model, params, inputs, (2, 1, 1, 3)), whole, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('fields,message', [
    (dict(longrope_long_factors=''), r"position\.longrope_long_factors: got ''; valid: the rescale factor"),
    (dict(longrope_short_factors='1 two 3'), r"position\.longrope_short_factors: got '1 two 3'; valid: numbers > 0"),
    (dict(longrope_short_factors='1 0 3'), r'position\.longrope_short_factors: got .*; valid: numbers > 0'),
    (dict(original_length=1), r'position\.original_length: got 1; valid: the training length \(> 1\)'),
    (dict(longrope_attention_factor=-1.0), r'position\.longrope_attention_factor: got -1.0; valid: a finite'),
    (dict(longrope_by_length='yes'), r"position\.longrope_by_length: got 'yes'; valid: true or false"),
    (dict(longrope_keep_first=-1), r'position\.longrope_keep_first: got -1; valid: an integer >= 0'),
])
def test_bad_settings_are_refused_in_one_line(fields, message):
  with pytest.raises(ValueError, match=message):
    _settings(4.0, **fields)


def test_a_factor_list_of_the_wrong_length_is_refused_before_tracing():
  config = tiny('rope', position=dict(rope_extension='longrope', extension_factor=2.0, original_length=8,
                                      longrope_short_factors='1 1 1', longrope_long_factors='1 1 1 1'))
  with pytest.raises(ValueError, match=r"position\.longrope_short_factors: got '3 numbers'; valid: 4, one per pair"):
    init(T.DecoderOnly(config), tokens(1, 4))


def _hf_config(tmp_path, **scaling):
  path = tmp_path / 'config.json'
  path.write_text(json.dumps({'model_type': 'phi3', 'rope_scaling': dict(
      dict(type='longrope', short_factor=[1.0, 1.5], long_factor=[2, 4.25]), **scaling)}))
  return str(path)


def test_the_factors_are_read_from_a_hugging_face_config(tmp_path):
  overrides = dict(rope_scaling.longrope_overrides(_hf_config(tmp_path, attention_factor=1.19)))
  assert overrides == {'longrope_short_factors': '1.0 1.5', 'longrope_long_factors': '2.0 4.25',
                       'longrope_attention_factor': 1.19}
  settings = rope.RopeSettings(rope_extension='longrope', extension_factor=2.0, original_length=8, **overrides)
  theta, magnitude = extension.extended_frequencies(jnp.array([1.0, 0.1]), settings)
  np.testing.assert_allclose(theta, [0.5, 0.1 / 4.25], rtol=1e-6)
  assert magnitude == 1.19
  assert dict(rope_scaling.longrope_overrides(_hf_config(tmp_path)))['longrope_attention_factor'] == 0.0


@pytest.mark.parametrize('scaling,message', [
    (dict(type='yarn'), "rope_scaling of type 'yarn'; valid: type longrope or su"),
    (dict(long_factor=[1, -2]), r'rope_scaling\.long_factor \[1, -2\]; valid: a list of numbers > 0'),
    (dict(short_factor='1 2'), r"rope_scaling\.short_factor '1 2'; valid"),
    (dict(attention_factor=0), r'rope_scaling\.attention_factor 0; valid: a number > 0, or absent'),
])
def test_a_config_without_longrope_factors_is_refused_naming_the_file(tmp_path, scaling, message):
  path = _hf_config(tmp_path, **scaling)
  with pytest.raises(ValueError, match=f'^--rope_scaling: {path}: got {message}'):
    rope_scaling.longrope_overrides(path)
