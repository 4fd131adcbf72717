"""Passkey retrieval (Mohtashami & Jaggi 2023), the probe context-extension papers report beside
perplexity: can a language model still find something far back?

A prompt is exactly `length` tokens: the run's first token (BOS), filler, at `depth` the needle

    The pass key is 48213. Remember it. 48213 is the pass key.

more filler, and the question "What is the pass key? The pass key is". The model decodes greedily;
a trial is correct when the first digits it writes are the key (exact match). depth 0 puts the needle
right after BOS, depth 1 right before the question, depth d after round(d x F) filler tokens, F the
filler that fits. The filler is the run's own held-out text from a point drawn per trial, or the
classic repeated sentences (`classic_filler`). Each (length, depth) cell's rate comes with its 95%
Wilson interval over the trials (scipy.stats).
"""

import dataclasses
import re
from typing import Callable, Sequence

import numpy as np
from scipy import stats

NEEDLE = 'The pass key is {key}. Remember it. {key} is the pass key. '
QUESTION = 'What is the pass key? The pass key is'
CLASSIC_FILLER = 'The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. '
KEY_DIGITS = 5
ANSWER_SLACK = 2  # tokens decoded beyond the key's own, for a space or a tokenizer that splits it otherwise


class ProbeError(ValueError):
  """A probe that cannot be built as asked (a length too short for the needle and the question): one line."""


@dataclasses.dataclass(frozen=True)
class Codec:
  """A run's text <-> token ids, and the token every window starts with."""
  encode: Callable[[str], np.ndarray]
  decode: Callable[[Sequence[int]], str]
  bos: int


@dataclasses.dataclass(frozen=True)
class Prompt:
  ids: np.ndarray          # the prompt's `length` token ids
  key: str                 # the digits the model is asked for
  needle_start: int        # the index of the needle's first token
  answer_tokens: int       # tokens decoded for the answer


def codec_for(task) -> Codec:
  """The codec of a language-model run's task: Shakespeare's characters, or a prepared corpus's tokenizer."""
  name = task.settings.name
  if name == 'shakespeare':
    from experiments.data import shakespeare  # pylint: disable=g-import-not-at-top
    vocabulary = shakespeare.load('train')[1]
    index = {character: i for i, character in enumerate(vocabulary)}

    def encode(text: str) -> np.ndarray:
      missing = sorted({c for c in text if c not in index})
      if missing:
        raise ProbeError(f'the probe\'s text has characters {missing!r} that the run\'s vocabulary lacks')
      return np.array([index[c] for c in text], np.int32)

    return Codec(encode, lambda ids: ''.join(vocabulary[i] for i in ids if 0 <= i < len(vocabulary)), task.bos)
  if name == 'corpus':
    tokenizer = task.corpus.tokenizer
    return Codec(lambda text: np.asarray(tokenizer.encode_batch([text])[0], np.int32),
                 lambda ids: tokenizer.decode([i for i in ids if i != task.bos]), task.bos)
  raise ProbeError(f'--probe: the run\'s task is {name}; valid: a language-model run (shakespeare, corpus)')


def passkey_key(seed: int, trial: int) -> str:
  """A KEY_DIGITS-digit key, a pure function of (seed, trial); never starting with 0."""
  rng = np.random.default_rng([seed, trial, 1])
  return str(rng.integers(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS))


def filler_for(codec: Codec, stream: np.ndarray, tokens: int, seed: int, trial: int, classic: bool) -> np.ndarray:
  """`tokens` filler ids: the classic sentences repeated, or a stretch of the held-out stream from a point
  drawn from (seed, trial)."""
  if classic:
    sentence = codec.encode(CLASSIC_FILLER)
    return np.resize(sentence, tokens)
  if len(stream) <= tokens:
    raise ProbeError(f'--lengths: {tokens} filler tokens asked of a held-out stream of {len(stream)}; valid: shorter '
                     'lengths, or --probe_filler=classic')
  start = np.random.default_rng([seed, trial, 2]).integers(0, len(stream) - tokens)
  return np.asarray(stream[start:start + tokens])


def filler_room(codec: Codec, length: int, key: str) -> int:
  """The filler tokens a prompt of `length` holds beside BOS, the needle and the question."""
  room = length - 1 - len(codec.encode(NEEDLE.format(key=key))) - len(codec.encode(QUESTION))
  if room < 0:
    raise ProbeError(f'--lengths: got {length}; valid: at least {length - room} tokens, the first token, the needle and '
                     'the question')
  return room


def passkey_prompt(codec: Codec, filler: np.ndarray, length: int, depth: float, key: str) -> Prompt:
  """BOS, filler[:before], the needle, filler[before:room], the question: `length` tokens in all."""
  if not 0.0 <= depth <= 1.0:
    raise ProbeError(f'--depths: got {depth}; valid: numbers in [0, 1] (0: right after the first token)')
  room = filler_room(codec, length, key)
  needle = np.asarray(codec.encode(NEEDLE.format(key=key)))
  question = np.asarray(codec.encode(QUESTION))
  if len(filler) < room:
    raise ProbeError(f'filler of {len(filler)} tokens for a prompt that needs {room}')
  before = int(round(depth * room))
  ids = np.concatenate([[codec.bos], filler[:before], needle, filler[before:room], question]).astype(np.int32)
  answer = codec.encode(' ' + key)
  return Prompt(ids=ids, key=key, needle_start=1 + before, answer_tokens=len(answer) + ANSWER_SLACK)


def answered_key(text: str) -> str:
  """The first run of digits in a decoded answer ('' if none)."""
  found = re.search(r'\d+', text)
  return found.group(0) if found else ''


def greedy_continuations(next_logits: Callable[[np.ndarray], np.ndarray], prompts_BxL: np.ndarray,
                         tokens: int) -> np.ndarray:
  """B x tokens greedy continuations; next_logits(ids_BxT) gives the logits of the token after each row."""
  ids = np.asarray(prompts_BxL)
  written = []
  for _ in range(tokens):
    chosen = np.argmax(np.asarray(next_logits(ids)), axis=-1).astype(np.int32)
    written.append(chosen)
    ids = np.concatenate([ids, chosen[:, None]], axis=1)
  return np.stack(written, axis=1)


def wilson_interval(correct: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
  """The Wilson score interval of a rate (scipy.stats.binomtest)."""
  interval = stats.binomtest(correct, trials).proportion_ci(confidence_level=confidence, method='wilson')
  return float(interval.low), float(interval.high)


def passkey_cell(codec: Codec, next_logits, stream: np.ndarray, length: int, depth: float, trials: int, seed: int,
                 classic: bool = False, batch_size: int = 8) -> dict:
  """One (length, depth) cell: `trials` prompts, decoded in batches; the rate of exact keys and its interval."""
  correct, answers = 0, []
  for first in range(0, trials, batch_size):
    prompts = []
    for trial in range(first, min(trials, first + batch_size)):
      key = passkey_key(seed, trial)
      filler = filler_for(codec, stream, filler_room(codec, length, key), seed, trial, classic)
      prompts.append(passkey_prompt(codec, filler, length, depth, key))
    tokens = max(p.answer_tokens for p in prompts)
    written = greedy_continuations(next_logits, np.stack([p.ids for p in prompts]), tokens)
    for prompt, row in zip(prompts, written):
      answer = answered_key(codec.decode(row.tolist()))
      answers.append(answer)
      correct += answer == prompt.key
  low, high = wilson_interval(correct, trials)
  return dict(length=length, depth=depth, trials=trials, correct=correct, rate=correct / trials, low=low,
              high=high, answers=answers)
