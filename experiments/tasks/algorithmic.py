"""Algorithmic sequence transduction: copy, reverse, sort. No data; every batch is sampled.

Decoder-only layout:  BOS x_1 .. x_n SEP y_1 .. y_n EOS PAD ..; the loss covers y and EOS.
Encoder-decoder:      source x_1 .. x_n; target BOS y_1 .. y_n -> y_1 .. y_n EOS.
Lengths n are drawn uniformly in [min_length, max_length] for training; evaluation fixes n.
"""

import numpy as np

from experiments.tasks.base import BOS, EOS, NUM_SPECIALS, PAD, SEP, Task, batch_rng


class TransductionTask(Task):
  """y = f(x) for a fixed f on sequences of symbols."""

  def transform(self, symbols: np.ndarray) -> np.ndarray:
    raise NotImplementedError

  def sequence_length(self, length: int) -> int:
    if self.settings.model_kind == 'encoder_decoder':
      return length + 1
    return 2 * length + 2

  def batch(self, seed, step, split, batch_size, length=None):
    settings = self.settings
    rng = batch_rng(seed, split, step, length or 0)
    if length is None:
      lengths = rng.integers(settings.min_length, settings.max_length + 1, size=batch_size)
      padded = settings.max_length
    else:
      lengths = np.full(batch_size, length)
      padded = length
    symbols = rng.integers(NUM_SPECIALS, NUM_SPECIALS + settings.vocab_size, size=(batch_size, padded))
    if settings.model_kind == 'encoder_decoder':
      return self._encoder_decoder_batch(symbols, lengths, padded)
    return self._decoder_only_batch(symbols, lengths, padded)

  def _decoder_only_batch(self, symbols, lengths, padded):
    batch_size = len(lengths)
    total = self.sequence_length(padded) + 1
    sequence = np.full((batch_size, total), PAD, np.int32)
    weights = np.zeros((batch_size, total - 1), np.float32)
    for b, n in enumerate(lengths):
      x = symbols[b, :n]
      row = np.concatenate([[BOS], x, [SEP], self.transform(x), [EOS]])
      sequence[b, :len(row)] = row
      weights[b, n + 1:2 * n + 2] = 1.0  # predictions made at SEP .. y_n, i.e. of y_1 .. EOS
    valid = (np.arange(total - 1)[None] < (2 * lengths + 2)[:, None])
    return dict(inputs=sequence[:, :-1], targets=sequence[:, 1:], weights=weights, valid=valid)

  def _encoder_decoder_batch(self, symbols, lengths, padded):
    batch_size = len(lengths)
    source = np.full((batch_size, padded), PAD, np.int32)
    target = np.full((batch_size, padded + 2), PAD, np.int32)
    for b, n in enumerate(lengths):
      x = symbols[b, :n]
      source[b, :n] = x
      target[b, :n + 2] = np.concatenate([[BOS], self.transform(x), [EOS]])
    positions = np.arange(padded + 1)[None]
    valid = positions < (lengths + 1)[:, None]
    return dict(source=source, source_valid=np.arange(padded)[None] < lengths[:, None],
                inputs=target[:, :-1], targets=target[:, 1:], weights=valid.astype(np.float32), valid=valid)


class Copy(TransductionTask):
  """y = x, the Annotated Transformer's classic."""

  def transform(self, symbols):
    return symbols


class Reverse(TransductionTask):
  """y = x reversed."""

  def transform(self, symbols):
    return symbols[::-1]


class Sort(TransductionTask):
  """y = x sorted ascending."""

  def transform(self, symbols):
    return np.sort(symbols)


ALGORITHMIC_TASKS = {'copy': Copy, 'reverse': Reverse, 'sort': Sort}
