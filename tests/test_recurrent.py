import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from tests.helpers import assert_causal, init, tiny, tokens


@pytest.mark.slow
@pytest.mark.parametrize('architecture', ['lstm', 'rnn'])
@pytest.mark.parametrize('kind', T.MODEL_KINDS)
def test_recurrent_baselines_take_and_give_what_the_transformer_does(architecture, kind):
  transformer_config = tiny()
  recurrent_config = transformer_config.replace(architecture=architecture)
  x, y = tokens(2, 6), tokens(2, 4, seed=1)
  args = (x, y) if kind == 'encoder_decoder' else (x,)
  ours = T.build_model(recurrent_config, kind)
  assert type(ours).__name__.startswith('Recurrent')
  reference = T.build_model(transformer_config, kind)
  assert ours.apply(init(ours, *args), *args).shape == reference.apply(init(reference, *args), *args).shape


@pytest.mark.slow
@pytest.mark.parametrize('architecture', ['lstm', 'rnn'])
def test_recurrent_language_model_is_causal(architecture):
  config = tiny(architecture=architecture)
  model = T.RecurrentDecoderOnly(config)
  x = tokens(1, 5)
  assert_causal(model, init(model, x), (x,), 5, config.model_dim)


@pytest.mark.slow
@pytest.mark.parametrize('bidirectional', [True, False])
def test_recurrent_encoder_ignores_padding(bidirectional):
  config = tiny(architecture='lstm', bidirectional=bidirectional)
  model = T.RecurrentEncoderOnly(config)
  x = tokens(2, 5)
  padded = jnp.concatenate([x, jnp.zeros((2, 3), x.dtype)], axis=1)
  valid = jnp.arange(8)[None] < 5
  params = init(model, padded)
  np.testing.assert_allclose(model.apply(params, padded, valid_BxL=jnp.broadcast_to(valid, (2, 8))),
                             model.apply(params, x), atol=1e-5)


@pytest.mark.slow
def test_recurrent_encoder_decoder_greedy_decodes():
  config = tiny(architecture='lstm')
  model = T.RecurrentEncoderDecoder(config)
  source = tokens(2, 5)
  params = init(model, source, source)
  decoded = T.greedy_decode(model, params, source, bos_id=1, max_length=3)
  target = jnp.ones((2, 1), jnp.int32)
  for _ in range(3):
    target = jnp.concatenate([target, jnp.argmax(model.apply(params, source, target)[:, -1], -1)[:, None]], 1)
  np.testing.assert_array_equal(decoded, target[:, 1:])


def test_unknown_model_kind_lists_valid_ones():
  with pytest.raises(ValueError, match="model kind: got 'seq2seq'; valid: decoder_only, encoder_decoder"):
    T.build_model(tiny(), 'seq2seq')
