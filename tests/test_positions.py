"""One suite, parametrised over every positional variant in transformer.positions.VARIANTS."""

import dataclasses
import functools
import math
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from tests import transcriptions
from tests.transcriptions import sinusoidal as sinusoidal_transcription
from tests.transcriptions import t5 as t5_transcription
from tests.helpers import assert_causal, bidirectional, init, own_settings, random_positions, tiny, tokens
from transformer.positions import base as position_base

ALL = sorted(T.VARIANTS)
EXTRAPOLATING = [k for k in ALL if T.VARIANTS[k].settings().longest_sequence() is None]
BIDIRECTIONAL = [k for k in ALL if bidirectional(k)]
B, L, D, H = 2, 5, 16, 4


class OneAttention(nn.Module):
  """A single self-attention with a variant's stack and layer hooks, called as the stack calls them."""
  config: T.ModelConfig
  causal: bool
  has_cls: bool = False

  @nn.compact
  def __call__(self, x_BxLxD, offset: int = 0):
    variant = self.config.position.variant
    self.config.position.check_attention(self.config.num_heads, self.config.head_dim, self.causal)
    fields = dict(settings=self.config.position.settings, num_heads=self.config.num_heads, head_dim=self.config.head_dim,
                  model_dim=self.config.model_dim, num_layers=1, causal=self.causal, has_cls=self.has_cls)
    stack = variant.stack(**fields, name='stack')
    layer = variant.layer(**fields, name='layer')
    positions = jnp.arange(x_BxLxD.shape[1])[None] + offset
    x_BxLxD = stack.embed(x_BxLxD, positions)
    shared = stack.shared(positions, positions)
    mask = T.causal_mask(x_BxLxD.shape[1]) if self.causal else None
    return T.MultiHeadAttention(self.config.num_heads, name='attention')(
        x_BxLxD, x_BxLxD, mask=mask, positions=T.AttentionPositions(layer, positions, positions, shared))


SMALL_SETTINGS = dict(max_length=64, clip_distance=2, num_buckets=8, max_distance=6,  # where a variant has them
                      fire_threshold=64.0, fire_learn_threshold=False, rotary_fraction=0.5)


def _config(kind, **position):
  small = own_settings(kind, **SMALL_SETTINGS)
  return T.tiny_preset(T.PositionConfig(kind, **dict(small, **position)), model_dim=D, num_heads=H)


def _randomise(params, seed=1):
  """Replace every parameter by noise so zero-initialised terms (biases, CLS thetas) are exercised."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree_util.tree_unflatten(treedef, [jax.random.normal(k, l.shape) * 0.5 for k, l in zip(keys, leaves)])


def _run(kind, causal, has_cls=False, offset=0, x=None, **position):
  """The module, its randomised parameters, an input and the config; for a causal-only variant asked
  for bidirectional attention, checks that it is refused and returns None."""
  config = _config(kind, **position)
  if not causal and not bidirectional(kind):
    with pytest.raises(ValueError, match=f"position.kind: got '{kind}'; valid: in bidirectional attention .* "
                                         f'{kind} is causal only'):
      OneAttention(config, causal, has_cls).init(jax.random.PRNGKey(0), jnp.zeros((B, L, D)))
    return None
  module = OneAttention(config, causal, has_cls)
  x = jax.random.normal(jax.random.PRNGKey(0), (B, L, D)) if x is None else x
  params = {'params': _randomise(nn.meta.unbox(module.init(jax.random.PRNGKey(0), x)['params']))}
  return module, params, x, config


VARIANT_SETTINGS = [(k, {}) for k in ALL] + [
    ('shaw', {'per_head': True}), ('t5', {'shared_across_layers': False}),
    ('tupe_a', {'absolute_table': 'learned'}), ('tupe_r', {'shared_across_layers': False}),
    ('rope', {'rope_base': 500.0}), ('sinusoidal', {'sinusoidal_base': 100.0}),
    ('fire', {'fire_learn_threshold': True, 'fire_threshold': 3.0}),
    ('xpos', {'xpos_scale_base': 4.0, 'xpos_center': 2, 'rope_base': 500.0}),
    ('p_rope', {'rotary_fraction': 1.0}), ('transformer_xl', {'shared_across_layers': False}),
    ('cope', {'max_positions': 3}), ('layer_pattern', {'layer_pattern': 'tupe_a,rope'}),
    ('layer_pattern', {'layer_pattern': 'shaw'}), ('layer_pattern', {'layer_pattern': 't5'})]


@pytest.mark.parametrize('kind,position', VARIANT_SETTINGS, ids=lambda v: str(v))
@pytest.mark.parametrize('causal,has_cls', [(True, False), (False, False), (False, True)])
def test_matches_naive_loop_of_the_paper(kind, position, causal, has_cls):
  run = _run(kind, causal, has_cls, **position)
  if run is None:
    return  # refused, as checked
  module, params, x, config = run
  ours = module.apply(params, x)
  reference = transcriptions.attention(kind, np.asarray(x), params['params'], H, causal, has_cls, config.position.settings)
  np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.parametrize('kind', ALL)
def test_scalable_softmax_matches_the_naive_loop_with_every_variant(kind, causal):
  """position.ssmax: the queries times s_h log n_i (n_i = i + 1 causal, L otherwise) before each variant's
  logit, as the transcription applies it; s_h randomised with the other parameters."""
  run = _run(kind, causal, ssmax=True)
  if run is None:
    return  # refused, as checked
  module, params, x, config = run
  assert config.position.settings.ssmax and 'ssmax_scale' in params['params']['attention']
  reference = transcriptions.attention(kind, np.asarray(x), params['params'], H, causal, False, config.position.settings)
  np.testing.assert_allclose(module.apply(params, x), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.parametrize('kind', ALL)
def test_shift_invariant_exactly_where_the_variant_claims_it(kind, causal):
  """Positions shifted by 37: the same outputs for a variant that claims shift invariance
  (Variant.shift_invariant, or its settings' claim), different ones for every other: the test fails both ways. A claim that
  ends at a position (Settings.shift_invariant_below) must also fail beyond it."""
  run = _run(kind, causal)
  if run is None:
    return  # refused, as checked
  module, params, x, config = run
  limit = config.position.settings.shift_invariant_below()
  assert limit is None or limit > 37 + L, (kind, limit)  # the settings of _config keep the shift within it
  same = np.allclose(module.apply(params, x), module.apply(params, x, offset=37), atol=1e-5)
  assert same == config.position.shift_invariant, (kind, same)
  if limit is not None:
    beyond = np.allclose(module.apply(params, x, offset=limit), module.apply(params, x, offset=limit + 37), atol=1e-5)
    assert not beyond, (kind, limit)


def test_tupe_r_relative_part_is_shift_invariant():
  """TUPE-R is not, through its absolute term; its T5 part is, exactly."""
  module, params, x, _ = _run('tupe_r', causal=True)
  table = params['params']['stack']['components_1']['relative_bias']
  positions = jnp.arange(L)[None]
  np.testing.assert_allclose(
      T.positions.t5_bias(table, positions, positions, bidirectional=False, max_distance=6),
      T.positions.t5_bias(table, positions + 37, positions + 37, bidirectional=False, max_distance=6), atol=0)


def _toeplitz(bias_HxLqxLk):
  bias = np.asarray(bias_HxLqxLk)
  np.testing.assert_array_equal(bias[:, 1:, 1:], bias[:, :-1, :-1])


@pytest.mark.parametrize('causal', [True, False])
def test_bias_variants_are_toeplitz(causal):
  positions = jnp.arange(12)[None]
  table = jax.random.normal(jax.random.PRNGKey(0), (8, H))
  _toeplitz(T.positions.t5_bias(table, positions, positions, bidirectional=not causal, max_distance=6)[0])
  _toeplitz(T.positions.alibi_bias(positions, positions, H, causal)[0])
  module, params, x, _ = _run('tupe_r', causal)
  _, state = module.apply(params, x, capture_intermediates=lambda m, name: isinstance(m, T.positions.T5Stack)
                          and name == 'shared', mutable=['intermediates'])
  _toeplitz(state['intermediates']['stack']['components_1']['shared'][0][0])


@pytest.mark.parametrize('distance,bidirectional,bucket', [
    # T5's defaults, 32 buckets, max_distance 128. distance = key - query position.
    (0, True, 0), (-1, True, 1), (1, True, 17), (-7, True, 7), (-8, True, 8), (-11, True, 8),
    (-12, True, 9), (-20, True, 10), (-40, True, 12), (-90, True, 14), (-128, True, 15), (-1000, True, 15),
    (7, True, 23), (20, True, 26), (1000, True, 31),
    (0, False, 0), (5, False, 0), (-15, False, 15), (-16, False, 16), (-22, False, 18), (-40, False, 23),
    (-100, False, 30), (-127, False, 31), (-500, False, 31),
])
def test_t5_buckets_match_known_values(distance, bidirectional, bucket):
  ours = int(T.positions.t5_bucket(jnp.array(distance), bidirectional=bidirectional, num_buckets=32,
                                   max_distance=128))
  assert ours == bucket
  assert t5_transcription.t5_bucket(distance, bidirectional, 32, 128) == bucket


def test_alibi_slopes_match_the_paper():
  np.testing.assert_allclose(T.positions.alibi_slopes(8), [1 / 2 ** i for i in range(1, 9)], rtol=1e-6)
  twelve = [2 ** -(i + 1) for i in range(8)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]
  np.testing.assert_allclose(T.positions.alibi_slopes(12), twelve, rtol=1e-6)
  assert len(T.positions.alibi_slopes(5)) == 5


def _intercept_positional_terms(model, params, *args):
  """Calls of TupeStack.shared and the terms every TupeLayer.logits returned, in call order."""
  calls = {'shared': 0, 'terms': []}

  def record(next_fun, call_args, call_kwargs, context):
    result = next_fun(*call_args, **call_kwargs)
    if isinstance(context.module, T.positions.TupeStack) and context.method_name == 'shared':
      calls['shared'] += 1
    if isinstance(context.module, T.positions.TupeLayer) and context.method_name == 'logits':
      calls['terms'].append(result)
    return result

  with nn.intercept_methods(record):
    model.apply(params, *args)
  return calls


@pytest.mark.parametrize('kind', ['tupe_a', 'tupe_r'])
def test_tupe_term_is_computed_once_and_shared_by_every_layer(kind):
  config = tiny(kind, num_decoder_layers=3)
  model = T.DecoderOnly(config)
  x = tokens(2, 6)
  calls = _intercept_positional_terms(model, init(model, x), x)
  assert calls['shared'] == 1
  assert len(calls['terms']) == 3
  for term in calls['terms'][1:]:
    assert term is calls['terms'][0]


def test_tupe_cls_reset_makes_cls_row_and_column_constant_per_head():
  config = tiny('tupe_a')
  model = T.EncoderOnly(config)
  x = tokens(2, 6)
  params = {'params': _randomise(init(model, x)['params'])}
  term = np.asarray(_intercept_positional_terms(model, params, x)['terms'][0])  # B x H x 7 x 7 with CLS
  theta = np.asarray(params['params']['encoder']['position']['cls_theta'])
  for h in range(config.num_heads):
    np.testing.assert_array_equal(term[:, h, 0, :], theta[0, h])
    np.testing.assert_array_equal(term[:, h, 1:, 0], theta[1, h])
    assert np.std(term[:, h, 1:, 1:]) > 0
  without_reset = tiny('tupe_a', position={'cls_reset': False})
  params = init(T.EncoderOnly(without_reset), x)
  assert 'cls_theta' not in params['params']['encoder']['position']


def test_tupe_scales_content_logits_by_one_over_sqrt_2d():
  config = _config('tupe_a')
  layer = T.positions.TupeLayer(config.position.settings, H, D // H, D, 1, causal=False)
  assert layer.scale() == pytest.approx(1 / math.sqrt(2 * (D // H)))
  assert T.positions.LayerPositions(config.position.settings, H, D // H, D, 1, causal=False).scale() is None
  module, params, x, _ = _run('tupe_a', causal=False)
  _, state = module.apply(params, x, mutable=['intermediates'])
  weights = state['intermediates']['attention']['attention_weights'][0]
  p = params['params']['attention']
  q = (x @ p['query']['kernel'] + p['query']['bias']).reshape(B, L, H, D // H)
  k = (x @ p['key']['kernel'] + p['key']['bias']).reshape(B, L, H, D // H)
  stack = T.positions.TupeStack(config.position.settings, H, D // H, D, 1, causal=False)
  positional = stack.apply({'params': params['params']['stack']}, jnp.arange(L)[None], jnp.arange(L)[None],
                           method='shared')
  expected = jax.nn.softmax(jnp.einsum('bqhk,bshk->bhqs', q, k) / math.sqrt(2 * (D // H)) + positional)
  np.testing.assert_allclose(weights, expected, atol=1e-5)


def test_shaw_efficient_form_equals_the_l_by_l_by_d_form():
  rng = np.random.RandomState(0)
  length, heads, dim, clip = 9, 3, 4, 3
  query = rng.randn(2, length, heads, dim).astype(np.float32)
  weights = rng.rand(2, heads, length, length).astype(np.float32)
  key_table = rng.randn(2 * clip + 1, heads, dim).astype(np.float32)
  value_table = rng.randn(2 * clip + 1, heads, dim).astype(np.float32)
  positions = jnp.arange(length)[None]
  buckets = T.positions.shaw_buckets(positions, positions, clip)
  relative = np.clip(np.arange(length)[None, :] - np.arange(length)[:, None], -clip, clip) + clip
  a_key_LxLxHxK, a_value_LxLxHxK = key_table[relative], value_table[relative]
  np.testing.assert_allclose(T.positions.shaw_logits(query, key_table, buckets),
                             np.einsum('bqhk,qshk->bhqs', query, a_key_LxLxHxK), atol=1e-5)
  np.testing.assert_allclose(T.positions.shaw_values(weights, value_table, buckets),
                             np.einsum('bhqs,qshk->bqhk', weights, a_value_LxLxHxK), atol=1e-5)


def test_shaw_never_builds_an_l_by_l_by_d_tensor():
  length, heads, dim = 64, 2, 32
  query = jnp.ones((1, length, heads, dim))
  weights = jnp.ones((1, heads, length, length))
  table = jnp.ones((5, heads, dim))
  positions = jnp.arange(length)[None]

  def both(q, w):
    buckets = T.positions.shaw_buckets(positions, positions, 2)
    return T.positions.shaw_logits(q, table, buckets), T.positions.shaw_values(w, table, buckets)

  jaxpr = jax.make_jaxpr(both)(query, weights)
  sizes = [int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars]
  assert max(sizes) < length * length * dim, max(sizes)


def test_sinusoidal_shift_is_one_linear_map_for_every_position():
  """PE(pos + k) = M_k PE(pos), M_k block-diagonal with the rotations [[cos kw, sin kw], [-sin kw, cos kw]]
  (the paper's reason for choosing sinusoids), the same M_k at every position."""
  dim, k = 16, 5
  table = np.asarray(T.positions.sinusoidal_table(300, dim), np.float64)
  for c in range(dim):  # the table itself, against the paper's formula
    np.testing.assert_allclose(table[:, c], [sinusoidal_transcription.sinusoid(p, dim)[c] for p in range(300)], atol=1e-4)
  shift = np.zeros((dim, dim))
  for i in range(dim // 2):
    w = 10000.0 ** (-2 * i / dim)
    shift[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[math.cos(k * w), math.sin(k * w)], [-math.sin(k * w), math.cos(k * w)]]
  np.testing.assert_allclose(table[:-k] @ shift.T, table[k:], atol=1e-4)
  wrong_shift = np.eye(dim)
  assert not np.allclose(table[:-k] @ wrong_shift.T, table[k:], atol=1e-2)


@pytest.mark.parametrize('kind', ALL)
def test_decoder_only_stays_causal(kind):
  config = tiny(kind)
  model = T.DecoderOnly(config)
  x = tokens(1, 6)
  params = {'params': _randomise(init(model, x)['params'])}
  assert_causal(model, params, (x,), 6, config.model_dim)


@pytest.mark.parametrize('kind', ALL)
def test_jit_gives_the_outputs_of_eager_execution(kind):
  """Each variant's decoder-only model (and encoder-only, where it serves encoders) jitted and not, with
  the hooks' parameters randomised: the same outputs."""
  x = tokens(2, 6)
  models = [T.DecoderOnly(tiny(kind))] + ([T.EncoderOnly(tiny(kind))] if bidirectional(kind) else [])
  for model in models:
    params = random_positions(init(model, x))
    np.testing.assert_allclose(jax.jit(model.apply)(params, x), model.apply(params, x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('kind', EXTRAPOLATING)
def test_model_built_for_64_runs_at_256(kind):
  """One layer of each model kind the variant serves: the position terms are built per layer (or once per
  stack), so a second layer would only compile the same terms again."""
  config = tiny(kind, position=own_settings(kind, max_length=64), num_encoder_layers=1, num_decoder_layers=1)
  models = [(T.DecoderOnly(config), lambda n: (tokens(1, n),))]
  if bidirectional(kind):
    models += [(T.EncoderDecoder(config), lambda n: (tokens(1, n), tokens(1, n))),
               (T.EncoderOnly(config), lambda n: (tokens(1, n),))]
  for model, make_args in models:
    params = init(model, *make_args(64))
    outputs = jax.jit(model.apply)(params, *make_args(256))
    assert bool(jnp.all(jnp.isfinite(outputs))), kind


@pytest.mark.parametrize('kind,position', [('learned', {}), ('tupe_a', {'absolute_table': 'learned'})])
def test_learned_raises_beyond_its_table_naming_both_lengths_and_the_field(kind, position):
  config = tiny(kind, position={'max_length': 64, **position})
  model = T.DecoderOnly(config)
  params = init(model, tokens(1, 64))
  with pytest.raises(ValueError, match=r'length 256 .* \(64 rows\).*model\.position\.max_length'):
    jax.jit(model.apply)(params, tokens(1, 256))
  assert config.position.settings.longest_sequence() == 64


@pytest.mark.parametrize('kind', BIDIRECTIONAL)
def test_cross_attention_gets_no_position_terms(kind):
  config = tiny(kind)
  model = T.EncoderDecoder(config)
  x = tokens(1, 5)
  params = init(model, x, x)
  hooked = []

  def record(next_fun, call_args, call_kwargs, context):
    if isinstance(context.module, T.MultiHeadAttention):
      hooked.append((context.module.name, call_kwargs.get('positions') is not None))
    return next_fun(*call_args, **call_kwargs)

  with nn.intercept_methods(record):
    model.apply(params, x, x)
  assert ('cross_attention', False) in hooked and ('cross_attention', True) not in hooked
  assert ('self_attention', True) in hooked


def test_every_variant_is_documented_in_the_readme_with_its_paper():
  """The README's table of variants has a row for each entry of VARIANTS, and no other, citing the
  paper the variant names; each entry has the hooks' classes."""
  readme = (pathlib.Path(__file__).resolve().parent.parent / 'README.md').read_text()
  cells = [re.split(r'(?<!\\)\|', line)[1:-1] for line in readme.splitlines() if re.match(r'^\| `\w+` \|', line)]
  rows = {cell[0].strip().strip('`'): cell[2] for cell in cells}  # kind -> the paper column
  assert sorted(rows) == sorted(T.VARIANTS)
  for kind, variant in T.VARIANTS.items():
    assert issubclass(variant.stack, position_base.StackPositions)
    assert issubclass(variant.layer, position_base.LayerPositions)
    assert rows[kind].strip().split(' (')[0] == variant.paper.split(' (')[0], (kind, rows[kind], variant.paper)


def test_the_running_guide_lists_every_variants_settings():
  """docs/running.md's list of settings is the one VARIANTS declares, variant by variant, after the line of
  those every variant has (position_base.Settings' fields)."""
  readme = (pathlib.Path(__file__).resolve().parent.parent / 'docs' / 'running.md').read_text().splitlines()
  common = [field.name for field in dataclasses.fields(position_base.Settings)]
  assert '- every variant: ' + ', '.join(f'`{name}`' for name in common) in readme
  for kind, variant in T.VARIANTS.items():
    names = ', '.join(f'`{name}`' for name in variant.setting_names() if name not in common) or 'none'
    assert f'- `{kind}`: {names}' in readme, kind


def _packed_row(lengths, batch: int = 2, seed: int = 3):
  """Documents of these lengths packed in each row: tokens, positions restarting at 0, segment ids."""
  x = tokens(batch, sum(lengths), seed=seed)
  positions = np.concatenate([np.arange(n) for n in lengths])[None].repeat(batch, 0).astype(np.int32)
  segments = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])[None].repeat(batch, 0).astype(np.int32)
  return x, jnp.asarray(positions), jnp.asarray(segments)


@pytest.mark.parametrize('implementation', ['explicit', pytest.param('blockwise', marks=pytest.mark.slow)])
@pytest.mark.parametrize('kind', ALL)
def test_packed_documents_score_as_each_document_alone(kind, implementation):
  """A row of four documents with positions restarting in each and attention kept within each gives, at every
  token, the logits of its document run alone from position 0, hooks' parameters randomised; in blocks of 2
  queries (and keys) too, blocks that straddle the documents' boundaries. The documents have one length, so
  they run alone as the rows of one batch."""
  lengths = (3, 3, 3, 3)
  config = tiny(kind, num_decoder_layers=1, attention_implementation=implementation, attention_block_size=2,
                attention_key_block_size=2 if implementation == 'blockwise' else 0)
  model = T.DecoderOnly(config)
  dense = T.DecoderOnly(tiny(kind, num_decoder_layers=1))  # the same parameters, attention without blocks
  x, positions, segments = _packed_row(lengths)
  params = random_positions(init(dense, x))
  apply = jax.jit(functools.partial(model.apply, params))
  packed = apply(x, positions_BxL=positions, segments_BxL=segments)
  (length,), starts = set(lengths), np.cumsum((0,) + lengths[:-1])
  documents_alone = dense.apply(params, jnp.concatenate([x[:, start:start + length] for start in starts]))
  for index, start in enumerate(starts):
    np.testing.assert_allclose(packed[:, start:start + length], documents_alone[index * len(x):(index + 1) * len(x)],
                               atol=2e-5, rtol=2e-5, err_msg=f'document {index}')
  one_document = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape)
  unpacked = apply(x, positions_BxL=one_document, segments_BxL=jnp.zeros_like(segments))
  assert not np.allclose(packed[:, 3:], unpacked[:, 3:], atol=1e-3)  # packing changed what later documents see
