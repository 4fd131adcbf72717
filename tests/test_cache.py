"""Incremental decoding (use_cache): every variant's cached steps against the whole forward pass,
and the cached greedy, beam and decoder-only decoding against the same decoding without a cache."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import models
from tests.helpers import bidirectional, init, random_positions, tiny, tokens

CHUNKS = (2, 1, 1, 3)  # a prompt of two tokens at once, then single tokens, then three at once


def _fed_in_chunks(run, cache, *arrays_BxL):
  """run(cache, *chunk_of_each_array) over CHUNKS: the logits of every chunk, concatenated."""
  logits, start = [], 0
  for size in CHUNKS:
    step_logits, cache = run(cache, *(array[:, start:start + size] for array in arrays_BxL))
    logits.append(step_logits)
    start += size
  return jnp.concatenate(logits, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_cached_steps_give_the_logits_of_the_whole_forward_pass(kind):
  """Encoder-decoder with source padding (post-LN) and decoder-only (pre-LN), both with causal
  attention in blocks of 4 (the capacity, 7, spans two; the decoder-only model also over key blocks
  of 4, so its cached steps run blockwise), fed in chunks of 2, 1, 1 and 3 tokens. A causal-only
  variant has no encoder-decoder: decoder-only alone. The decoder-only model also decodes a packed row,
  documents of 3, 2 and 2 tokens (positions restarting in each; the last chunk straddles a boundary), against
  its whole packed forward pass; and a cache created by a prompt of 3 (padded to the capacity, as greedy
  decoding creates it) gives the prompt's last logits and, fed the other tokens, the rest of the whole pass."""
  length = sum(CHUNKS)
  source, target = tokens(2, 5, seed=1), tokens(2, length, seed=2)
  if bidirectional(kind):
    config = tiny(kind, norm='post', attention_block_size=4)
    model = T.EncoderDecoder(config)
    source_valid = jnp.ones_like(source).at[1, 3:].set(0)
    params = random_positions(init(model, source, target, source_valid_BxLs=source_valid))
    whole = model.apply(params, source, target, source_valid_BxLs=source_valid)
    memory = model.apply(params, source, source_valid_BxLs=source_valid, method='encode')
    cache, run = models._cached_decoder(model, params, memory, source_valid, 2, length)  # pylint: disable=protected-access
    np.testing.assert_allclose(_fed_in_chunks(run, cache, target), whole, atol=2e-5, rtol=1e-5)

  decoder_only = T.DecoderOnly(tiny(kind, attention_block_size=4, attention_key_block_size=4))
  params = random_positions(init(decoder_only, target))

  def run_decoder_only(cache, tokens_BxLn, **packed):
    variables = params if cache is None else {**params, 'cache': cache}
    logits, updated = decoder_only.apply(variables, tokens_BxLn, use_cache=True, mutable=['cache'], **packed)
    return logits, updated['cache']

  _, cache = run_decoder_only(None, jnp.zeros_like(target))
  np.testing.assert_allclose(_fed_in_chunks(run_decoder_only, cache, target), decoder_only.apply(params, target),
                             atol=2e-5, rtol=1e-5)
  positions = jnp.asarray([[0, 1, 2, 0, 1, 0, 1]] * 2, jnp.int32)
  segments = jnp.asarray([[0, 0, 0, 1, 1, 2, 2]] * 2, jnp.int32)
  whole_packed = decoder_only.apply(params, target, positions_BxL=positions, segments_BxL=segments)
  _, cache = run_decoder_only(None, jnp.zeros_like(target), positions_BxL=jnp.zeros_like(positions),
                              segments_BxL=jnp.zeros_like(segments))
  run_packed = lambda cache, *chunks: run_decoder_only(cache, chunks[0], positions_BxL=chunks[1],
                                                       segments_BxL=chunks[2])
  np.testing.assert_allclose(_fed_in_chunks(run_packed, cache, target, positions, segments), whole_packed,
                             atol=2e-5, rtol=1e-5)
  whole = decoder_only.apply(params, target)
  assert not np.allclose(whole_packed[:, 3:], whole[:, 3:], atol=1e-3)
  last_BxC, cache = models._prompt_in_cache(decoder_only, params, target[:, :3], length)  # pylint: disable=protected-access
  np.testing.assert_allclose(last_BxC, whole[:, 2], atol=2e-5, rtol=1e-5)
  two_logits, cache = run_decoder_only(cache, target[:, 3:5])
  last_logits, _ = run_decoder_only(cache, target[:, 5:])
  np.testing.assert_allclose(jnp.concatenate([two_logits, last_logits], axis=1), whole[:, 3:], atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_cached_decoding_picks_the_tokens_of_decoding_without_a_cache():
  """The decoding loops (the logits test above covers every variant's steps), on ALiBi's shared bias."""
  config = tiny('alibi')
  model = T.EncoderDecoder(config)
  source = tokens(3, 6, seed=3)
  source_valid = jnp.ones_like(source).at[2, 4:].set(0)
  params = init(model, source, source, source_valid_BxLs=source_valid)
  for use_cache in (True, False):
    decode = dict(bos_id=1, max_length=7, source_valid_BxLs=source_valid, use_cache=use_cache)
    if use_cache:
      greedy, beam = (T.greedy_decode(model, params, source, **decode),
                      T.beam_search(model, params, source, eos_id=2, beam_size=3, **decode))
    else:
      np.testing.assert_array_equal(greedy, T.greedy_decode(model, params, source, **decode))
      np.testing.assert_array_equal(beam, T.beam_search(model, params, source, eos_id=2, beam_size=3, **decode))
  decoder_only = T.DecoderOnly(config)
  prompt = tokens(2, 3, seed=4)
  params = init(decoder_only, prompt)
  generated = T.decoder_only_generate(decoder_only, params, prompt, 5)
  assert generated.shape == (2, 8)
  np.testing.assert_array_equal(generated, T.decoder_only_generate(decoder_only, params, prompt, 5, use_cache=False))


def test_beam_search_reorders_the_cache_rows_with_their_hypotheses():
  """A fake cache whose rows name their hypothesis: after the reorder each row holds its parent's."""
  batch, beam = 2, 3
  rows = jnp.arange(batch * beam, dtype=jnp.float32)
  cache = {'layer': {'cached_key': rows[:, None, None] * jnp.ones((1, 4, 2)), 'index': jnp.array(5),
                     'cross_attention': {'cached_key': rows[:, None, None] * jnp.ones((1, 4, 2))}},
           'positions': jnp.arange(4)[None]}
  parent = jnp.array([[2, 2, 0], [1, 0, 1]])
  reordered = models._reorder_cache(cache, parent, beam)  # pylint: disable=protected-access
  expected = [row * beam + p for row in range(batch) for p in parent[row].tolist()]
  np.testing.assert_array_equal(reordered['layer']['cached_key'][:, 0, 0], expected)
  # The memory's keys are the same in every beam of a source: left where they are.
  np.testing.assert_array_equal(reordered['layer']['cross_attention']['cached_key'][:, 0, 0], rows)
  assert int(reordered['layer']['index']) == 5
  np.testing.assert_array_equal(reordered['positions'], cache['positions'])


@pytest.mark.slow
def test_a_real_decoder_cache_keeps_its_memory_under_cross_attention():
  """The reorder recognises cross-attention by its module name: the encoder-decoder's cache has it."""
  model = T.EncoderDecoder(tiny('rope'))
  source, target = tokens(2, 5, seed=7), tokens(2, 4, seed=8)
  params = init(model, source, target)
  memory = model.apply(params, source, method='encode')
  cache, _ = models._cached_decoder(model, params, memory, None, 2, 4)  # pylint: disable=protected-access
  paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(cache)[0]]
  assert any("['cross_attention']['cached_key']" in path for path in paths), paths
  assert any("['self_attention']['cached_key']" in path for path in paths), paths


@pytest.mark.slow
def test_aligned_cross_attention_steps_give_the_whole_forward_pass():
  """SAINT's layout (knowledge tracing): target step i attends source steps up to i, with position
  hooks in cross-attention too."""
  config = tiny('rope', aligned_cross_attention=True)
  model = T.EncoderDecoder(config)
  length = sum(CHUNKS)
  source, target = tokens(2, length, seed=5), tokens(2, length, seed=6)
  params = init(model, source, target)
  memory = model.apply(params, source, method='encode')
  cache, run = models._cached_decoder(model, params, memory, None, 2, length)  # pylint: disable=protected-access
  np.testing.assert_allclose(_fed_in_chunks(run, cache, target), model.apply(params, source, target),
                             atol=2e-5, rtol=1e-5)


def test_a_cache_beyond_the_learned_table_is_refused_when_it_is_made():
  config = tiny('learned', position={'max_length': 8})
  model = T.DecoderOnly(config)
  params = init(model, tokens(1, 4))
  with pytest.raises(ValueError, match=r'sequence length 9 is longer than the learned position table \(8 rows\)'):
    T.decoder_only_generate(model, params, tokens(1, 4), 6)


def test_use_cache_errors_name_what_is_wrong():
  config = tiny()
  encoder = T.TransformerStack(config, 1, causal=False)
  x = jnp.zeros((1, 3, config.model_dim))
  with pytest.raises(ValueError, match='needs a causal stack'):
    encoder.init(jax.random.PRNGKey(0), x, use_cache=True)
  decoder = T.TransformerStack(config, 1, causal=True)
  variables = nn.meta.unbox(decoder.init(jax.random.PRNGKey(0), x, use_cache=True))
  with pytest.raises(ValueError, match='valid_BxL: padding inside the decoded tokens'):
    decoder.apply(variables, x[:, :1], valid_BxL=jnp.ones((1, 1)), use_cache=True, mutable=['cache'])
