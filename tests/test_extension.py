"""Context extension of the rotary variants (transformer/positions/extension.py): every method at factor 1
is RoPE, the frequencies and YaRN's temperature against values worked from the papers' formulas,
position interpolation against RoPE at positions m / s, dynamic NTK's lengths, cached decoding against
the full pass for every method, and float32 angles under bfloat16 compute."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer.positions import extension, rope
from tests.helpers import cached_logits, init, tiny, tokens

ROTARY = ('rope', 'p_rope', 'xpos')
STATIC = ('pi', 'ntk', 'yarn', 'llama3')
HEAD_DIM, BASE = 8, 10000.0
THETA = np.array([1.0, 0.1, 0.01, 0.001])  # 10000^(-2p/8), p = 0..3


def _settings(method: str, factor: float = 1.0, original_length: int = 128, **fields):
  return rope.RopeSettings(rope_extension=method, extension_factor=factor, original_length=original_length, **fields)


def _frequencies(method, factor):
  theta, magnitude = extension.extended_frequencies(rope.rope_frequencies(HEAD_DIM, BASE), _settings(method, factor))
  return np.asarray(theta), magnitude


def test_rope_frequencies_are_the_ones_the_hand_values_start_from():
  np.testing.assert_allclose(rope.rope_frequencies(HEAD_DIM, BASE), THETA, rtol=1e-6)


@pytest.mark.parametrize('method, factor, expected, magnitude', [
    # NTK: base' = 10000 * s^(8/6), theta_p = base'^(-p/4).  s = 2: base' = 25198.42;  s = 8: base' = 160000.
    ('ntk', 2.0, [1.0, 0.07937005, 0.006299605, 0.0005], 1.0),
    ('ntk', 8.0, [1.0, 0.05, 0.0025, 0.000125], 1.0),
    # YaRN, L = 128: r_p = 128 theta_p / 2 pi = 20.3718, 2.03718, 0.203718, 0.0203718;
    # ramp g = clip((r - 1) / 31, 0, 1) = 0.624898, 0.0334575, 0, 0; theta' = (1 - g) theta / s + g theta;
    # magnitude 0.1 ln s + 1: ln 4 = 1.386294, ln 16 = 2.772589.
    ('yarn', 4.0, [0.7186734, 0.02750931, 0.0025, 0.00025], 1.1386294),
    ('yarn', 16.0, [0.6483417, 0.009386643, 0.000625, 0.0000625], 1.2772589),
    # Llama 3: the ramp between r = 1 and r = 4: g = 1 (r 20.37), 0.345728 (r 2.03718), 0, 0; no temperature.
    ('llama3', 4.0, [1.0, 0.05092958, 0.0025, 0.00025], 1.0),
    ('llama3', 8.0, [1.0, 0.04275118, 0.00125, 0.000125], 1.0),
])
def test_frequencies_and_temperature_worked_by_hand(method, factor, expected, magnitude):
  theta, got_magnitude = _frequencies(method, factor)
  np.testing.assert_allclose(theta, expected, rtol=1e-5)
  assert got_magnitude == pytest.approx(magnitude, rel=1e-7)
  if method == 'ntk':
    assert theta[-1] == pytest.approx(THETA[-1] / factor, rel=1e-5)  # the lowest frequency is exactly 1/s of itself


@pytest.mark.parametrize('length, expected', [
    # Hugging Face's dynamic, L = 128, s = 2: s' = 2 max(l, 128) / 128 - 1; theta_p' = theta_p s'^(-p/3) (base s'^(8/6)).
    (512, [1.0, 0.05227580, 0.002732759, 0.0001428571]),  # s' = 7
    (192, [1.0, 0.07937005, 0.006299605, 0.0005]),  # s' = 2: NTK at 2, the row above
    (128, THETA), (64, THETA),  # up to L: RoPE
])
def test_dynamic_ntk_by_sequence_worked_by_hand(length, expected):
  settings = _settings('dynamic_ntk_sequence', 2.0)
  for sequence_length in (length, jnp.asarray(length)):  # static, or traced as a full pass's largest position
    theta, magnitude = extension.extended_frequencies(rope.rope_frequencies(HEAD_DIM, BASE), settings, sequence_length)
    np.testing.assert_allclose(np.asarray(theta), expected, rtol=1e-5)
    assert magnitude == 1.0


def test_dynamic_ntk_by_sequence_is_ntk_at_the_whole_windows_factor():
  """Every position of a 12-token input with L = 4 and s = 1.5 gives NTK at s' = 1.5 * 12 / 4 - 0.5 = 4, the
  first positions too; an input of 4 is RoPE."""
  long_inputs, short_inputs = tokens(2, 12, seed=1), tokens(2, 4, seed=2)
  plain = T.DecoderOnly(tiny('rope'))
  params = init(plain, long_inputs)

  def outputs(method, factor, inputs):
    position = dict(rope_extension=method, extension_factor=factor, original_length=4)
    return T.DecoderOnly(tiny('rope', position=position)).apply(params, inputs)

  by_sequence = outputs('dynamic_ntk_sequence', 1.5, long_inputs)
  np.testing.assert_allclose(by_sequence, outputs('ntk', 4.0, long_inputs), atol=2e-6, rtol=1e-6)
  assert not np.allclose(by_sequence[:, :4], plain.apply(params, long_inputs)[:, :4], atol=1e-3)
  np.testing.assert_array_equal(outputs('dynamic_ntk_sequence', 1.5, short_inputs), plain.apply(params, short_inputs))


def _model_outputs(kind, method, factor, inputs, original_length=4, **position):
  config = tiny(kind, position=dict(rope_extension=method, extension_factor=factor,
                                    original_length=original_length, **position))
  model = T.DecoderOnly(config)
  params = init(T.DecoderOnly(tiny(kind)), inputs)  # the same parameters for every method
  return model, params, model.apply(params, inputs)


@pytest.mark.parametrize('kind', ROTARY)
@pytest.mark.parametrize('method', STATIC + ('dynamic_ntk',))
def test_factor_one_is_the_variant(kind, method):
  """Factor 1 changes nothing, to the bit; dynamic NTK at lengths within the original one is the variant to
  float32 rounding (its rotation is a logits term on unrotated queries and keys)."""
  inputs = tokens(2, 6)
  plain = T.DecoderOnly(tiny(kind))
  params = init(plain, inputs)
  original_length = 6 if method == 'dynamic_ntk' else 4
  _, _, extended = _model_outputs(kind, method, 1.0, inputs, original_length)
  if method == 'dynamic_ntk':
    np.testing.assert_allclose(extended, plain.apply(params, inputs), atol=2e-5, rtol=1e-5)
  else:
    np.testing.assert_array_equal(extended, plain.apply(params, inputs))


def test_position_interpolation_is_rope_at_positions_m_over_s():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 50, 3, HEAD_DIM))
  positions = jnp.arange(50)[None]
  theta, _ = extension.extended_frequencies(rope.rope_frequencies(HEAD_DIM), _settings('pi', 4.0))
  at_quarter_positions = rope.rotate_by(x, positions / 4.0, rope.rope_frequencies(HEAD_DIM))
  np.testing.assert_allclose(rope.rotate_by(x, positions, theta), at_quarter_positions, atol=1e-6)


@pytest.mark.slow
def test_dynamic_ntk_term_is_a_loop_of_ntk_rotations_by_query():
  """Query i's logits with every key equal q_i and k_j both rotated by NTK's frequencies at s_i =
  max(1, (i + 1) / L), the loop a cached decoder runs."""
  query, key = (jax.random.normal(jax.random.PRNGKey(seed), (1, 10, 2, HEAD_DIM)) for seed in (1, 2))
  positions = jnp.arange(10)[None]
  term = extension.dynamic_ntk_logits(query, key, positions, positions, rope.rope_frequencies(HEAD_DIM), 4, 0.5)
  plain = 0.5 * np.einsum('bqhk,bshk->bhqs', np.asarray(query, np.float64), np.asarray(key, np.float64))
  for i in range(10):
    factor = max(1.0, (i + 1) / 4)
    base = BASE * factor ** (HEAD_DIM / (HEAD_DIM - 2))  # NTK's base, from its formula
    theta = base ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    rotated_q = rope.rotate_by(query, positions, jnp.asarray(theta, jnp.float32))
    rotated_k = rope.rotate_by(key, positions, jnp.asarray(theta, jnp.float32))
    expected = 0.5 * np.einsum('hk,shk->hs', np.asarray(rotated_q[0, i]), np.asarray(rotated_k[0]))
    np.testing.assert_allclose(np.asarray(term[0, :, i]) + plain[0, :, i], expected, atol=2e-5)


@pytest.mark.slow
def test_dynamic_ntk_is_ntk_at_each_querys_factor_and_scales_back_down():
  """One layer: the last query of a 12-token input (s = 12 / 4 = 3) gives NTK at factor 3's output there,
  the first four give RoPE's; a shorter input afterwards is RoPE again."""
  long_inputs, short_inputs = tokens(2, 12, seed=1), tokens(2, 4, seed=2)
  one_layer = dict(num_decoder_layers=1)
  plain = T.DecoderOnly(tiny('rope', **one_layer))
  params = init(plain, long_inputs)

  def outputs(method, factor, inputs):
    position = dict(rope_extension=method, extension_factor=factor, original_length=4)
    return T.DecoderOnly(tiny('rope', position=position, **one_layer)).apply(params, inputs)

  dynamic_long = outputs('dynamic_ntk', 1.0, long_inputs)
  np.testing.assert_allclose(dynamic_long[:, -1], outputs('ntk', 3.0, long_inputs)[:, -1], atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(dynamic_long[:, :4], plain.apply(params, long_inputs)[:, :4], atol=2e-5, rtol=1e-5)
  assert not np.allclose(dynamic_long[:, -1], plain.apply(params, long_inputs)[:, -1], atol=1e-3)
  np.testing.assert_allclose(outputs('dynamic_ntk', 1.0, short_inputs), plain.apply(params, short_inputs),
                             atol=2e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('kind', ROTARY)
@pytest.mark.parametrize('method', STATIC + ('dynamic_ntk', 'dynamic_ntk_sequence'))
def test_cached_decoding_equals_the_full_pass(kind, method):
  """Cached steps (chunks of 2, 1, 1, 3 tokens, in query blocks of 4 over key blocks of 4) give the full
  pass's logits, two layers; for dynamic NTK every position past the third has a factor of its own, by sequence
  every step the factor of the cache's capacity."""
  inputs = tokens(2, 7, seed=3)
  changes = dict(position=dict(rope_extension=method, extension_factor=1.0 if method == 'dynamic_ntk' else 2.5,
                               original_length=3), attention_block_size=4, attention_key_block_size=4)
  model = T.DecoderOnly(tiny(kind, **changes))
  params = init(model, inputs)
  whole = model.apply(params, inputs)
  np.testing.assert_allclose(cached_logits(model, params, inputs, (2, 1, 1, 3)), whole, atol=2e-5, rtol=1e-5)
  plain = T.DecoderOnly(tiny(kind, attention_block_size=4, attention_key_block_size=4)).apply(params, inputs)
  assert not np.allclose(whole[:, 3:], plain[:, 3:], atol=1e-4)  # the method changed the logits past L


@pytest.mark.parametrize('method', STATIC)
def test_bfloat16_compute_rotates_by_float32_angles(method):
  """At positions up to 2047 a bfloat16 angle would be off by up to 4 radians; the rotation in bfloat16
  matches a float64 rotation of the same bfloat16 inputs to bfloat16's rounding of the output."""
  x32 = jax.random.normal(jax.random.PRNGKey(1), (1, 2048, 2, HEAD_DIM))
  x16 = x32.astype(jnp.bfloat16)
  positions = jnp.arange(2048)[None]
  theta, magnitude = extension.extended_frequencies(rope.rope_frequencies(HEAD_DIM), _settings(method, 16.0))
  rotated = np.asarray(rope.rotate_by(x16, positions, theta, magnitude=magnitude).astype(jnp.float32))
  angle = np.arange(2048, dtype=np.float64)[:, None] * np.asarray(theta, np.float64).reshape(-1)[None, :]
  pairs = np.asarray(x16.astype(jnp.float32), np.float64).reshape(1, 2048, 2, HEAD_DIM // 2, 2)
  cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
  even, odd = pairs[..., 0], pairs[..., 1]
  expected = magnitude * np.stack([even * cos - odd * sin, even * sin + odd * cos], -1).reshape(rotated.shape)
  np.testing.assert_allclose(rotated, expected, atol=2 ** -7 * np.abs(expected).max())


@pytest.mark.slow
def test_bfloat16_dynamic_ntk_term_uses_float32_angles():
  """The same for dynamic NTK's logits term, queries 1920-2047 against every key, L = 128."""
  query, key = (jax.random.normal(jax.random.PRNGKey(seed), (1, 2048, 1, HEAD_DIM)).astype(jnp.bfloat16)
                for seed in (3, 4))
  positions = jnp.arange(2048)[None]
  term = extension.dynamic_ntk_logits(query[:, -128:], key, positions[:, -128:], positions,
                                      rope.rope_frequencies(HEAD_DIM), 128, 1.0)
  q64, k64 = (np.asarray(x.astype(jnp.float32), np.float64)[0, :, 0] for x in (query, key))
  i = np.arange(1920, 2048)
  factor = np.maximum(1.0, (i + 1) / 128)[:, None]
  theta = THETA[None, :] * factor ** (-np.arange(4)[None, :] / 3)  # NTK: base' = base s^(8/6)
  angle = (i[:, None, None] - np.arange(2048)[None, :, None]) * theta[:, None, :]
  qe, qo, ke, ko = q64[1920:, 0::2], q64[1920:, 1::2], k64[:, 0::2], k64[:, 1::2]
  real = qe[:, None] * ke[None] + qo[:, None] * ko[None]
  imaginary = qo[:, None] * ke[None] - qe[:, None] * ko[None]
  expected = (real * np.cos(angle) - imaginary * np.sin(angle) - real).sum(-1)
  np.testing.assert_allclose(np.asarray(term[0, 0]), expected, atol=1e-3)


def test_extension_in_a_pattern_by_layer_reaches_its_rope_layers():
  inputs = tokens(2, 6)
  plain = T.DecoderOnly(tiny('layer_pattern', position=dict(layer_pattern='rope,none')))
  params = init(plain, inputs)
  extended = T.DecoderOnly(tiny('layer_pattern', position=dict(layer_pattern='rope,none', rope_extension='pi',
                                                                extension_factor=2.0)))
  assert not np.allclose(extended.apply(params, inputs), plain.apply(params, inputs), atol=1e-4)


@pytest.mark.parametrize('fields, message', [
    (dict(rope_extension='linear'), 'position.rope_extension'),
    (dict(rope_extension='pi', extension_factor=0.5), 'position.extension_factor'),
    (dict(rope_extension='pi', extension_factor=math.nan), 'position.extension_factor'),
    (dict(rope_extension='dynamic_ntk', extension_factor=2.0, original_length=128), 'position.extension_factor'),
    (dict(rope_extension='yarn', extension_factor=4.0), 'position.original_length'),
    (dict(rope_extension='yarn', extension_factor=4.0, original_length=128, yarn_alpha=32.0),
     'position.yarn_alpha'),
    (dict(rope_extension='llama3', extension_factor=4.0, original_length=128, llama3_low_frequency_factor=5.0),
     'position.llama3_low_frequency_factor'),
])
def test_bad_extension_settings_are_refused_naming_the_field(fields, message):
  with pytest.raises(ValueError, match=message):
    T.PositionConfig('rope', **fields)


def _embedding(kind, positions, **settings):
  """The stack's embed hook applied to zeros: its position vectors, B x L x 16."""
  config = T.PositionConfig(kind, **settings)
  stack = config.variant.stack(settings=config.settings, num_heads=2, head_dim=8, model_dim=16, num_layers=1,
                               causal=True)
  x = jnp.zeros(positions.shape + (16,))
  variables = stack.init(jax.random.PRNGKey(0), x, positions, method='embed')
  return variables, lambda settings_variables, p: stack.apply(settings_variables, jnp.zeros(p.shape + (16,)), p,
                                                               method='embed')


def test_sinusoidal_interpolation_reads_position_m_at_m_times_s():
  positions = jnp.arange(0, 12, 3)[None]  # 0, 3, 6, 9 at s = 3 are 0, 1, 2, 3
  variables, embed = _embedding('sinusoidal', positions, interpolation_factor=3.0)
  np.testing.assert_allclose(embed(variables, positions), T.positions.sinusoidal_encoding(positions // 3, 16), atol=1e-6)


def test_learned_interpolation_reads_rows_and_the_midpoints_between_them():
  variables, embed = _embedding('learned', jnp.arange(7)[None], max_length=4, interpolation_factor=2.0)
  table = np.asarray(variables['params']['table'])
  got = np.asarray(embed(variables, jnp.arange(7)[None]))[0]
  np.testing.assert_allclose(got[0::2], table, atol=1e-6)  # position 2m reads row m
  np.testing.assert_allclose(got[1::2], (table[:-1] + table[1:]) / 2, atol=1e-6)
  assert T.PositionConfig('learned', max_length=4, interpolation_factor=2.0).settings.longest_sequence() == 7
  with pytest.raises(ValueError, match='7 rows'):
    embed(variables, jnp.arange(8)[None])


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['none', 'rope', 'alibi'])  # a setting of every variant (Llama 4's NoPE layers)
def test_the_temperature_of_llama4_worked_by_hand(kind):
  """1 + 0.1 ln(floor((i + 1) / 4) + 1): 1 for i < 3, 1 + 0.1 ln 2 for i = 3..6, 1 + 0.1 ln 4 at i = 11."""
  expected = [1.0, 1.0, 1.0, 1.0 + 0.1 * math.log(2), 1.0 + 0.1 * math.log(2), 1.0 + 0.1 * math.log(4)]
  got = T.positions.temperature.query_temperature(jnp.array([[0, 1, 2, 3, 6, 11]]), 0.1, 4)
  np.testing.assert_allclose(got[0], expected, rtol=1e-6)
  inputs = tokens(2, 6)
  plain = T.DecoderOnly(tiny(kind))
  params = init(plain, inputs)
  tempered = T.DecoderOnly(tiny(kind, position=dict(temperature_scale=0.1, temperature_floor=4)))
  np.testing.assert_array_equal(tempered.apply(params, inputs)[:, :3], plain.apply(params, inputs)[:, :3])
  assert not np.allclose(tempered.apply(params, inputs)[:, 3:], plain.apply(params, inputs)[:, 3:], atol=1e-4)
  assert not T.PositionConfig(kind, temperature_scale=0.1).shift_invariant
