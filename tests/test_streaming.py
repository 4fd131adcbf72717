"""StreamingLLM's cache (Xiao et al. 2023; transformer/rolling_cache.py): the first S tokens and the N - S most
recent ones, positions by slot. In one layer the keys and values of a token depend on it alone, so a step through
the cache equals the whole pass over the sink tokens followed by the recent ones (positions 0 .. N - 1); a cache
longer than the stream is plain decoding; its size does not grow with the stream."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from tests.helpers import tiny


def _streamed(model, variables, tokens, sinks: int, size: int):
  """The logits of each token fed one at a time through the streaming cache, and the cache."""
  cache, stepped = None, []
  for index in range(tokens.shape[1]):
    logits, updated = model.apply(variables if cache is None else {**variables, 'cache': cache},
                                  tokens[:, index:index + 1], use_cache=True, streaming=(sinks, size),
                                  mutable=['cache'])
    cache = updated['cache']
    stepped.append(np.asarray(logits[:, 0]))
  return np.stack(stepped, axis=1), cache


def _recomputed(model, variables, tokens, sinks: int, size: int):
  """At each step t, the last logits of the whole pass over tokens[:S] and the N - S tokens up to t (all of them
  while t < N)."""
  rows = []
  for t in range(tokens.shape[1]):
    context = tokens[:, :t + 1] if t < size else jnp.concatenate(
        [tokens[:, :sinks], tokens[:, t - (size - sinks) + 1:t + 1]], axis=1)
    rows.append(np.asarray(model.apply(variables, context))[:, -1])
  return np.stack(rows, axis=1)


@pytest.mark.parametrize('kind', ['rope', 'alibi', 'none', 't5', 'xpos'])
@pytest.mark.parametrize('sinks', [0, 2])
def test_one_layer_streams_as_the_whole_pass_over_its_sinks_and_recent_tokens(kind, sinks):
  model = T.DecoderOnly(tiny(kind, num_encoder_layers=0, num_decoder_layers=1, vocab_size=16))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 16, (2, 20)))
  variables = model.init(jax.random.PRNGKey(0), tokens)
  stepped, cache = _streamed(model, variables, tokens, sinks, 6)
  np.testing.assert_allclose(stepped, _recomputed(model, variables, tokens, sinks, 6), atol=2e-5, rtol=1e-5)
  assert cache['decoder']['layer_0']['self_attention']['streamed_key'].shape[1] == 6


def test_a_cache_longer_than_the_stream_decodes_as_the_whole_pass():
  """Four layers, a sliding one among them: with N >= the stream, positions by slot are the positions."""
  model = T.DecoderOnly(tiny('rope', num_encoder_layers=0, num_decoder_layers=4, vocab_size=16,
                             layer_types='sliding,full', sliding_window=3))
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 16, (2, 12)))
  variables = model.init(jax.random.PRNGKey(0), tokens)
  stepped, _ = _streamed(model, variables, tokens, 4, 12)
  np.testing.assert_allclose(stepped, model.apply(variables, tokens), atol=2e-5, rtol=1e-5)


def test_the_cache_does_not_grow_with_the_stream():
  model = T.DecoderOnly(tiny('rope', num_encoder_layers=0, num_decoder_layers=2, vocab_size=16))
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 16, (1, 40)))
  variables = model.init(jax.random.PRNGKey(0), tokens)
  _, short = _streamed(model, variables, tokens[:, :8], 2, 8)
  _, long = _streamed(model, variables, tokens, 2, 8)
  assert jax.tree_util.tree_map(np.shape, short) == jax.tree_util.tree_map(np.shape, long)
  assert int(long['decoder']['index']) == 40


@pytest.mark.parametrize('kind, streaming, tokens, message', [
    ('rope', (8, 8), 1, r'streaming: got 8 sink tokens in a cache of 8'),
    ('rope', (2, 8), 2, r'streaming: valid in a decoder-only stack fed one token a call'),
    ('fox', (2, 8), 1, r'streaming: got a model of fox; valid: a variant that keeps no per-token cache'),
])
def test_a_stream_that_cannot_be_served_is_refused(kind, streaming, tokens, message):
  model = T.DecoderOnly(tiny(kind, num_encoder_layers=0, num_decoder_layers=1, vocab_size=16))
  inputs = jnp.zeros((1, tokens), jnp.int32)
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
  with pytest.raises(ValueError, match=message):
    model.apply(variables, inputs, use_cache=True, streaming=streaming, mutable=['cache'])
