"""Sentence classification: speeches parsed and split without overlap; the baseline is right."""

import collections
import math

import jax
import numpy as np
import pytest

from configs import classify as classify_config
from experiments.runs import settings
from experiments.data import shakespeare as shakespeare_data
from experiments.tasks.base import TaskSettings
from experiments.tasks.classify import PAD, PLAYS, Classify, speeches


def _task(**changes):
  fields = dict(name='classify', model_kind='encoder_only', vocab_size=1, min_length=1, max_length=64,
                eval_lengths=(32, 128), eval_batches=7, dataset='shakespeare_plays')
  fields.update(changes)
  return Classify(TaskSettings(**fields))


def test_speeches_drop_speakers_stage_directions_and_headings():
  text = ('ACT I. SCENE I. Rome.\n\n[Enter Flavius.]\n\nFlav.\nHence! home, you idle creatures,\n'
          '[Aside.]\nget you home:\n\nFirst Citizen.\nWhy, sir, a carpenter.\n\nSCENE II.\n\nA line without a speaker.')
  assert speeches(text) == ['Hence! home, you idle creatures,\nget you home:', 'Why, sir, a carpenter.']


def test_every_tenth_speech_is_held_out_and_splits_are_disjoint():
  task = _task()
  _, vocabulary = shakespeare_data.load('train')
  works = dict(shakespeare_data.works('train'), **shakespeare_data.works('heldout'))
  expected = collections.defaultdict(list)
  for label, play in enumerate(PLAYS):
    found = speeches(''.join(vocabulary[i] for i in works[play]))
    assert len(found) > 500, play
    for index, speech in enumerate(found):
      expected[{8: 'eval', 9: 'test'}.get(index % 10, 'train')].append((label, speech))
  for split, items in expected.items():
    texts, labels = task._items[split]
    decoded = [(int(label), ''.join(vocabulary[i - 1] for i in ids)) for ids, label in zip(texts, labels)]
    assert decoded == items
  assert len(expected['eval']) == len(expected['test']) and 8 * len(expected['eval']) < len(expected['train'])


def test_bag_of_characters_baseline_matches_a_direct_naive_bayes():
  task = _task()
  texts, labels = task._items['train']
  counts = [collections.Counter() for _ in PLAYS]
  for ids, label in zip(texts, labels):
    counts[label].update(ids.tolist())
  vocab = task.vocab_size
  batch = task.batch(0, 0, 'eval', 16, length=32)
  for row, label, correct in zip(batch['inputs'], batch['labels'], batch['baseline_correct']):
    scores = []
    for play in range(len(PLAYS)):
      total = sum(counts[play][c] + 1 for c in range(1, vocab))
      scores.append(sum(math.log((counts[play][c] + 1) / total) for c in row if c != PAD))
    assert bool(correct) == (int(np.argmax(scores)) == int(label))


def test_evaluation_scores_every_held_out_speech_once():
  task = _task()
  seen = collections.Counter()
  for step in range(7):
    batch = task.batch(0, step, 'eval', 64, length=32)
    for row, weight in zip(batch['inputs'], batch['weights']):
      if weight:
        seen[row.tobytes()] += 1
  texts, _ = task._items['eval']
  assert sum(seen.values()) == len(texts) == 398
  assert seen == collections.Counter(np.pad(t[:32], (0, 32 - len(t[:32]))).astype(np.int32).tobytes() for t in texts)


def test_training_batches_are_deterministic_balanced_and_cut_to_the_training_length():
  task = _task()
  first, again = task.batch(3, 5, 'train', 64), task.batch(3, 5, 'train', 64)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  assert first['inputs'].shape == (64, 64)
  labels = np.concatenate([task.batch(0, s, 'train', 64)['labels'] for s in range(20)])
  assert np.all(np.abs(np.bincount(labels) / len(labels) - 0.25) < 0.05)


def test_a_bad_dataset_names_the_field():
  config = classify_config.get_config()
  config.task.dataset = 'bible'
  with pytest.raises(settings.ConfigError, match="task.dataset: got 'bible'; valid for classify: shakespeare_plays"):
    settings.from_config_dict(config, jax.device_count())
