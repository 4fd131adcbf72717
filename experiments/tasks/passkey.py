"""The passkey (Mohtashami & Jaggi 2023) as text a language model reads: the needle, the question, the
filler, and a prompt of exactly a given length with the needle at a given depth. The retrieval probe
(experiments/evaluation/probes.py) asks finished runs these prompts; task.passkey_fraction mixes them, with
their answers, into a run's training rows (experiments/tasks/retrieval_rows.py).

A prompt is BOS, filler, at `depth` the needle

    The pass key is 48213. Remember it. 48213 is the pass key.

more filler, and the question "What is the pass key? The pass key is". depth 0 puts the needle right
after BOS, depth 1 right before the question, depth d after round(d x F) filler tokens, F the filler
that fits. The filler is the run's own text from a point drawn per trial, or the classic repeated
sentences. Keys and filler are pure functions of (seed, trial).
"""

import dataclasses
from typing import Callable, Sequence

import numpy as np

NEEDLE = 'The pass key is {key}. Remember it. {key} is the pass key. '
QUESTION = 'What is the pass key? The pass key is'
CLASSIC_FILLER = 'The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. '
KEY_DIGITS = 5
ANSWER_SLACK = 2  # tokens decoded beyond the key's own, for a space or a tokenizer that splits it otherwise


class ProbeError(ValueError):
  """A passkey prompt that cannot be built as asked (a length too short for the needle and the question): one
  line."""


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


def shortest_row(codec: Codec) -> int:
  """The shortest training length whose rows hold BOS, the needle, the question and the answer."""
  key = '9' * KEY_DIGITS
  return (1 + len(codec.encode(NEEDLE.format(key=key))) + len(codec.encode(QUESTION)) +
          len(codec.encode(answer_text(key))) - 1)


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


def answer_text(key: str) -> str:
  """What follows the question in a training row: the key, and the full stop that ends it."""
  return f' {key}.'


def training_row(codec: Codec, stream: np.ndarray, length: int, seed: int, step: int, row: int) -> np.ndarray:
  """length + 1 tokens: BOS, a passkey prompt with its needle at a depth drawn from (seed, step, row) in the
  filler of `stream` (the training split), and its answer."""
  rng = np.random.default_rng([seed, step, row, 3])
  key = str(rng.integers(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS))
  depth = float(rng.uniform())
  answer = np.asarray(codec.encode(answer_text(key)), np.int32)
  prompt_length = length + 1 - len(answer)
  room = filler_room(codec, prompt_length, key)
  start = int(rng.integers(0, len(stream) - room))
  prompt = passkey_prompt(codec, np.asarray(stream[start:start + room]), prompt_length, depth, key)
  return np.concatenate([prompt.ids, answer])
