"""transformer/tiled_attention.py: causal attention in rolled tiles against a float64 loop (padding, documents, a
sink, a cap, lengths that are no multiple of the tile), its gradients against the blockwise core's, and which
layers the blockwise core runs in tiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import attention_core
from transformer.attention_request import AttentionMask
from transformer.blockwise import blockwise_attention
from transformer.tiled_attention import tiled_causal_attention
from tests.helpers import init, tiny, tokens

BATCH, LENGTH, HEADS, GROUPS, WIDTH = 2, 37, 4, 2, 8


def _inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  query = rng.normal(size=(BATCH, LENGTH, HEADS, WIDTH)).astype(np.float32)
  key = rng.normal(size=(BATCH, LENGTH, GROUPS, WIDTH)).astype(np.float32)
  value = rng.normal(size=(BATCH, LENGTH, GROUPS, WIDTH)).astype(np.float32)
  key_valid = rng.random((BATCH, LENGTH)) > 0.25
  key_valid[:, 5] = False  # row 5 of a document starting there sees no key
  segments = np.sort(rng.integers(0, 3, (BATCH, LENGTH)), axis=1)
  segments[:, 5:] += 7
  sink = rng.normal(size=(HEADS,)).astype(np.float32)
  return query, key, value, key_valid, segments, sink


def _loop(query, key, value, key_valid, segments, sink, softcap, scale):
  """softmax over the allowed keys j <= i (and the sink) in float64, one query at a time; zeros where no key."""
  output = np.zeros(query.shape[:3] + (value.shape[-1],))
  for b in range(BATCH):
    for h in range(HEADS):
      g = h // (HEADS // GROUPS)
      for i in range(LENGTH):
        keys = [j for j in range(i + 1) if (key_valid is None or key_valid[b, j])
                and (segments is None or segments[b, j] == segments[b, i])]
        logits = [float(np.dot(query[b, i, h].astype(np.float64), key[b, j, g])) * scale for j in keys]
        if softcap:
          logits = [softcap * np.tanh(x / softcap) for x in logits]
        extra = [] if sink is None else [float(sink[h])]
        if not keys:
          continue
        shift = max(logits + extra)
        weights = np.exp(np.array(logits) - shift)
        total = weights.sum() + sum(np.exp(x - shift) for x in extra)
        output[b, i, h] = (weights[:, None] * value[b, keys, g].astype(np.float64)).sum(0) / total
  return output


@pytest.mark.parametrize('tile', [4, 16, 64])
@pytest.mark.parametrize('parts', ['none', 'padding_documents_sink_cap'])
def test_tiles_equal_a_float64_loop(tile, parts):
  """Every tile size (the last one padded: 37 positions), with and without the keys' padding, documents, a sink
  logit per head and a soft cap."""
  query, key, value, key_valid, segments, sink = _inputs()
  if parts == 'none':
    key_valid = segments = sink = None
  softcap = 3.0 if parts != 'none' else 0.0
  got = tiled_causal_attention(jnp.asarray(query), jnp.asarray(key), jnp.asarray(value), scale=0.3,
                               key_valid_BxL=None if key_valid is None else jnp.asarray(key_valid),
                               segments_BxL=None if segments is None else jnp.asarray(segments), softcap=softcap,
                               sink_H=None if sink is None else jnp.asarray(sink), tile=tile, backward_block_size=8)
  expected = _loop(query, key, value, key_valid, segments, sink, softcap, 0.3)
  np.testing.assert_allclose(np.asarray(got), expected, atol=2e-6, rtol=1e-5)


def test_gradients_are_the_blockwise_cores():
  """Differentiated, the attention is blockwise.py's: the same value and gradients for the queries, keys, values
  and sink, jitted or not."""
  query, key, value, key_valid, segments, sink = (jnp.asarray(array) for array in _inputs(1))
  mask = AttentionMask(causal=True, in_parts=True, key_valid_BxLk=key_valid, segments_BxL=segments)

  def loss(attend):
    return lambda q, k, v, s: jnp.sum(jnp.sin(attend(q, k, v, s)))
  tiled = loss(lambda q, k, v, s: tiled_causal_attention(q, k, v, scale=0.3, key_valid_BxL=key_valid,
                                                         segments_BxL=segments, sink_H=s, tile=8,
                                                         backward_block_size=8))
  blocked = loss(lambda q, k, v, s: blockwise_attention(q, k, v, block_size=8, mask=mask.block, scale=0.3,
                                                        skip_future_blocks=True, sink_H=s))
  expected_value, expected = jax.value_and_grad(blocked, argnums=(0, 1, 2, 3))(query, key, value, sink)
  for got_value, got in (jax.value_and_grad(tiled, argnums=(0, 1, 2, 3))(query, key, value, sink),
                         jax.jit(jax.value_and_grad(tiled, argnums=(0, 1, 2, 3)))(query, key, value, sink)):
    np.testing.assert_array_equal(got_value, expected_value)  # differentiated, the blocks run forward too
    for got_leaf, expected_leaf in zip(got, expected):
      np.testing.assert_allclose(got_leaf, expected_leaf, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('kind, tiled', [('rope', True), ('none', True), ('alibi', False)])
def test_the_blockwise_core_runs_a_causal_layer_without_terms_in_tiles(kind, tiled, monkeypatch):
  """A decoder's full layers in blocks: RoPE and no positions (no logits term) in tiles, with the logits of the
  model without blocks; ALiBi (a term) in blockwise.py's blocks."""
  calls = []
  original = attention_core.tiled_causal_attention
  monkeypatch.setattr(attention_core, 'tiled_causal_attention', lambda *a, **k: calls.append(1) or original(*a, **k))
  inputs = tokens(2, 20)
  dense = T.DecoderOnly(tiny(kind, num_decoder_layers=1))
  blocked = T.DecoderOnly(tiny(kind, num_decoder_layers=1, attention_block_size=8))
  params = init(dense, inputs)
  np.testing.assert_allclose(blocked.apply(params, inputs), dense.apply(params, inputs), atol=2e-5, rtol=1e-5)
  assert len(calls) == (1 if tiled else 0)
