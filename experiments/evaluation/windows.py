"""Windows over a held-out token stream for long-context evaluation: which window scores which token.

A window of length L starting at a holds the targets stream[a : a + L]; its inputs are BOS then
stream[a : a + L - 1], as in training, so window position p predicts stream[a + p] from the p tokens
before it. Position 0 has BOS alone as context: no protocol scores it (training never does).
  'windows'  non-overlapping: a = 0, L, 2L, ...; every window scores its positions 1 .. L - 1 (the
             first token of each window goes unscored; the tokens after the last whole window too).
  'sliding'  a = 0, S, 2S, ... with stride S < L, and a last window ending at the stream's end: the first
             window scores positions 1 .. L - 1, every later one only the tokens no earlier window
             scored. Every token stream[1:] is scored exactly once, and all but the first window's
             with at least L - S tokens of context (the perplexity protocol of Press et al. 2022 and of
             the PI and YaRN papers).
"""

import dataclasses

import numpy as np

PROTOCOLS = ('windows', 'sliding')


@dataclasses.dataclass(frozen=True)
class Window:
  start: int        # a: the window's targets are stream[start : start + length]
  first_scored: int  # positions first_scored .. length - 1 of the window are scored


def plan(num_tokens: int, length: int, protocol: str, stride: int = 0) -> list[Window]:
  """The windows of one evaluation length; a ValueError names what is invalid."""
  if protocol not in PROTOCOLS:
    raise ValueError(f'--protocol: got {protocol!r}; valid: {", ".join(PROTOCOLS)}')
  if length < 2 or num_tokens < length:
    raise ValueError(f'--lengths: got {length} for a stream of {num_tokens} tokens; valid: 2 .. {num_tokens}')
  if protocol == 'windows':
    return [Window(start, 1) for start in range(0, num_tokens - length + 1, length)]
  if not 1 <= stride < length:
    raise ValueError(f'--stride: got {stride} at length {length}; valid: 1 .. {length - 1} tokens a window moves by '
                     f'(a window never scores its position 0, which has BOS alone before it)')
  windows, scored_until = [], 0  # every token before scored_until is scored
  start = 0
  while True:
    start = min(start, num_tokens - length)
    end = start + length
    windows.append(Window(start, max(1, scored_until - start)))
    scored_until = end
    if end >= num_tokens:
      return windows
    start += stride


def scored_mask(window: Window, length: int) -> np.ndarray:
  """Which of the window's positions it scores: length booleans."""
  mask = np.zeros(length, bool)
  mask[window.first_scored:] = True
  return mask


def window_batch(stream: np.ndarray, windows: list[Window], length: int, bos: int) -> dict:
  """inputs (BOS, stream[a : a + L - 1]), targets stream[a : a + L] and the scored mask, for the windows."""
  targets = np.stack([stream[w.start:w.start + length] for w in windows]).astype(np.int32)
  inputs = np.concatenate([np.full((len(windows), 1), bos, np.int32), targets[:, :-1]], axis=1)
  scored = np.stack([scored_mask(w, length) for w in windows])
  return dict(inputs=inputs, targets=targets, scored=scored)
