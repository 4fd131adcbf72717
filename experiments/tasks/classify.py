"""Sentence classification through a [CLS] token: which play a speech of Shakespeare comes from.

Items are the speeches of PLAYS (blocks between blank lines, without the speaker's name, stage
directions or act and scene headings), read as characters by an encoder-only model whose [CLS]
state feeds a softmax over the plays; TUPE's [CLS] reset applies here. Within each play, speech i
goes to 'eval' when i % 10 == 8, to 'test' when i % 10 == 9, and to 'train' otherwise. Training
draws a play uniformly, then one of its speeches, cut to task.max_length characters; evaluation at
length L scores every eval speech cut to its first L characters. The baseline is a multinomial
naive Bayes over character counts (a bag of characters, add-one smoothing, uniform prior) fitted
on the training speeches and scored on the same cut speeches.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.data import shakespeare as data
from experiments.data.manifest import DataError
from experiments.tasks.base import Task, batch_rng, evaluation_rows

PLAYS = ('julius_caesar', 'much_ado_about_nothing', 'richard_iii', 'othello')  # tragedy, comedy, history, tragedy
SPEAKER = re.compile(r"^[A-Z][A-Za-z' ]{0,24}\.$")  # "Laer." or "First Citizen."
HEADING = re.compile(r'^(ACT|Act|SCENE|Scene|PERSONS|Persons)\b')
PAD = 0


def speeches(text: str) -> list[str]:
  """The speeches of a play's text: blank-line blocks, the speaker line dropped, stage directions
  ([...]) and headings skipped."""
  found = []
  for block in re.split(r'\n\s*\n', text):
    lines = [line for line in block.strip('\n').split('\n') if line.strip()]
    if not lines or not SPEAKER.match(lines[0].strip()) or len(lines) < 2:
      continue
    body = [line for line in lines[1:] if not line.strip().startswith('[') and not HEADING.match(line)]
    if body:
      found.append('\n'.join(body))
  return found


class Classify(Task):
  model_kinds = ('encoder_only',)
  fixed_width_keys = ('labels', 'weights', 'baseline_correct')
  headline_metric = 'accuracy'

  @property
  def vocab_size(self) -> int:
    return data.vocabulary_size() + 1  # character ids shifted by one: 0 pads

  @property
  def model_fields(self) -> dict:
    return dict(num_outputs=len(PLAYS))

  def validate(self):
    if self.settings.dataset not in ('', 'shakespeare_plays'):
      return f'task.dataset: got {self.settings.dataset!r}; valid for classify: shakespeare_plays'
    try:
      self._items  # pylint: disable=pointless-statement
    except DataError as error:
      return str(error)
    return None

  @functools.cached_property
  def _items(self) -> dict:
    """split -> (list of id arrays, labels)."""
    _, vocabulary = data.load('train')
    texts = {}
    for split in ('train', 'heldout'):
      texts.update({name: ids for name, ids in data.works(split).items() if name in PLAYS})
    items = {split: ([], []) for split in ('train', 'eval', 'test')}
    for label, play in enumerate(PLAYS):
      text = ''.join(vocabulary[i] for i in texts[play])
      for index, speech in enumerate(speeches(text)):
        split = {8: 'eval', 9: 'test'}.get(index % 10, 'train')
        items[split][0].append(np.frombuffer(speech.encode('latin-1'), np.uint8))
        items[split][1].append(label)
    lookup = np.zeros(256, np.int32)
    lookup[np.frombuffer(vocabulary.encode('latin-1'), np.uint8)] = np.arange(len(vocabulary)) + 1
    return {split: ([lookup[raw] for raw in raws], np.asarray(labels)) for split, (raws, labels) in items.items()}

  @functools.cached_property
  def _bag_of_characters(self) -> np.ndarray:
    """log P(character | play), classes x vocabulary, from the training speeches (add-one)."""
    counts = np.ones((len(PLAYS), self.vocab_size))
    for ids, label in zip(*self._items['train']):
      counts[label] += np.bincount(ids, minlength=self.vocab_size)
    counts[:, PAD] = 0.0
    return np.log(counts / counts.sum(1, keepdims=True) + 1e-300)

  def sequence_length(self, length: int) -> int:
    return length + 1  # the [CLS] token

  def batch(self, seed, step, split, batch_size, length=None):
    rng = batch_rng(seed, split, step, length or 0)
    texts, labels = self._items[split]
    if length is None:
      chosen_labels = rng.integers(0, len(PLAYS), size=batch_size)
      indices = [rng.choice(np.flatnonzero(labels == label)) for label in chosen_labels]
      weights = np.ones(batch_size, np.float32)
      width = self.settings.max_length
    else:
      indices, weights = evaluation_rows(len(texts), self.settings.eval_batches, batch_size, step)
      width = length
    inputs = np.full((batch_size, width), PAD, np.int32)
    for row, index in enumerate(indices):
      ids = texts[index][:width]
      inputs[row, :len(ids)] = ids
    batch_labels = labels[np.asarray(indices)].astype(np.int32)
    scores = np.stack([np.bincount(row, minlength=self.vocab_size) for row in inputs]) @ self._bag_of_characters.T
    baseline_correct = (np.argmax(scores, 1) == batch_labels).astype(np.float32)
    return dict(inputs=inputs, valid=inputs != PAD, labels=batch_labels, weights=weights,
                baseline_correct=baseline_correct)

  def model_inputs(self, batch):
    return (batch['inputs'],), dict(valid_BxL=batch['valid'])

  def loss_and_metrics(self, logits_BxC, batch, label_smoothing=0.0):
    logits = logits_BxC.astype(jnp.float32)
    classes = logits.shape[-1]
    targets = jax.nn.one_hot(batch['labels'], classes) * (1 - label_smoothing) + label_smoothing / classes
    weights = batch['weights']
    correct = (jnp.argmax(logits, -1) == batch['labels']).astype(jnp.float32) * weights
    return dict(loss_sum=jnp.sum(optax.softmax_cross_entropy(logits, targets) * weights),
                correct_sum=jnp.sum(correct), weight_sum=jnp.sum(weights))

  def host_metrics(self, batch):
    return dict(baseline_correct_sum=float(np.sum(batch['baseline_correct'] * batch['weights'])))

  def summarize(self, sums):
    weight = max(float(sums['weight_sum']), 1.0)
    summary = dict(loss=float(sums['loss_sum']) / weight, accuracy=float(sums['correct_sum']) / weight)
    if 'baseline_correct_sum' in sums:
      summary['bag_of_characters_accuracy'] = float(sums['baseline_correct_sum']) / weight
    return summary
