"""Knowledge tracing: will this test-taker answer the next item correctly? (Riiid answer
correctness, with the SAINT design of Choi et al. 2020.)

Data: the Swedish SAT 2022 (experiments/data/sat/, task.dataset = quant or verb): 5,000 test-takers
x 80 items answered in the test's order. Test-taker i goes to 'eval' when i % 10 == 8, to 'test'
when i % 10 == 9, and to 'train' otherwise. A problem of length n is n consecutive items of one
test-taker: the encoder reads the items e_1..e_n, the decoder reads the responses shifted right,
[START, r_1, .., r_{n-1}], and predicts r_t at step t, so it never sees the response it predicts.
Encoder and decoder steps are aligned, so cross-attention is causal and carries the positional
variant (ModelConfig.aligned_cross_attention). Training draws windows of task.max_length items at
random offsets; evaluation at length n cuts every eval test-taker's 80 items into consecutive
chunks of n (the last may be shorter) and scores each item once per chunk, so shorter n means less
history. Blank answers are never targets and enter the decoder as NO_ANSWER.

P(correct) = softmax over the two output tokens WRONG and CORRECT; the loss is its binary
cross-entropy. Metrics: accuracy (P > 0.5), AUC (from 1,024-bin histograms of P, which add across
batches and devices), and the same two for the per-item baseline: P(correct on item) = (correct +
1) / (answered + 2) over the training test-takers.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from experiments.data import sat
from experiments.data.manifest import DataError
from experiments.tasks.base import NUM_SPECIALS, PAD, BOS, Task, batch_rng, evaluation_rows

WRONG, CORRECT, NO_ANSWER = NUM_SPECIALS, NUM_SPECIALS + 1, NUM_SPECIALS + 2
FIRST_ITEM = NUM_SPECIALS + 3
HISTOGRAM_BINS = 1024
PARTS = ('quant', 'verb')


def person_split(index: int) -> str:
  return {8: 'eval', 9: 'test'}.get(index % 10, 'train')


def histogram_auc(positives_N: np.ndarray, negatives_N: np.ndarray) -> float:
  """Area under the ROC curve from score histograms (bins in increasing score): the probability
  that a random positive outscores a random negative, a tie (same bin) counting one half."""
  positives_N, negatives_N = np.asarray(positives_N, np.float64), np.asarray(negatives_N, np.float64)
  below = np.cumsum(negatives_N) - negatives_N
  pairs = positives_N.sum() * negatives_N.sum()
  return float(np.sum(positives_N * (below + 0.5 * negatives_N)) / pairs) if pairs else float('nan')


def score_bins(probability, numpy=jnp):
  """The histogram bin of each probability in [0, 1] (numpy=np on the host)."""
  return numpy.clip(numpy.floor(probability * HISTOGRAM_BINS), 0, HISTOGRAM_BINS - 1).astype(numpy.int32)


class Tracing(Task):
  model_kinds = ('encoder_decoder',)
  fixed_width_keys = ('person',)
  headline_metric = 'auc'

  @property
  def part(self) -> str:
    return self.settings.dataset or 'quant'

  @property
  def vocab_size(self) -> int:
    return FIRST_ITEM + self._answers.shape[1]

  @property
  def model_fields(self) -> dict:
    return dict(aligned_cross_attention=True)

  def validate(self):
    if self.part not in PARTS:
      return f'task.dataset: got {self.settings.dataset!r}; valid for tracing: {", ".join(PARTS)}'
    try:
      items = self._answers.shape[1]
    except DataError as error:
      return str(error)
    for name, value in (('task.max_length', self.settings.max_length),
                        ('task.eval_lengths', max(self.settings.eval_lengths))):
      if not 1 <= value <= items:
        return f'{name}: got {value}; valid: 1 to {items}, the items of the {self.part} test'
    return None

  @functools.cached_property
  def _answers(self) -> np.ndarray:
    return sat.correctness(self.part)

  @functools.cached_property
  def _people(self) -> dict:
    """split -> indices of its test-takers."""
    splits = np.asarray([person_split(i) for i in range(self._answers.shape[0])])
    return {split: np.flatnonzero(splits == split) for split in ('train', 'eval', 'test')}

  @functools.cached_property
  def item_difficulty(self) -> np.ndarray:
    """P(correct) per item over the training test-takers, add-one smoothed."""
    answers = self._answers[self._people['train']]
    return ((answers == 1).sum(0) + 1.0) / ((answers >= 0).sum(0) + 2.0)

  def sequence_length(self, length: int) -> int:
    return length

  def _windows(self, split, step, batch_size, length, seed):
    """(test-taker, first item, window length, row weight) per row."""
    items = self._answers.shape[1]
    people = self._people[split]
    if length is None:
      rng = batch_rng(seed, split, step)
      width = self.settings.max_length
      starts = rng.integers(0, items - width + 1, size=batch_size)
      return people[rng.integers(0, len(people), size=batch_size)], starts, width, np.ones(batch_size, np.float32)
    chunks = -(-items // length)
    rows, weights = evaluation_rows(len(people) * chunks, self.settings.eval_batches, batch_size, step)
    return people[rows // chunks], (rows % chunks) * length, length, weights

  def batch(self, seed, step, split, batch_size, length=None):
    persons, starts, width, row_weights = self._windows(split, step, batch_size, length, seed)
    items = self._answers.shape[1]
    source = np.full((batch_size, width), PAD, np.int32)
    answers = np.full((batch_size, width), sat.NO_ANSWER, np.int8)
    for row, (person, start) in enumerate(zip(persons, starts)):
      stop = min(start + width, items)
      source[row, :stop - start] = FIRST_ITEM + np.arange(start, stop)
      answers[row, :stop - start] = self._answers[person, start:stop]
    valid = source != PAD
    responses = np.select([answers == 1, answers == 0], [CORRECT, WRONG], NO_ANSWER).astype(np.int32)
    targets = np.where(answers == 1, CORRECT, WRONG).astype(np.int32)
    inputs = np.concatenate([np.full((batch_size, 1), BOS, np.int32), responses[:, :-1]], axis=1)
    inputs[~valid] = PAD
    weights = ((answers >= 0) & valid).astype(np.float32) * row_weights[:, None]
    difficulty = np.where(valid, self.item_difficulty[np.clip(source - FIRST_ITEM, 0, items - 1)], 0.5)
    return dict(source=source, source_valid=valid, inputs=inputs, valid=valid, targets=targets,
                weights=weights, item_difficulty=difficulty.astype(np.float32), person=persons.astype(np.int32))

  def loss_and_metrics(self, logits_BxLtxC, batch, label_smoothing=0.0):
    del label_smoothing  # a binary target; smoothing would only shift the calibration
    two = logits_BxLtxC[..., WRONG:CORRECT + 1].astype(jnp.float32)
    log_probabilities = jax.nn.log_softmax(two, axis=-1)
    is_correct = (batch['targets'] == CORRECT)
    weights = batch['weights'].astype(jnp.float32)
    log_likelihood = jnp.where(is_correct, log_probabilities[..., 1], log_probabilities[..., 0])
    probability = jnp.exp(log_probabilities[..., 1])
    right = ((probability > 0.5) == is_correct).astype(jnp.float32)
    bins = score_bins(probability).reshape(-1)
    positive = (weights * is_correct).reshape(-1)
    negative = (weights * (1.0 - is_correct)).reshape(-1)
    return dict(loss_sum=-jnp.sum(log_likelihood * weights), weight_sum=jnp.sum(weights),
                correct_sum=jnp.sum(right * weights),
                positive_histogram=jax.ops.segment_sum(positive, bins, HISTOGRAM_BINS),
                negative_histogram=jax.ops.segment_sum(negative, bins, HISTOGRAM_BINS))

  def host_metrics(self, batch):
    probability, weights = batch['item_difficulty'], batch['weights']
    is_correct = batch['targets'] == CORRECT
    bins = score_bins(probability, np).reshape(-1)
    histogram = lambda w: np.bincount(bins, w.reshape(-1), HISTOGRAM_BINS)
    return dict(baseline_correct_sum=float(np.sum(((probability > 0.5) == is_correct) * weights)),
                baseline_loss_sum=float(-np.sum(np.log(np.where(is_correct, probability, 1 - probability)) * weights)),
                baseline_positive_histogram=histogram(weights * is_correct),
                baseline_negative_histogram=histogram(weights * ~is_correct))

  def summarize(self, sums):
    weight = max(float(sums['weight_sum']), 1.0)
    summary = dict(loss=float(sums['loss_sum']) / weight, accuracy=float(sums['correct_sum']) / weight,
                   auc=histogram_auc(sums['positive_histogram'], sums['negative_histogram']))
    if 'baseline_correct_sum' in sums:
      summary.update(item_difficulty_accuracy=float(sums['baseline_correct_sum']) / weight,
                     item_difficulty_loss=float(sums['baseline_loss_sum']) / weight,
                     item_difficulty_auc=histogram_auc(sums['baseline_positive_histogram'],
                                                       sums['baseline_negative_histogram']))
    return summary
