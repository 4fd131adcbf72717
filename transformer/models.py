"""The three model kinds built from the stack: encoder-decoder, decoder-only, encoder-only."""

import math
from typing import Callable

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.blocks import TransformerStack
from transformer.config import ModelConfig
from transformer.layers import EMBED, VOCAB, Dense, Embed, batch_split, parameter


def check_token_input(tokens, name: str) -> None:
  if tokens.ndim != 2:
    raise ValueError(f'{name}: expected token ids of shape [batch, length], got shape {tokens.shape}')
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f'{name}: expected integer token ids, got dtype {tokens.dtype}')


class TokenEmbedding(nn.Module):
  """E[ids] * sqrt(d_model) (the paper's scaling), and the output projection (tied: x E^T; untied: x W (+ b with
  use_bias))."""
  config: ModelConfig

  def setup(self):
    self.embed = Embed(self.config.vocab_size, self.config.model_dim, name='embedding')
    if not self.config.tie_embeddings:
      self.output = Dense(self.config.vocab_size, use_bias=self.config.use_bias, name='output', axes=(EMBED, VOCAB))

  def __call__(self, tokens_BxL):
    x = batch_split(self.embed(tokens_BxL).astype(self.config.dtype))
    return x * math.sqrt(self.config.model_dim) if self.config.scale_embeddings else x

  def logits(self, x_BxLxD):
    """In float32 whatever the compute dtype: the softmax over a large vocabulary needs it. Times logit_scale
    (Cohere's); with final_logit_softcap c > 0, c tanh(logits / c) (Gemma 2's cap)."""
    x_BxLxD = x_BxLxD.astype(jnp.float32)
    logits = self.embed.attend(x_BxLxD) if self.config.tie_embeddings else self.output(x_BxLxD)
    if self.config.logit_scale != 1.0:
      logits = logits * self.config.logit_scale
    cap = self.config.final_logit_softcap
    return batch_split(cap * jnp.tanh(logits / cap) if cap else logits)


class DecoderOnly(nn.Module):
  """A causal language model: tokens B x L -> next-token logits B x L x C."""
  config: ModelConfig

  def setup(self):
    self.embedding = TokenEmbedding(self.config)
    self.decoder = TransformerStack(self.config, self.config.num_decoder_layers, causal=True)

  def __call__(self, tokens_BxL, *, valid_BxL=None, deterministic: bool = True, use_cache: bool = False,
               positions_BxL=None, segments_BxL=None, cache_prefix=None, streaming=None):
    """use_cache: incremental decoding (TransformerStack), the 'cache' collection mutable; cache_prefix its creating
    call's continued positions; streaming (S, N) StreamingLLM's cache instead. positions_BxL and segments_BxL:
    documents packed in each row, positions restarting in each (TransformerStack)."""
    hidden_BxLxD = self.hidden_states(tokens_BxL, valid_BxL=valid_BxL, deterministic=deterministic,
                                      use_cache=use_cache, positions_BxL=positions_BxL, segments_BxL=segments_BxL,
                                      cache_prefix=cache_prefix, streaming=streaming)
    logits = self.logits(hidden_BxLxD)
    chex.assert_shape(logits, (*tokens_BxL.shape, self.config.vocab_size))
    return logits

  def hidden_states(self, tokens_BxL, *, valid_BxL=None, deterministic: bool = True, use_cache: bool = False,
                    positions_BxL=None, segments_BxL=None, cache_prefix=None, streaming=None):
    """The last layer's output (after the final norm) B x L x D, before the output projection: a caller that
    scores long sequences forms the B x L x C logits a chunk of positions at a time (model.apply(..., method=
    DecoderOnly.logits))."""
    check_token_input(tokens_BxL, 'tokens')
    return self.decoder(self.embedding(tokens_BxL), valid_BxL=valid_BxL, deterministic=deterministic,
                        use_cache=use_cache, positions_BxL=positions_BxL, segments_BxL=segments_BxL,
                        cache_prefix=cache_prefix, streaming=streaming)

  def logits(self, hidden_BxLxD):
    return self.embedding.logits(hidden_BxLxD)


class EncoderDecoder(nn.Module):
  """Source B x Ls, target input B x Lt (teacher forcing) -> logits B x Lt x C. One vocabulary and
  one embedding table for source, target and output, as in the paper."""
  config: ModelConfig

  def setup(self):
    self.embedding = TokenEmbedding(self.config)
    self.encoder = TransformerStack(self.config, self.config.num_encoder_layers, causal=False)
    self.decoder = TransformerStack(self.config, self.config.num_decoder_layers, causal=True,
                                    cross_attention=True)

  def encode(self, source_BxLs, *, source_valid_BxLs=None, deterministic: bool = True):
    check_token_input(source_BxLs, 'source')
    return self.encoder(self.embedding(source_BxLs), valid_BxL=source_valid_BxLs, deterministic=deterministic)

  def decode(self, memory_BxLsxD, target_input_BxLt, *, source_valid_BxLs=None, target_valid_BxLt=None,
             deterministic: bool = True, use_cache: bool = False):
    """use_cache: incremental decoding (TransformerStack), the 'cache' collection mutable; the
    memory's keys and values are projected once, by the call that creates the cache."""
    check_token_input(target_input_BxLt, 'target_input')
    hidden = self.decoder(self.embedding(target_input_BxLt), valid_BxL=target_valid_BxLt,
                          memory_BxLsxD=memory_BxLsxD, memory_valid_BxLs=source_valid_BxLs,
                          deterministic=deterministic, use_cache=use_cache)
    return self.embedding.logits(hidden)

  def __call__(self, source_BxLs, target_input_BxLt, *, source_valid_BxLs=None, target_valid_BxLt=None,
               deterministic: bool = True):
    memory = self.encode(source_BxLs, source_valid_BxLs=source_valid_BxLs, deterministic=deterministic)
    return self.decode(memory, target_input_BxLt, source_valid_BxLs=source_valid_BxLs,
                       target_valid_BxLt=target_valid_BxLt, deterministic=deterministic)


class InputEmbedding(nn.Module):
  """Token ids B x L through the embedding table, or features B x L x F through a linear map."""
  config: ModelConfig

  @nn.compact
  def __call__(self, inputs):
    features = self.config.input_features
    if features:
      if inputs.ndim != 3 or inputs.shape[-1] != features:
        raise ValueError(f'inputs: expected features of shape [batch, length, {features}] '
                         f'(input_features={features}), got shape {inputs.shape}')
      return Dense(self.config.model_dim, name='input_projection')(inputs.astype(self.config.dtype))
    check_token_input(inputs, 'inputs')
    return TokenEmbedding(self.config, name='token_embedding')(inputs)


def pool(hidden_BxLxD, valid_BxL, pooling: str):
  """The [CLS] vector (index 0), the last valid position's vector ('last'; valid_BxL must be a
  prefix, as right padding makes it) or the mean over valid positions: B x D."""
  if pooling == 'cls':
    return hidden_BxLxD[:, 0]
  if pooling == 'last':
    if valid_BxL is None:
      return hidden_BxLxD[:, -1]
    last_B = jnp.maximum(jnp.sum(valid_BxL, axis=1) - 1, 0)
    return jnp.take_along_axis(hidden_BxLxD, last_B[:, None, None], axis=1)[:, 0]
  if valid_BxL is None:
    return jnp.mean(hidden_BxLxD, axis=1)
  weights = valid_BxL.astype(hidden_BxLxD.dtype)[..., None]
  return jnp.sum(hidden_BxLxD * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)


class EncoderOnly(nn.Module):
  """Bidirectional encoder with a head: class logits or regression values, B x num_outputs.

  With pooling='cls' a learned [CLS] vector is put in front of the sequence (position 0, which
  TUPE resets) and its final state feeds the head; with 'mean' the valid positions are averaged.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, inputs, *, valid_BxL=None, deterministic: bool = True):
    config = self.config
    x_BxLxD = InputEmbedding(config, name='input')(inputs)
    uses_cls = config.pooling == 'cls'
    if uses_cls:
      cls = parameter(self, 'cls', nn.initializers.normal(stddev=0.02), (config.model_dim,))
      x_BxLxD = jnp.concatenate([jnp.broadcast_to(cls, (x_BxLxD.shape[0], 1, config.model_dim)), x_BxLxD], 1)
      if valid_BxL is not None:
        valid_BxL = jnp.concatenate([jnp.ones_like(valid_BxL[:, :1]), valid_BxL], axis=1)
    hidden = TransformerStack(config, config.num_encoder_layers, causal=False, has_cls=uses_cls,
                              name='encoder')(x_BxLxD, valid_BxL=valid_BxL, deterministic=deterministic)
    outputs = Dense(config.num_outputs, name='head')(pool(hidden, valid_BxL, config.pooling).astype(jnp.float32))
    chex.assert_shape(outputs, (x_BxLxD.shape[0], config.num_outputs))
    return outputs


def greedy_generate(next_logits_fn: Callable[[chex.Array], chex.Array], prompt_BxLp: chex.Array,
                    num_new_tokens: int) -> chex.Array:
  """Appends num_new_tokens argmax tokens to the prompt: B x (P + num_new_tokens).

  `next_logits_fn(tokens_BxLt) -> logits_BxLtxC` must be causal. The buffer has a fixed length, so
  one compiled step serves every position; position t only sees tokens before it.
  """
  batch, prompt_length = prompt_BxLp.shape
  total = prompt_length + num_new_tokens
  buffer = jnp.zeros((batch, total), prompt_BxLp.dtype).at[:, :prompt_length].set(prompt_BxLp)

  def step(t, buffer_BxLt):
    logits = next_logits_fn(buffer_BxLt)
    next_token = jnp.argmax(logits[:, t - 1], axis=-1).astype(buffer_BxLt.dtype)
    return buffer_BxLt.at[:, t].set(next_token)

  return jax.lax.fori_loop(prompt_length, total, step, buffer)


def supports_cache(model: nn.Module) -> bool:
  """Whether the model decodes incrementally (use_cache): the Transformers do, the recurrent baselines
  carry no cache and are rerun on the prefix."""
  return isinstance(model, (EncoderDecoder, DecoderOnly))


def _step_function(model: nn.Module, params, *args, **kwargs):
  """run(cache, tokens_BxLn) -> (logits_BxLnxC, cache), feeding the next Ln positions: model.apply(..., *args,
  tokens_BxLn, **kwargs) with use_cache (a None cache: the call that creates it)."""
  def run(cache, tokens_BxLn):
    variables = params if cache is None else {**params, 'cache': cache}
    logits, updated = model.apply(variables, *args, tokens_BxLn, use_cache=True, mutable=['cache'], **kwargs)
    return logits, updated['cache']
  return run


def _cached_steps(model: nn.Module, params, batch: int, capacity: int, *args, **kwargs):
  """(a cache for `capacity` decoder positions, created by a call on `capacity` zeros, and _step_function's run)."""
  run = _step_function(model, params, *args, **kwargs)
  _, cache = run(None, jnp.zeros((batch, capacity), jnp.int32))
  return cache, run


def _cached_decoder(model: nn.Module, params, memory_BxLsxD, source_valid_BxLs, batch: int, capacity: int):
  """_cached_steps for an encoder-decoder's decoder over this memory."""
  return _cached_steps(model, params, batch, capacity, memory_BxLsxD, source_valid_BxLs=source_valid_BxLs,
                       method='decode')


def _reorder_cache(cache, parent_BxM, beam_size: int):
  """Every cache array's rows (batch x beam first) taken from the parent hypotheses; the scalar
  write index stays, and so do cross-attention's keys and values: every beam of a source holds the
  same memory, so gathering them would copy it unchanged at every step."""
  def gather(path, x):
    if x.ndim == 0 or x.shape[0] != parent_BxM.shape[0] * beam_size:
      return x
    if any(getattr(entry, 'key', None) == 'cross_attention' for entry in path):
      return x
    by_beam = x.reshape(parent_BxM.shape[0], beam_size, *x.shape[1:])
    index = parent_BxM.reshape(parent_BxM.shape + (1,) * (by_beam.ndim - 2))
    return jnp.take_along_axis(by_beam, index, axis=1).reshape(x.shape)
  return jax.tree_util.tree_map_with_path(gather, cache)


def greedy_decode(model: nn.Module, params, source_BxLs, *, bos_id: int, max_length: int,
                  source_valid_BxLs=None, use_cache: bool = True) -> chex.Array:
  """Encoder-decoder greedy decoding: encode once, then emit max_length tokens after BOS: B x max_length.
  With use_cache (Transformers) each step feeds one token through the decoder's cache; without, the
  decoder is rerun on the whole fixed-length buffer at every step (the reference the tests compare with)."""
  memory = model.apply(params, source_BxLs, source_valid_BxLs=source_valid_BxLs, method='encode')
  batch = source_BxLs.shape[0]
  start = jnp.full((batch, 1), bos_id, source_BxLs.dtype)
  if not (use_cache and supports_cache(model)):
    def next_logits(tokens_BxLt):
      return model.apply(params, memory, tokens_BxLt, source_valid_BxLs=source_valid_BxLs, method='decode')
    return greedy_generate(next_logits, start, max_length)[:, 1:]

  cache, run = _cached_decoder(model, params, memory, source_valid_BxLs, batch, max_length)
  return _greedy_through_cache(run, cache, start, max_length)


def _greedy_through_cache(run, cache, token_Bx1, num_tokens: int) -> chex.Array:
  """Feeds token_Bx1, then each argmax token in turn, through run(cache, tokens) -> (logits, cache):
  the num_tokens tokens it picks, B x num_tokens."""
  def step(carry, _):
    cache, token_Bx1 = carry
    logits, cache = run(cache, token_Bx1)
    next_token = jnp.argmax(logits[:, -1], axis=-1).astype(token_Bx1.dtype)[:, None]
    return (cache, next_token), next_token[:, 0]

  _, tokens_LtxB = jax.lax.scan(step, (cache, token_Bx1), None, length=num_tokens)
  return jnp.transpose(tokens_LtxB)


def _prompt_in_cache(model: DecoderOnly, params, prompt_BxLp, capacity: int):
  """(the logits of the prompt's last position B x C, a cache of `capacity` positions whose next write follows the
  prompt). The prompt padded to the capacity is the call that creates the cache: one causal pass, as without a
  cache (causal blocks skipped), in which the padding changes none of the prompt's positions and leaves slots
  that the later calls overwrite before they are read; only the last prompt position's logits are formed."""
  prompt_length = prompt_BxLp.shape[1]
  padded_BxL = jnp.pad(prompt_BxLp, ((0, 0), (0, capacity - prompt_length)))
  hidden_BxLxD, variables = model.apply(params, padded_BxL, use_cache=True, mutable=['cache'],
                                        method=DecoderOnly.hidden_states, cache_prefix=prompt_length)
  logits_BxC = model.apply(params, hidden_BxLxD[:, prompt_length - 1], method=DecoderOnly.logits)
  return logits_BxC, variables['cache']


def decoder_only_generate(model: DecoderOnly, params, prompt_BxLp, num_new_tokens: int,
                          use_cache: bool = True) -> chex.Array:
  """Decoder-only greedy continuation of a prompt: B x (P + num_new_tokens). With use_cache
  (Transformers) the prompt creates the cache in one pass (_prompt_in_cache), then one token per step."""
  if not (use_cache and supports_cache(model)) or num_new_tokens == 0:
    return greedy_generate(lambda tokens: model.apply(params, tokens), prompt_BxLp, num_new_tokens)
  logits_BxC, cache = _prompt_in_cache(model, params, prompt_BxLp, prompt_BxLp.shape[1] + num_new_tokens - 1)
  first = jnp.argmax(logits_BxC, axis=-1).astype(prompt_BxLp.dtype)[:, None]
  rest = _greedy_through_cache(_step_function(model, params), cache, first, num_new_tokens - 1)
  return jnp.concatenate([prompt_BxLp, first, rest], axis=1)


def beam_search(model: nn.Module, params, source_BxLs, *, bos_id: int, eos_id: int, max_length: int,
                beam_size: int, length_penalty: float = 0.6, source_valid_BxLs=None,
                use_cache: bool = True) -> chex.Array:
  """Encoder-decoder beam search: B x max_length tokens after BOS (the best hypothesis, EOS and
  then zeros once it has ended).

  Each step extends every live hypothesis by every token and keeps the beam_size best by summed
  log-probability; an ended hypothesis only extends by padding (id 0) at no cost. The final choice
  divides each score by the length penalty of Wu et al. 2016, ((5 + |y|) / 6) ** length_penalty.
  With use_cache (Transformers) each step feeds the hypotheses' last tokens through the decoder's
  cache, whose rows follow their parents; without, the decoder is rerun on the whole prefix.
  """
  batch = source_BxLs.shape[0]
  memory = model.apply(params, source_BxLs, source_valid_BxLs=source_valid_BxLs, method='encode')
  repeat = lambda x: None if x is None else jnp.repeat(x, beam_size, axis=0)
  memory_NxLsxD, valid_NxLs = repeat(memory), repeat(source_valid_BxLs)
  tokens_BxMxLt = jnp.zeros((batch, beam_size, max_length + 1), source_BxLs.dtype).at[:, :, 0].set(bos_id)
  scores_BxM = jnp.full((batch, beam_size), -jnp.inf).at[:, 0].set(0.0)
  ended_BxM = jnp.zeros((batch, beam_size), bool)
  lengths_BxM = jnp.zeros((batch, beam_size), jnp.int32)
  cached = use_cache and supports_cache(model)
  cache, run = (_cached_decoder(model, params, memory_NxLsxD, valid_NxLs, batch * beam_size, max_length)
                if cached else (None, None))

  def step(t, state):
    tokens, scores, ended, lengths, cache = state
    if cached:
      logits, cache = run(cache, tokens[:, :, t - 1].reshape(batch * beam_size, 1))
      logits = logits[:, 0]
    else:
      logits = model.apply(params, memory_NxLsxD, tokens.reshape(batch * beam_size, -1),
                           source_valid_BxLs=valid_NxLs, method='decode')[:, t - 1]
    log_probabilities = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, beam_size, -1)
    vocab = log_probabilities.shape[-1]
    padding_only = jnp.full((vocab,), -jnp.inf).at[0].set(0.0)
    log_probabilities = jnp.where(ended[..., None], padding_only, log_probabilities)
    candidates = (scores[..., None] + log_probabilities).reshape(batch, beam_size * vocab)
    scores, flat = jax.lax.top_k(candidates, beam_size)
    parent, token = flat // vocab, (flat % vocab).astype(tokens.dtype)
    gather = lambda x: jnp.take_along_axis(x, parent.reshape(parent.shape + (1,) * (x.ndim - 2)), axis=1)
    tokens = gather(tokens).at[:, :, t].set(token)
    was_ended = gather(ended)
    lengths = jnp.where(was_ended, gather(lengths), t)
    if cached:
      cache = _reorder_cache(cache, parent, beam_size)
    return tokens, scores, was_ended | (token == eos_id), lengths, cache

  tokens, scores, _, lengths, _ = jax.lax.fori_loop(
      1, max_length + 1, step, (tokens_BxMxLt, scores_BxM, ended_BxM, lengths_BxM, cache))
  normalised = scores / ((5.0 + lengths) / 6.0) ** length_penalty
  best = jnp.argmax(normalised, axis=1)
  return jnp.take_along_axis(tokens, best[:, None, None], axis=1)[:, 0, 1:]
