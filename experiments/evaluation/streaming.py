"""A held-out stream scored token by token through StreamingLLM's cache (Xiao et al. 2023; transformer/
rolling_cache.py): the first S tokens and the most recent ones in N slots, positions by slot, in memory that does
not grow with the stream. What `python -m experiments.evaluate --protocol=streaming --sink_tokens=S
--cache_size=N` runs at each --lengths L: the stream's first L tokens, inputs BOS then stream[:L - 1], position 0
(BOS alone) unscored as in every protocol."""

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import transformer


def bits_function(model: transformer.DecoderOnly, sink_tokens: int, cache_size: int):
  """bits(params, inputs_1xL, targets_1xL) -> -log2 p(target) 1 x L, one token at a time through the streaming
  cache (one compiled step, scanned over the stream: only the cache and the L numbers stay in memory)."""
  streaming = (sink_tokens, cache_size)

  def step_bits(params, cache, token, target):
    variables = {'params': params} if cache is None else {'params': params, 'cache': cache}
    logits, updated = model.apply(variables, token[None, None], use_cache=True, streaming=streaming,
                                  mutable=['cache'])
    log_probabilities = jax.nn.log_softmax(logits[0, 0].astype(jnp.float32))
    return updated['cache'], -log_probabilities[target] / math.log(2.0)

  @jax.jit
  def bits(params, inputs_1xL, targets_1xL):
    cache, first = step_bits(params, None, inputs_1xL[0, 0], targets_1xL[0, 0])  # the call that creates the cache
    _, rest = jax.lax.scan(lambda carry, pair: step_bits(params, carry, *pair), cache,
                           (inputs_1xL[0, 1:], targets_1xL[0, 1:]))
    return jnp.concatenate([first[None], rest])[None]
  return bits


def evaluate_length(bits, params, stream: np.ndarray, bos: int, length: int,
                    token_bytes: Optional[np.ndarray] = None) -> dict:
  """Bits per character over positions 1 .. L - 1 of the stream's first L tokens (a corpus's tokens: bits per byte
  and per token), and by position."""
  targets = np.asarray(stream[:length], np.int32)[None]
  inputs = np.concatenate([[bos], targets[0, :-1]]).astype(np.int32)[None]
  scored_bits = np.asarray(bits(params, inputs, targets), np.float64)[0]
  if not np.all(np.isfinite(scored_bits)):
    raise FloatingPointError(f'length {length}: the model gave non-finite log-probabilities in the stream; nothing '
                             'was written for this length')
  total, scored = float(scored_bits[1:].sum()), length - 1
  scores = dict(bits_per_character=total / scored) if token_bytes is None else dict(
      bits_per_byte=total / int(token_bytes[targets[0, 1:]].sum()), bits_per_token=total / scored,
      scored_bytes=int(token_bytes[targets[0, 1:]].sum()))
  return dict(length=length, **scores, scored_tokens=scored, windows=1, stride=length,
              bits_by_position=[round(float(b), 5) for b in scored_bits[1:]])
