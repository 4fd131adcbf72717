"""Scalable softmax (model.position.ssmax, transformer/positions/ssmax.py) beyond the shared suite's
naive loop: n counted per document, past padding and through the cache; every core serves it; the
paper's claim that the top weight does not fade; its settings refused in one line."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from tests.helpers import init, random_positions, tiny, tokens
from tests.test_positions import _packed_row
from transformer.positions import ssmax

SSMAX = {'ssmax': True}


def _randomised_scales(params, seed=4):
  """Every layer's s_h drawn from [0.2, 1.2): heads and layers differ."""
  def draw(path, leaf):
    if getattr(path[-1], 'key', None) != 'ssmax_scale':
      return leaf
    key = jax.random.fold_in(jax.random.PRNGKey(seed), hash(jax.tree_util.keystr(path)) % (2 ** 31))
    return jax.random.uniform(key, leaf.shape, minval=0.2, maxval=1.2)
  return jax.tree_util.tree_map_with_path(draw, params)


def test_the_top_weight_does_not_fade_with_the_number_of_keys():
  """One key whose logit exceeds the n - 1 others by delta: softmax gives it e^delta / (e^delta + n - 1),
  fading as 1/n; SSMax n^(s delta) / (n^(s delta) + n - 1), which for s delta = 1 is n / (2n - 1), above
  1/2 at every n."""
  delta, scale = 2.0, 0.5
  for n in (16, 256, 4096):
    query_1x1x1x1 = jnp.ones((1, 1, 1, 1))
    scaled = ssmax.scalable_query(query_1x1x1x1, jnp.array([scale]), jnp.full((1, 1, 1), float(n)))
    logits = float(scaled[0, 0, 0, 0]) * jnp.concatenate([jnp.array([delta]), jnp.zeros(n - 1)])
    top = float(jax.nn.softmax(logits)[0])
    assert math.isclose(top, n / (2 * n - 1), rel_tol=1e-5) and top > 0.5, (n, top)
    assert float(jax.nn.softmax(delta * jnp.eye(n)[0])[0]) < 0.5 * (16 / n) ** 0.9


def test_keys_seen_counts_the_mask_row():
  causal_1x1xLxL = T.causal_mask(4)
  np.testing.assert_array_equal(ssmax.keys_seen(causal_1x1xLxL, 2, 4, 4)[..., 0], [[1, 2, 3, 4]] * 2)
  padded = jnp.array([[True, True, False, False]])[:, None, None, :]
  np.testing.assert_array_equal(ssmax.keys_seen(padded, 1, 3, 4)[..., 0], [[2, 2, 2]])
  np.testing.assert_array_equal(ssmax.keys_seen(None, 1, 3, 5)[..., 0], [[5, 5, 5]])


@pytest.mark.parametrize('kind', ['alibi', 'rope'])
def test_packed_documents_score_as_each_document_alone(kind):
  """n_i counts the keys of the query's own document: a packed row gives each document's logits alone."""
  lengths = (3, 5, 4)
  model = T.DecoderOnly(tiny(kind, num_decoder_layers=2, position=SSMAX))
  x, positions, segments = _packed_row(lengths)
  params = _randomised_scales(random_positions(init(model, x)))
  packed = model.apply(params, x, positions_BxL=positions, segments_BxL=segments)
  start = 0
  for length in lengths:
    np.testing.assert_allclose(packed[:, start:start + length], model.apply(params, x[:, start:start + length]),
                               atol=2e-5, rtol=2e-5)
    start += length


def test_padding_is_not_counted_in_an_encoder():
  """Right padding after 5 real tokens of 8: the real positions' outputs are those of the 5 tokens alone."""
  model = T.EncoderOnly(tiny('none', pooling='mean', position=SSMAX))
  x = tokens(1, 8)
  valid = jnp.arange(8)[None] < 5
  params = _randomised_scales(init(model, x, valid_BxL=valid))
  np.testing.assert_allclose(model.apply(params, x, valid_BxL=valid), model.apply(params, x[:, :5]), atol=2e-5,
                             rtol=2e-5)


def test_cached_steps_give_the_whole_forward_pass():
  decoder_only = T.DecoderOnly(tiny('rope', position=SSMAX))
  target = tokens(2, 7, seed=2)
  params = _randomised_scales(init(decoder_only, target))
  _, cache = decoder_only.apply(params, jnp.zeros_like(target), use_cache=True, mutable=['cache'])
  steps, start = [], 0
  for size in (2, 1, 1, 3):
    logits, updated = decoder_only.apply({**params, 'cache': cache['cache']}, target[:, start:start + size],
                                         use_cache=True, mutable=['cache'])
    cache, start = updated, start + size
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), decoder_only.apply(params, target), atol=2e-5,
                             rtol=1e-5)


@pytest.mark.parametrize('implementation', ['blockwise', 'xla', 'pallas'])
def test_every_core_serves_it(implementation):
  """The scaled queries go into any core: blocks of 4 over 12 tokens, XLA's fused attention, the Pallas
  kernel (interpreted) with ALiBi's term inside, all give the explicit softmax's logits."""
  x = tokens(2, 12)
  explicit = T.DecoderOnly(tiny('alibi', position=SSMAX))
  other = T.DecoderOnly(tiny('alibi', position=SSMAX, attention_implementation=implementation, attention_block_size=4,
                             attention_key_block_size=4 if implementation == 'blockwise' else 0))
  params = _randomised_scales(init(explicit, x))
  np.testing.assert_allclose(other.apply(params, x), explicit.apply(params, x), atol=3e-5, rtol=3e-5)


def test_without_the_setting_nothing_changes():
  model = T.DecoderOnly(tiny('rope'))
  params = init(model, tokens(1, 4))
  assert 'ssmax_scale' not in str(jax.tree_util.tree_structure(params))


@pytest.mark.parametrize('field,value,valid', [('ssmax_initial_scale', 0.0, 'a finite number > 0'),
                                               ('ssmax_initial_scale', math.nan, 'a finite number > 0'),
                                               ('ssmax', 'yes', 'true or false')])
def test_settings_are_refused_in_one_line(field, value, valid):
  with pytest.raises(ValueError, match=rf'^position\.{field}: got .*; valid: {valid}$'):
    T.PositionConfig('rope', **{field: value})
