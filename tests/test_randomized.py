"""Randomized positions (Ruoss et al. 2023): the draw itself, that R = L gives every variant its plain
positions back, that the draw reaches the model through the 'positions' rng, that cached decoding keeps
the positions of the full pass, and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from configs import smoke
from experiments.runs import settings
from tests.helpers import init, random_positions, tiny, tokens, with_overrides


def test_a_draw_is_a_sorted_subset_and_each_row_keeps_its_valid_count():
  positions = np.asarray(T.positions.randomized_positions(jax.random.PRNGKey(3), 10, 40))
  assert positions.shape == (1, 10)
  assert np.all(np.diff(positions[0]) > 0) and positions.min() >= 0 and positions.max() < 40
  valid = jnp.arange(10)[None] < jnp.asarray([[10], [4], [1]])
  rows = np.asarray(T.positions.randomized_positions(jax.random.PRNGKey(3), 10, 40, valid))
  for row, count in zip(rows, (10, 4, 1)):
    assert np.all(np.diff(row[:count]) > 0) and row[:count].max() < 40
    assert set(row[:count]) <= set(positions[0]) and np.all(row[count:] == 39)
  # Over many draws each value of [0, R) is about equally likely (expected count 25 * 10 / 40 = 6.25 each).
  counts = np.bincount(np.concatenate([np.asarray(T.positions.randomized_positions(jax.random.PRNGKey(k), 10, 40))[0]
                                       for k in range(25)]), minlength=40)
  assert counts.sum() == 250 and counts.max() < 16


def test_drawing_more_positions_than_r_is_refused():
  with pytest.raises(ValueError, match='randomized_max_length: got 8; valid: at least the sequence length 9'):
    T.positions.randomized_positions(jax.random.PRNGKey(0), 9, 8)


@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_r_equal_to_the_length_gives_the_plain_positions(kind):
  """The only 7-subset of [0, 7) is 0 .. 6: every variant's outputs are those without randomization."""
  x = tokens(2, 7)
  plain = T.DecoderOnly(tiny(kind))
  params = random_positions(init(plain, x))
  randomized = T.DecoderOnly(tiny(kind, randomized_max_length=7))
  np.testing.assert_allclose(randomized.apply(params, x, rngs={'positions': jax.random.PRNGKey(5)}),
                             plain.apply(params, x), atol=1e-5, rtol=1e-5)


def test_the_positions_rng_moves_the_positions_of_a_variant_that_reads_them():
  x = tokens(2, 7)
  for kind, moves in (('rope', True), ('none', False)):
    model = T.DecoderOnly(tiny(kind, randomized_max_length=64))
    params = init(model, x)
    first, second = (model.apply(params, x, rngs={'positions': jax.random.PRNGKey(k)}) for k in (1, 2))
    assert (not np.allclose(first, second, atol=1e-5)) == moves, kind
    np.testing.assert_array_equal(model.apply(params, x), model.apply(params, x))  # no rng: PRNGKey(0), reproducible


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['rope', 't5', 'alibi', 'transformer_xl'])
def test_cached_decoding_keeps_the_positions_of_the_full_pass(kind):
  model = T.DecoderOnly(tiny(kind, randomized_max_length=50))
  target = tokens(2, 6)
  params = random_positions(init(model, target))
  whole = model.apply(params, target)
  _, state = model.apply(params, jnp.zeros_like(target), use_cache=True, mutable=['cache'])
  cache, logits = state['cache'], []
  for start, size in ((0, 2), (2, 1), (3, 3)):
    step_logits, state = model.apply({**params, 'cache': cache}, target[:, start:start + size], use_cache=True,
                                     mutable=['cache'])
    cache = state['cache']
    logits.append(step_logits)
  np.testing.assert_allclose(jnp.concatenate(logits, axis=1), whole, atol=2e-5, rtol=1e-5)


def test_refusals_name_the_field_and_what_is_valid():
  with pytest.raises(settings.ConfigError, match=r'^model.randomized_max_length: got 20; valid: 0 \(off\) or at least '):
    settings.from_config_dict(with_overrides(smoke.get_config(), {'model.randomized_max_length': 20}), 8)
  with pytest.raises(ValueError, match=r'randomized_max_length: got 100; valid: 0 \(off\) or at most '
                                       r'position.max_length=64'):
    tiny('learned', position={'max_length': 64}, randomized_max_length=100)
  experiment = settings.from_config_dict(with_overrides(smoke.get_config(), {'model.randomized_max_length': 256}), 8)
  assert experiment.model.randomized_max_length == 256
  assert settings.evaluation_width_cap(experiment) == 256


@pytest.mark.slow
def test_padding_does_not_change_the_positions_or_outputs_of_the_valid_tokens():
  """A row with n valid tokens takes the first n entries of the same permutation that an unpadded call of
  length n draws: with one key, padded and unpadded calls give the valid tokens the same outputs."""
  model = T.DecoderOnly(tiny('rope', randomized_max_length=40))
  target = tokens(2, 4)
  padded = jnp.concatenate([target, jnp.zeros((2, 3), target.dtype)], axis=1)
  valid = jnp.arange(7)[None] < 4
  params = init(model, padded)
  key = {'positions': jax.random.PRNGKey(9)}
  np.testing.assert_allclose(model.apply(params, padded, valid_BxL=jnp.broadcast_to(valid, (2, 7)), rngs=key)[:, :4],
                             model.apply(params, target, rngs=key), atol=1e-5)
