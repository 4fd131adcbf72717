"""Several needles, one asked for: the multi-key needle in a haystack of RULER (Hsieh et al. 2024,
niah_multikey) as text a language model reads. Each needle gives another word its own number,

    The special number for river is 48213.

one of them sits at the asked depth and the others at depths drawn per trial, and the question at the end
asks for the number of the first one's word:

    What is the special number for river? The special number for river is

A trial is correct when the asked number appears in what the model writes (RULER's string match), so
the model must find the right needle among look-alikes, not just the only number in the prompt. Words,
numbers and the other needles' places are pure functions of (seed, trial).
"""

import numpy as np

from experiments.tasks.passkey import ANSWER_SLACK, Codec, ProbeError, Prompt, answer_text

NEEDLE = 'The special number for {word} is {value}. '
QUESTION = 'What is the special number for {word}? The special number for {word} is'
WORDS = ('river', 'candle', 'falcon', 'garden', 'harbor', 'lantern', 'meadow', 'orchard', 'pebble', 'quiver',
         'saddle', 'thistle', 'willow', 'anchor', 'bramble', 'cellar', 'dagger', 'ember', 'feather', 'goblet',
         'hollow', 'island', 'jester', 'kettle')
VALUE_DIGITS = 5


def draw_pairs(rng: np.random.Generator, count: int) -> list[tuple[str, str]]:
  """`count` (word, number) pairs with distinct words; the first is the one asked for."""
  if not 1 <= count <= len(WORDS):
    raise ProbeError(f'--needles: got {count}; valid: 1 to {len(WORDS)}')
  words = rng.choice(len(WORDS), size=count, replace=False)
  values = rng.integers(10 ** (VALUE_DIGITS - 1), 10 ** VALUE_DIGITS, size=count)
  return [(WORDS[w], str(v)) for w, v in zip(words, values)]


def needle_pairs(seed: int, trial: int, count: int) -> list[tuple[str, str]]:
  """A probe trial's pairs, a pure function of (seed, trial)."""
  return draw_pairs(np.random.default_rng([seed, trial, 5]), count)


def filler_room(codec: Codec, length: int, pairs: list[tuple[str, str]]) -> int:
  """The filler tokens a prompt of `length` holds beside BOS, the needles and the question."""
  used = sum(len(codec.encode(NEEDLE.format(word=w, value=v))) for w, v in pairs)
  room = length - 1 - used - len(codec.encode(QUESTION.format(word=pairs[0][0])))
  if room < 0:
    raise ProbeError(f'--lengths: got {length}; valid: at least {length - room} tokens, the first token, '
                     f'{len(pairs)} needles and the question')
  return room


def needle_prompt(codec: Codec, filler: np.ndarray, length: int, depth: float, pairs: list[tuple[str, str]],
                  seed: int, trial: int) -> Prompt:
  """A probe trial's prompt: the other needles' places drawn from (seed, trial) (arranged_prompt)."""
  return arranged_prompt(codec, filler, length, depth, pairs, np.random.default_rng([seed, trial, 6]))


def arranged_prompt(codec: Codec, filler: np.ndarray, length: int, depth: float, pairs: list[tuple[str, str]],
                    rng: np.random.Generator) -> Prompt:
  """BOS, the filler with the first pair's needle after round(depth x room) of its tokens and every other
  needle after a number of them drawn from `rng`, then the question for the first pair's word."""
  if not 0.0 <= depth <= 1.0:
    raise ProbeError(f'--depths: got {depth}; valid: numbers in [0, 1] (0: right after the first token)')
  room = filler_room(codec, length, pairs)
  if len(filler) < room:
    raise ProbeError(f'filler of {len(filler)} tokens for a prompt that needs {room}')
  others = rng.integers(0, room + 1, size=len(pairs) - 1)
  places = sorted([(int(round(depth * room)), 0)] + [(int(at), index + 1) for index, at in enumerate(others)])
  pieces, taken, asked_start = [[codec.bos]], 0, None
  for at, index in places:
    pieces.append(filler[taken:at])
    taken = at
    if index == 0:
      asked_start = sum(len(piece) for piece in pieces)
    pieces.append(codec.encode(NEEDLE.format(word=pairs[index][0], value=pairs[index][1])))
  pieces += [filler[taken:room], codec.encode(QUESTION.format(word=pairs[0][0]))]
  ids = np.concatenate([np.asarray(piece, np.int32) for piece in pieces])
  answer = codec.encode(' ' + pairs[0][1])
  return Prompt(ids=ids, key=pairs[0][1], needle_start=asked_start, answer_tokens=len(answer) + ANSWER_SLACK)


def training_row(codec: Codec, stream: np.ndarray, length: int, count: int, seed: int, step: int,
                 row: int) -> np.ndarray:
  """length + 1 tokens: BOS, a prompt of `count` needles at depths drawn from (seed, step, row) in the filler of
  `stream` (the training split), and its answer (passkey.answer_text of the asked number)."""
  rng = np.random.default_rng([seed, step, row, 7])
  pairs = draw_pairs(rng, count)
  answer = np.asarray(codec.encode(answer_text(pairs[0][1])), np.int32)
  prompt_length = length + 1 - len(answer)
  room = filler_room(codec, prompt_length, pairs)
  start = int(rng.integers(0, len(stream) - room))
  prompt = arranged_prompt(codec, np.asarray(stream[start:start + room]), prompt_length, float(rng.uniform()), pairs,
                           rng)
  return np.concatenate([prompt.ids, answer])


def shortest_row(codec: Codec, count: int) -> int:
  """The shortest training length whose rows hold BOS, `count` needles, the question and the answer."""
  pairs = [(max(WORDS, key=len), '9' * VALUE_DIGITS)] * count
  return (1 + sum(len(codec.encode(NEEDLE.format(word=w, value=v))) for w, v in pairs) +
          len(codec.encode(QUESTION.format(word=pairs[0][0]))) + len(codec.encode(answer_text(pairs[0][1]))) - 1)
