"""FIRE's own claims beyond the shared suite: its inputs lie in [0, 1] for every key a query sees, at
any length (the progressive interpolation), and its settings' edges are refused by name."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer.positions import fire


@pytest.mark.parametrize('length', [8, 100, 5000])
def test_inputs_lie_in_zero_one_at_any_length(length):
  positions = jnp.arange(length)[None]
  inputs = np.asarray(fire.fire_inputs(positions, positions, jnp.asarray(0.1), jnp.asarray(64.0)))[0]
  past = np.tril(np.ones((length, length), bool))
  assert inputs[past].min() == 0.0 and inputs[past].max() <= 1.0
  if length > 64:  # beyond the threshold the query's own first key reaches 1 - eps
    np.testing.assert_allclose(inputs[-1, 0], 1.0, atol=1e-5)


@pytest.mark.parametrize('field,value,message', [
    ('fire_threshold', 0.0, 'position.fire_threshold: got 0.0; valid: a number of positions in (0, 16777216]'),
    ('fire_threshold', 1e308, 'position.fire_threshold: got 1e+308; valid: a number of positions in (0, 16777216]'),
    ('fire_mlp_width', 0, 'position.fire_mlp_width: got 0; valid: a positive integer')])
def test_settings_edges_are_refused(field, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    T.PositionConfig('fire', **{field: value})
