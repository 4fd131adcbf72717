"""What the 2024-2026 decoders do to attention besides positions, in a model: sinks (a logit of -1e9 is no sink),
the query scale (Gemma's query_pre_attn_scalar against a scaled query projection), the sandwich norm (a branch
normalised to its own scale), the position of the local layers (model.local_position against a pattern of
variants by layer), and the kernel's visited blocks against the window and chunk by brute force."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import flash_attention
from tests.helpers import init, tokens


def _decoder(kind='rope', **changes):
  fields = dict(num_encoder_layers=0, num_decoder_layers=2, vocab_size=32, norm_type='rmsnorm', use_bias=False)
  return T.tiny_preset(T.PositionConfig(kind), **{**fields, **changes})


@pytest.mark.parametrize('implementation, extra', [('explicit', {}), ('blockwise', dict(attention_block_size=4)),
                                                   ('xla', {})])
def test_sinks_at_a_logit_of_minus_1e9_are_no_sinks(implementation, extra):
  config = _decoder(layer_types='sliding,full', sliding_window=4, attention_implementation=implementation, **extra)
  inputs = tokens(2, 12)
  plain = T.DecoderOnly(config)
  params = init(plain, inputs)
  with_sinks = T.DecoderOnly(config.replace(attention_sinks=True))
  sink_params = init(with_sinks, inputs)
  for layer in ('layer_0', 'layer_1'):
    assert sink_params['params']['decoder'][layer]['self_attention']['sinks'].shape == (4,)
  for layer in ('layer_0', 'layer_1'):
    params['params']['decoder'][layer]['self_attention']['sinks'] = jnp.full((4,), -1e9)
  np.testing.assert_allclose(with_sinks.apply(params, inputs), plain.apply(params, inputs), atol=2e-6, rtol=0)
  for layer in ('layer_0', 'layer_1'):
    params['params']['decoder'][layer]['self_attention']['sinks'] = jnp.full((4,), 2.0)
  assert not np.allclose(with_sinks.apply(params, inputs), plain.apply(params, inputs), atol=1e-3)


def test_the_query_scale_divides_the_logits_by_its_square_root():
  """query_scale = 4 K: logits q.k / sqrt(4 K), the same as the query projection halved with 1 / sqrt(K)
  (no biases); query_scale = K is the default scale."""
  config = _decoder(qk_norm='none')
  inputs = tokens(2, 10)
  model = T.DecoderOnly(config)
  params = init(model, inputs)
  head_width = config.head_dim
  np.testing.assert_array_equal(T.DecoderOnly(config.replace(query_scale=float(head_width))).apply(params, inputs),
                                model.apply(params, inputs))
  halved = jax.tree_util.tree_map_with_path(
      lambda path, x: x * 0.5 if 'query' in jax.tree_util.keystr(path) else x, params)
  np.testing.assert_allclose(T.DecoderOnly(config.replace(query_scale=4.0 * head_width)).apply(params, inputs),
                             model.apply(halved, inputs), atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match=r'model.query_scale: got 16.0 with a variant that sets its own logit scale'):
    T.DecoderOnly(_decoder('tupe_a', query_scale=16.0)).init(jax.random.PRNGKey(0), inputs)


def test_the_sandwich_norm_normalises_each_branch_to_its_own_scale():
  """x + LN'(F(LN(x))): an LN' after attention and after the feed-forward in every layer; with every LN' scale 0
  the blocks add nothing, and the logits are the final norm of the embeddings against the tied table."""
  config = _decoder(sandwich_norm=True, scale_embeddings=False)
  inputs = tokens(1, 9)
  model = T.DecoderOnly(config)
  params = init(model, inputs)
  names = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)]
  assert sum('output_norm' in name for name in names) == 4  # after attention and after the feed-forward, 2 layers
  silent = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.zeros_like(x) if 'output_norm' in jax.tree_util.keystr(path) else x, params)
  table = np.asarray(params['params']['embedding']['embedding']['embedding'])
  final_scale = np.asarray(params['params']['decoder']['final_norm']['scale'])
  embedded = table[np.asarray(inputs)]
  normed = embedded / np.sqrt(np.mean(embedded ** 2, axis=-1, keepdims=True) + config.layer_norm_eps) * final_scale
  np.testing.assert_allclose(model.apply(silent, inputs), normed @ table.T, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match=r"sandwich_norm: got True; valid: False with norm='post'"):
    _decoder(sandwich_norm=True, norm='post')


def test_local_layers_take_the_local_position_as_a_pattern_by_layer_would():
  """RoPE in the sliding layers and no positions in the global ones (Command A) through model.local_position equals
  the same stack through position.layer_pattern 'rope,none'; and Gemma 3's two bases differ from one."""
  inputs = tokens(2, 12)
  local = _decoder('none', local_position=T.PositionConfig('rope'), layer_types='sliding,full', sliding_window=4)
  model = T.DecoderOnly(local)
  params = init(model, inputs)
  pattern = local.replace(position=T.PositionConfig('layer_pattern', layer_pattern='rope,none'), local_position=None)
  np.testing.assert_array_equal(model.apply(params, inputs), T.DecoderOnly(pattern).apply(params, inputs))
  gemma = local.replace(position=T.PositionConfig('rope', rope_base=1e6),
                        local_position=T.PositionConfig('rope', rope_base=1e4))
  one_base = gemma.replace(local_position=None)
  assert not np.allclose(T.DecoderOnly(gemma).apply(params, inputs), T.DecoderOnly(one_base).apply(params, inputs),
                         atol=1e-4)
  np.testing.assert_array_equal(T.DecoderOnly(gemma.replace(position=T.PositionConfig('rope', rope_base=1e4)))
                                .apply(params, inputs), T.DecoderOnly(one_base.replace(
                                    position=T.PositionConfig('rope', rope_base=1e4))).apply(params, inputs))


@pytest.mark.parametrize('changes, message', [
    (dict(local_position=T.PositionConfig('rope')), r"local_position: got 'rope'; valid: None with layer_types='full'"),
    (dict(local_position=T.PositionConfig('sinusoidal'), layer_types='sliding,full', sliding_window=4),
     r"local_position.kind: got 'sinusoidal'; valid: with model.local_position, a variant that does not add"),
    (dict(attention_softcap=-1.0), r'attention_softcap: got -1.0; valid: a finite number >= 0'),
    (dict(query_scale=float('nan')), r'query_scale: got nan; valid: a finite number >= 0'),
])
def test_an_attention_option_that_cannot_be_served_is_refused_naming_the_field(changes, message):
  with pytest.raises(ValueError, match=message):
    _decoder(**changes)


def test_sinks_and_caps_are_refused_where_the_weights_are_not_a_softmax():
  inputs = tokens(1, 6)
  for field, value in (('attention_sinks', True), ('attention_softcap', 5.0)):
    with pytest.raises(ValueError, match=rf'model.{field}: got {value!r} with stick_breaking'):
      T.DecoderOnly(_decoder('stick_breaking', **{field: value})).init(jax.random.PRNGKey(0), inputs)


@pytest.mark.parametrize('window, chunk', [(5, 0), (12, 0), (1, 0), (0, 6), (0, 16), (0, 0)])
@pytest.mark.parametrize('offset', [0, 3])
def test_the_kernel_visits_exactly_the_blocks_that_hold_an_allowed_key(window, chunk, offset):
  """For every query block, the key blocks from _first_key_block_seen to _key_blocks_seen; for every key block, the
  query blocks from _first_query_block_seeing to _query_blocks_seeing: each range is the blocks holding at least
  one (query, key) pair the causal mask, window and chunk allow (queries and keys 40 + offset and 40, by 8)."""
  block, length_q, length_k = 8, 40, 40 + offset
  static = flash_attention._Static(block, block, True, offset, 1.0, None, 1, 'interpret', window=window, chunk=chunk)

  def allowed(i, j):
    last = i + offset
    return j <= last and (not window or last - j < window) and (not chunk or last // chunk == j // chunk)
  pairs = {(i // block, j // block) for i in range(length_q) for j in range(length_k) if allowed(i, j)}
  for query_block in range(length_q // block):
    seen = range(int(flash_attention._first_key_block_seen(static, query_block)),
                 int(flash_attention._key_blocks_seen(static, query_block, -(-length_k // block))))
    assert list(seen) == sorted(k for q, k in pairs if q == query_block), query_block
  for key_block in range(-(-length_k // block)):
    seeing = range(int(flash_attention._first_query_block_seeing(static, key_block)),
                   int(flash_attention._query_blocks_seeing(static, key_block, length_q // block)))
    assert list(seeing) == sorted(q for q, k in pairs if k == key_block), key_block
