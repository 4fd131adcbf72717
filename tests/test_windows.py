"""Local attention by layer (model.layer_types, sliding_window, attention_chunk_size; transformer/masks.py
window_mask): the mask against its definition, every CPU core against a float64 loop, the receptive field of one
layer through its inputs, a window as long as the sequence equal to full attention, and cached decoding past 4W
equal to the whole forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import attention_core
from transformer.attention_request import AttentionMask, AttentionRequest, CoreSettings
from transformer.masks import causal_mask, window_mask


def _allowed(i: int, j: int, window: int, chunk: int, causal: bool) -> bool:
  """The definition, one pair at a time."""
  if causal and j > i:
    return False
  if window and not (i - j < window if causal else abs(i - j) < window):
    return False
  return not chunk or i // chunk == j // chunk


@pytest.mark.parametrize('window, chunk, causal', [(3, 0, True), (3, 0, False), (0, 4, True), (1, 0, True)])
def test_the_window_mask_is_its_definition(window, chunk, causal):
  length = 11
  positions = np.arange(length)[None]
  got = np.asarray(window_mask(positions, positions, window=window, chunk=chunk, causal=causal))[0, 0]
  if causal:
    got = got & np.asarray(causal_mask(length))[0, 0]
  expected = np.array([[_allowed(i, j, window, chunk, causal) for j in range(length)] for i in range(length)])
  np.testing.assert_array_equal(got, expected)
  if window == 1:
    assert (got == np.eye(length, dtype=bool)).all()  # W = 1: a query sees itself alone


def _loop_attention(query, key, value, window, chunk, sink_H=None, softcap=0.0):
  """softmax over the allowed keys (and the head's sink, in the denominator alone), the logits capped to
  c tanh(x / c), one query and head at a time, in float64."""
  query, key, value = (np.asarray(a, np.float64) for a in (query, key, value))
  batch, length, heads, width = query.shape
  out = np.zeros((batch, length, heads, value.shape[-1]))
  for b in range(batch):
    for h in range(heads):
      for i in range(length):
        keys = [j for j in range(length) if _allowed(i, j, window, chunk, True)]
        logits = np.array([query[b, i, h] @ key[b, j, h] for j in keys]) / np.sqrt(width)
        if softcap:
          logits = softcap * np.tanh(logits / softcap)
        exponentials = np.exp(logits)
        denominator = exponentials.sum() + (0.0 if sink_H is None else np.exp(float(sink_H[h])))
        out[b, i, h] = (exponentials / denominator) @ value[b, keys, h]
  return out


# (core, its blocks, whether the mask goes in as its parts): blockwise without a term runs every block at once
# (local_attention.py), the fused call takes a window as local_window_size, the kernel skips the blocks outside.
CORES = [('explicit', (0, 0), False), ('blockwise', (4, 4), False), ('xla', (0, 0), False), ('xla', (0, 0), True),
         ('pallas', (8, 8), True)]


# jax.nn.dot_product_attention has no logit cap: the xla core refuses one (tests/test_attention_core.py).
SOFTMAX_OPTIONS = [(core, sinks, softcap) for core in CORES for sinks, softcap in ((False, 0.0), (True, 0.0), (True, 1.5))
                   if not (softcap and core[0] == 'xla')]


@pytest.mark.parametrize('core, sinks, softcap', SOFTMAX_OPTIONS)
@pytest.mark.parametrize('window, chunk', [(5, 0), (0, 6), (0, 0)])
def test_every_core_attends_within_the_window_as_a_float64_loop(core, sinks, softcap, window, chunk):
  """The window or chunk, GPT-OSS's sinks and Gemma 2's cap in every core, against the loop."""
  core, blocks, in_parts = core
  rng = np.random.default_rng(0)
  length = 19
  query, key, value = (jnp.asarray(rng.normal(size=(2, length, 2, 8)) * 1.5, jnp.float32) for _ in range(3))
  sink_H = jnp.asarray([1.5, -0.5], jnp.float32) if sinks else None
  positions = np.arange(length)[None]
  mask = jnp.logical_and(causal_mask(length), window_mask(positions, positions, window=window, chunk=chunk))
  request = AttentionRequest(query, key, value, 1 / np.sqrt(8),
                             AttentionMask(mask, causal=True, window=window, chunk=chunk, in_parts=in_parts),
                             softcap=softcap, sink_H=sink_H)
  got = attention_core.attend(core, request, CoreSettings('cpu', *blocks)).output_BxLqxHxV
  np.testing.assert_allclose(np.asarray(got), _loop_attention(query, key, value, window, chunk, sink_H, softcap),
                             atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('core, blocks, in_parts', [case for case in CORES if case[0] != 'explicit'])
@pytest.mark.parametrize('window, chunk', [(5, 0), (0, 6)])
def test_every_core_gives_the_explicit_cores_gradients_with_sinks_and_a_cap(core, blocks, in_parts, window, chunk):
  """d/d(q, k, v, sinks) of a loss on the output, every core against the explicit softmax (the kernel's sink
  gradient is formed outside it from each row's log-sum-exp)."""
  rng = np.random.default_rng(1)
  length = 19
  query, key, value = (jnp.asarray(rng.normal(size=(1, length, 2, 8)), jnp.float32) for _ in range(3))
  sink_H = jnp.asarray([0.5, -1.0], jnp.float32)
  positions = np.arange(length)[None]
  mask = AttentionMask(jnp.logical_and(causal_mask(length), window_mask(positions, positions, window=window,
                                                                        chunk=chunk)),
                       causal=True, window=window, chunk=chunk, in_parts=in_parts)
  softcap = 0.0 if core == 'xla' else 1.5
  weights = jnp.asarray(rng.normal(size=(1, length, 2, 8)), jnp.float32)

  def loss(name, settings, q, k, v, s):
    request = AttentionRequest(q, k, v, 1 / np.sqrt(8), mask, softcap=softcap, sink_H=s)
    return jnp.sum(attention_core.attend(name, request, settings).output_BxLqxHxV * weights)
  expected = jax.grad(loss, argnums=(2, 3, 4, 5))('explicit', CoreSettings('cpu'), query, key, value, sink_H)
  got = jax.grad(loss, argnums=(2, 3, 4, 5))(core, CoreSettings('cpu', *blocks), query, key, value, sink_H)
  for got_part, expected_part in zip(got, expected):
    np.testing.assert_allclose(np.asarray(got_part), np.asarray(expected_part), atol=5e-5, rtol=1e-4)
  assert np.abs(np.asarray(expected[3])).min() > 1e-3  # the sinks' gradient is there to compare


def _one_layer(kind='rope', **changes):
  return T.tiny_preset(T.PositionConfig(kind), **{**dict(num_encoder_layers=0, num_decoder_layers=1, vocab_size=16),
                                                  **changes})


def _changed_by(model, variables, tokens, i: int, atol: float = 0.0) -> list:
  """The positions j whose token, when changed, changes the logits at position i (by more than atol)."""
  base = np.asarray(model.apply(variables, tokens))
  found = []
  for j in range(tokens.shape[1]):
    other = tokens.at[0, j].set((tokens[0, j] + 1) % 16)
    if not np.allclose(np.asarray(model.apply(variables, other))[0, i], base[0, i], rtol=0, atol=atol):
      found.append(j)
  return found


@pytest.mark.parametrize('changes, expected', [
    (dict(layer_types='sliding', sliding_window=4), [7, 8, 9, 10]),
    (dict(layer_types='chunked', attention_chunk_size=4), [8, 9, 10]),
    (dict(layer_types='full'), list(range(11))),
])
def test_one_layers_logits_read_only_the_tokens_of_its_window(changes, expected):
  """Position 10 of one decoder layer: a sliding window of 4 reads tokens 7-10, a chunk of 4 tokens 8-10 (its
  chunk is 8-11), full attention all; every other token's change leaves its logits equal to the last bit."""
  model = T.DecoderOnly(_one_layer(**changes))
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 16, (1, 12)))
  variables = model.init(jax.random.PRNGKey(0), tokens)
  assert _changed_by(model, variables, tokens, 10) == expected


def test_an_encoders_window_is_symmetric_and_its_chunks_are_refused():
  """One encoder layer with a window of 3: position 5 reads tokens 3-7 (W - 1 on each side)."""
  config = T.tiny_preset(T.PositionConfig('t5'), num_encoder_layers=1, num_decoder_layers=1, vocab_size=16,
                         layer_types='sliding', sliding_window=3)
  model = T.EncoderDecoder(config)
  source = jnp.asarray(np.random.default_rng(2).integers(0, 16, (1, 10)))
  variables = model.init(jax.random.PRNGKey(0), source, source[:, :4])
  encode = lambda tokens: np.asarray(model.apply(variables, tokens, method='encode'))[0, 5]
  base = encode(source)
  assert [j for j in range(10) if not np.array_equal(encode(source.at[0, j].set((source[0, j] + 1) % 16)), base)] == [
      3, 4, 5, 6, 7]
  chunked = T.EncoderDecoder(config.replace(layer_types='chunked', attention_chunk_size=4))
  with pytest.raises(ValueError, match=r"layer_types: got 'chunked' in bidirectional attention"):
    chunked.init(jax.random.PRNGKey(0), source, source[:, :4])


@pytest.mark.parametrize('kind', ['rope', 'alibi', 'none'])
def test_a_window_as_long_as_the_sequence_is_full_attention(kind):
  config = _one_layer(kind, num_decoder_layers=2)
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 16, (2, 12)))
  full = T.DecoderOnly(config)
  variables = full.init(jax.random.PRNGKey(0), tokens)
  for changes in (dict(layer_types='sliding', sliding_window=12), dict(layer_types='chunked', attention_chunk_size=12),
                  dict(layer_types='sliding,full', sliding_window=40)):
    windowed = T.DecoderOnly(config.replace(**changes))
    np.testing.assert_array_equal(np.asarray(windowed.apply(variables, tokens)),
                                  np.asarray(full.apply(variables, tokens)))
  narrow = T.DecoderOnly(config.replace(layer_types='sliding', sliding_window=11))
  assert not np.allclose(np.asarray(narrow.apply(variables, tokens)), np.asarray(full.apply(variables, tokens)))


def _stepped_logits(model, variables, tokens):
  """The logits of feeding `tokens` one at a time through the cache (created by a call on zeros), and the cache."""
  _, cache = model.apply(variables, jnp.zeros_like(tokens), use_cache=True, mutable=['cache'])
  stepped = []
  for index in range(tokens.shape[1]):
    logits, cache = model.apply({**variables, 'cache': cache['cache']}, tokens[:, index:index + 1], use_cache=True,
                                mutable=['cache'])
    stepped.append(logits)
  return np.concatenate(stepped, axis=1), cache['cache']


@pytest.mark.parametrize('changes', [dict(layer_types='sliding,full', sliding_window=3),
                                     dict(layer_types='chunked,full', attention_chunk_size=4)])
def test_cached_decoding_past_four_windows_gives_the_whole_forward_pass(changes):
  """Token by token through the cache for 14 tokens (more than 4 W = 12 and three chunks), then the whole pass; the
  sliding layer's cache holds W = 3 keys and values (a rolling buffer), the full layer's all 14."""
  model = T.DecoderOnly(_one_layer(num_decoder_layers=2, **changes))
  tokens = jnp.asarray(np.random.default_rng(4).integers(0, 16, (2, 14)))
  variables = model.init(jax.random.PRNGKey(0), tokens)
  stepped, cache = _stepped_logits(model, variables, tokens)
  np.testing.assert_allclose(stepped, model.apply(variables, tokens), atol=2e-5, rtol=1e-5)
  rolling = 'sliding_window' in changes
  assert cache['decoder']['layer_0']['self_attention']['cached_key'].shape[1] == (3 if rolling else 14)
  assert cache['decoder']['layer_1']['self_attention']['cached_key'].shape[1] == 14


@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_every_variant_decodes_a_sliding_layer_through_its_rolling_cache(kind):
  """Each variant that decodes, in a sliding layer of W = 3 beside a full one: 14 tokens stepped through the cache
  give the whole forward pass, and the sliding layer's cache holds 3 positions, unless the variant keeps every
  earlier token's data in a cache of its own (FoX's gates, PaTH's reflections: Variant.rolling_cache)."""
  from tests.helpers import tiny  # pylint: disable=import-outside-toplevel
  config = tiny(kind, num_encoder_layers=0, num_decoder_layers=2, vocab_size=16, layer_types='sliding,full',
                sliding_window=3)
  model = T.DecoderOnly(config)
  tokens = jnp.asarray(np.random.default_rng(7).integers(0, 16, (1, 14)))
  variables = model.init(jax.random.PRNGKey(0), tokens)
  stepped, cache = _stepped_logits(model, variables, tokens)
  np.testing.assert_allclose(stepped, model.apply(variables, tokens), atol=5e-5, rtol=1e-4)
  held = cache['decoder']['layer_0']['self_attention']['cached_key'].shape[1]
  assert held == (3 if config.position.rolling_cache else 14)
  assert config.position.rolling_cache == (kind not in ('fox', 'path'))


def test_a_prompt_continues_through_the_rolling_cache_as_the_whole_pass():
  """A 5-token prompt padded to the capacity creates the cache (models._prompt_in_cache: its sliding layers keep the
  prompt's last W = 3 positions, not the padding's), then 12 tokens one at a time: the logits of the whole pass; and
  greedy generation through it picks the tokens of rerunning the whole prefix at every step."""
  model = T.DecoderOnly(_one_layer(num_decoder_layers=2, layer_types='sliding,full', sliding_window=3))
  tokens = jnp.asarray(np.random.default_rng(8).integers(0, 16, (2, 17)))
  variables = model.init(jax.random.PRNGKey(0), tokens)
  last_BxC, cache = T.models._prompt_in_cache(model, variables, tokens[:, :5], 17)  # pylint: disable=protected-access
  stepped = [last_BxC[:, None]]
  for index in range(5, 17):
    logits, updated = model.apply({**variables, 'cache': cache}, tokens[:, index:index + 1], use_cache=True,
                                  mutable=['cache'])
    cache = updated['cache']
    stepped.append(logits)
  np.testing.assert_allclose(np.concatenate(stepped, axis=1), model.apply(variables, tokens)[:, 4:], atol=2e-5,
                             rtol=1e-5)
  prompt = tokens[:, :5]
  np.testing.assert_array_equal(T.models.decoder_only_generate(model, variables, prompt, 12),
                                T.models.decoder_only_generate(model, variables, prompt, 12, use_cache=False))


@pytest.mark.parametrize('changes, message', [
    (dict(layer_types='sliding'), r'sliding_window: got 0; valid: a positive number of keys'),
    (dict(layer_types='chunked'), r'attention_chunk_size: got 0; valid: a positive number of positions'),
    (dict(layer_types='sliding,global', sliding_window=4), r"layer_types: got 'sliding,global'; valid: a "
                                                           r'comma-separated cycle of full, sliding, chunked'),
    (dict(layer_types='sliding', sliding_window=4, randomized_max_length=64), r'randomized_max_length: got 64'),
])
def test_a_window_that_cannot_be_served_is_refused_naming_the_field(changes, message):
  with pytest.raises(ValueError, match=message):
    _one_layer(**changes)


@pytest.mark.parametrize('window, chunk, expected', [
    (6, 0, [(35, 43), (43, 44)]),   # queries 40-43 see keys from 40 - 6 + 1 = 35 on
    (0, 16, [(32, 40), (40, 44)]),  # their chunk starts at 32
    (0, 0, [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40), (40, 44)]),
])
def test_blocks_of_keys_before_the_window_are_never_computed(window, chunk, expected):
  """The key blocks the blockwise core visits for the query block 40-43 (key blocks of 8): only those that hold a
  key the window or chunk allows."""
  from transformer.blockwise import _key_blocks  # pylint: disable=import-outside-toplevel
  first = AttentionMask(causal=True, window=window, chunk=chunk).first_key(40)
  assert [(block.start, block.stop) for block, _ in _key_blocks(40, 44, 8, None, first)] == expected


@pytest.mark.parametrize('kind', ['rope', 'alibi'])  # all blocks at once; one after another with ALiBi's term
@pytest.mark.parametrize('changes', [dict(layer_types='sliding,full', sliding_window=5),
                                     dict(layer_types='chunked', attention_chunk_size=6)])
def test_a_windowed_model_in_blocks_gives_the_explicit_cores_logits_packed_and_padded_too(kind, changes):
  tokens = jnp.asarray(np.random.default_rng(5).integers(0, 16, (2, 19)))
  explicit = T.DecoderOnly(_one_layer(kind, num_decoder_layers=2, attention_implementation='explicit', **changes))
  variables = explicit.init(jax.random.PRNGKey(0), tokens)
  blocks = T.DecoderOnly(explicit.config.replace(attention_implementation='blockwise', attention_block_size=4,
                                                 attention_key_block_size=4))
  segments = jnp.asarray([[0] * 7 + [1] * 12, [0] * 12 + [1] * 7])
  positions = jnp.asarray([list(range(7)) + list(range(12)), list(range(12)) + list(range(7))])
  valid = jnp.ones_like(tokens, bool).at[1, 15:].set(False)
  for extra in ({}, dict(positions_BxL=positions, segments_BxL=segments), dict(valid_BxL=valid)):
    np.testing.assert_allclose(np.asarray(blocks.apply(variables, tokens, **extra)),
                               np.asarray(explicit.apply(variables, tokens, **extra)), atol=2e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_every_variant_serves_a_window_in_every_cpu_core(kind):
  """Each variant in a sliding layer of W = 4: position 10 of one layer reads tokens 7-10 only (bit for bit; FoX to
  1e-5), and the blockwise
  core (all blocks at once without a term, one after another with one) gives the explicit core's logits."""
  from tests.helpers import tiny  # pylint: disable=import-outside-toplevel
  config = tiny(kind, num_decoder_layers=1, vocab_size=16, layer_types='sliding', sliding_window=4,
                attention_implementation='explicit')
  explicit = T.DecoderOnly(config)
  tokens = jnp.asarray(np.random.default_rng(6).integers(0, 16, (1, 12)))
  variables = explicit.init(jax.random.PRNGKey(0), tokens)
  # FoX's gates enter as differences of a cumulative sum over the sequence: float32 rounding, not a dependence.
  assert _changed_by(explicit, variables, tokens, 10, atol=1e-5 if kind == 'fox' else 0.0) == [7, 8, 9, 10]
  blocks = T.DecoderOnly(config.replace(attention_implementation='blockwise', attention_block_size=4,
                                        attention_key_block_size=4))
  np.testing.assert_allclose(np.asarray(blocks.apply(variables, tokens)), np.asarray(explicit.apply(variables, tokens)),
                             atol=2e-5, rtol=1e-5)
