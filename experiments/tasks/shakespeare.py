"""Character-level language modelling on the complete works of Shakespeare, held out by work.

Training windows of task.max_length characters are drawn from 38 works; evaluation windows of
each task.eval_lengths come from four held-out plays (Hamlet, Macbeth, The Tempest, Twelfth
Night). Every window starts with a beginning-of-sequence token, BOS (one id past the characters),
as language models' documents do: a fixed first token lets a model without position encodings
(NoPE) count how far it is from the start. The inputs are BOS c_1 .. c_{L-1} and the targets
c_1 .. c_L; the first target, which has no character before it, is not scored, so the metric is
bits per character over the L - 1 characters that follow another. On the same positions the task
also scores a unigram and a bigram character model fitted to the training works (add-one
smoothing), the baselines a Transformer must beat.
"""

import functools
import math

import numpy as np

from experiments.data import shakespeare as data
from experiments.data.manifest import DataError
from experiments.tasks import passkey, retrieval_rows
from experiments.tasks.base import Task, batch_rng, summarize

SPLIT_FILES = {'train': 'train', 'eval': 'heldout', 'test': 'heldout'}


@functools.lru_cache(maxsize=1)
def _baselines() -> tuple[np.ndarray, np.ndarray]:
  """log2 probabilities: unigram [V] and bigram [V, V] (previous, next), add-one smoothed."""
  train, vocabulary = data.load('train')
  size = len(vocabulary)
  unigram = np.bincount(train, minlength=size).astype(np.float64) + 1.0
  bigram = np.bincount(train[:-1].astype(np.int64) * size + train[1:], minlength=size * size)
  bigram = bigram.reshape(size, size).astype(np.float64) + 1.0
  return np.log2(unigram / unigram.sum()), np.log2(bigram / bigram.sum(axis=1, keepdims=True))


class Shakespeare(Task):
  model_kinds = ('decoder_only',)

  @property
  def vocab_size(self) -> int:
    return data.vocabulary_size() + 1  # the characters, then BOS

  @property
  def bos(self) -> int:
    return data.vocabulary_size()

  def validate(self):
    try:
      for split in ('train', 'heldout'):
        data.load(split)
    except DataError as error:
      return f'task.name: shakespeare: {error}'
    return retrieval_rows.check(self)

  def sequence_length(self, length: int) -> int:
    return length

  def batch(self, seed, step, split, batch_size, length=None):
    text, _ = data.load(SPLIT_FILES[split])
    length = length or self.settings.max_length
    rng = batch_rng(seed, split, step, length)
    starts = rng.integers(0, len(text) - length - 1, size=batch_size)
    windows = np.stack([text[s:s + length] for s in starts]).astype(np.int32)
    inputs = np.concatenate([np.full((batch_size, 1), self.bos, np.int32), windows[:, :-1]], axis=1)
    weights = np.ones((batch_size, length), np.float32)
    weights[:, 0] = 0.0  # the first character has no previous one: the bigram cannot score it
    batch = dict(inputs=inputs, targets=windows, weights=weights, valid=np.ones((batch_size, length), bool))
    if split == 'train' and (self.settings.passkey_fraction or self.settings.needle_fraction):
      batch = retrieval_rows.mix_into(batch, self.settings, passkey.codec_for(self), text, seed, step)
    return batch

  def stream(self, split: str) -> np.ndarray:
    """The split's characters as one token stream (the held-out plays one after another, for 'eval')."""
    return data.load(SPLIT_FILES[split])[0]

  def model_inputs(self, batch):
    return (batch['inputs'],), dict(valid_BxL=batch['valid'])

  def host_metrics(self, batch):
    unigram, bigram = _baselines()
    targets, weights = batch['targets'], batch['weights']
    previous = np.minimum(batch['inputs'], len(unigram) - 1)  # BOS (weight 0) mapped to any row
    return dict(unigram_bits_sum=float(-(unigram[targets] * weights).sum()),
                bigram_bits_sum=float(-(bigram[previous, targets] * weights).sum()))  # inputs[t] precedes targets[t]

  def summarize(self, sums):
    summary = summarize(sums)
    summary['bits_per_character'] = summary['cross_entropy'] / math.log(2)
    weight = max(float(sums['weight_sum']), 1.0)
    for name in ('unigram', 'bigram'):
      if f'{name}_bits_sum' in sums:
        summary[f'{name}_bits_per_character'] = float(sums[f'{name}_bits_sum']) / weight
    return summary
