"""The pattern of variants by layer: each layer runs its own kind's hooks, a pattern of one kind is that
kind, and patterns that cannot be built are refused by name."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from tests.helpers import init, random_positions, tiny, tokens


def test_each_layer_runs_the_hooks_of_its_kind():
  """'alibi,none' over four layers: layers 0 and 2 add ALiBi's bias, layers 1 and 3 nothing."""
  model = T.DecoderOnly(tiny('layer_pattern', num_decoder_layers=4, position={'layer_pattern': 'alibi,none'}))
  x = tokens(2, 6)
  terms = {}

  def record(next_fun, args, kwargs, context):
    result = next_fun(*args, **kwargs)
    if context.method_name == 'logits' and type(context.module).__name__ == 'PatternLayer':
      terms[context.module.layer_index] = result
    return result

  with nn.intercept_methods(record):
    model.apply(init(model, x), x)
  assert sorted(terms) == [0, 1, 2, 3]
  assert terms[1] is None and terms[3] is None
  expected = T.positions.alibi_bias(np.arange(6)[None], np.arange(6)[None], 4, causal=True)
  np.testing.assert_allclose(terms[0], expected)
  np.testing.assert_allclose(terms[2], expected)


@pytest.mark.parametrize('kind', ['rope', 'alibi', 'none'])
def test_a_pattern_of_one_kind_is_that_kind(kind):
  x = tokens(2, 7)
  alone = T.DecoderOnly(tiny(kind))
  params = init(alone, x)
  pattern = T.DecoderOnly(tiny('layer_pattern', position={'layer_pattern': kind}))
  np.testing.assert_allclose(pattern.apply(params, x), alone.apply(params, x), atol=1e-6)
  assert jax.tree_util.tree_structure(init(pattern, x)) == jax.tree_util.tree_structure(params)


def test_a_pattern_with_cope_counts_each_packed_document_alone():
  """'cope,alibi': CoPE's gates read the mask the pattern's stack hands its layer in a packed row, so a row
  of two documents of 4 gives each document's outputs alone (position parameters randomised)."""
  model = T.DecoderOnly(tiny('layer_pattern', num_decoder_layers=2, position={'layer_pattern': 'cope,alibi'}))
  x = tokens(2, 8)
  params = random_positions(init(model, x))
  packed = model.apply(params, x, positions_BxL=jnp.asarray([[0, 1, 2, 3] * 2] * 2),
                       segments_BxL=jnp.asarray([[0] * 4 + [1] * 4] * 2))
  alone = model.apply(params, jnp.concatenate([x[:, :4], x[:, 4:]]))
  np.testing.assert_allclose(packed[:, :4], alone[:2], atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(packed[:, 4:], alone[2:], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize('pattern,causal,message', [
    ('rope,sinusoidal', True, "position.layer_pattern: got 'rope,sinusoidal'; valid: a comma-separated list of kinds"),
    ('rope,,none', True, "position.layer_pattern: got 'rope,,none'; valid: a comma-separated list"),
    ('xpos,none', False, "position.layer_pattern: got 'xpos,none'; valid: in bidirectional attention .*; xpos is"),
    ('rope', False, None)])
def test_patterns_that_cannot_be_built_are_refused(pattern, causal, message):
  def build():
    T.PositionConfig('layer_pattern', layer_pattern=pattern).check_attention(4, 8, causal)
  if message is None:
    build()
  else:
    with pytest.raises(ValueError, match=message):
      build()


def test_its_claims_are_those_of_its_parts():
  assert T.PositionConfig('layer_pattern', layer_pattern='rope,none').shift_invariant
  assert not T.PositionConfig('layer_pattern', layer_pattern='rope,tupe_a').shift_invariant
  assert T.PositionConfig('layer_pattern', layer_pattern='rope,tupe_a', absolute_table='learned',
                          max_length=99).settings.longest_sequence() == 99
