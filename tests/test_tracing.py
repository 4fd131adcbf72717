"""Knowledge tracing: the decoder never sees the response it predicts; splits, baseline and AUC are
right; aligned cross-attention keeps every variant causal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from configs import tracing as tracing_config
from experiments.runs import settings
from experiments.data import sat
from experiments.tasks.base import BOS, PAD, TaskSettings
from experiments.tasks.tracing import (CORRECT, FIRST_ITEM, HISTOGRAM_BINS, NO_ANSWER, WRONG, Tracing,
                                       histogram_auc)
from tests.helpers import assert_causal, bidirectional, init, tiny, with_overrides


def _task(**changes):
  fields = dict(name='tracing', model_kind='encoder_decoder', vocab_size=1, min_length=1, max_length=20,
                eval_lengths=(10, 80), eval_batches=8, dataset='quant')
  fields.update(changes)
  return Tracing(TaskSettings(**fields))


def _naive_auc(scores, labels):
  """P(score of a random positive > score of a random negative), ties one half, by every pair."""
  positives, negatives = scores[labels == 1], scores[labels == 0]
  wins = (positives[:, None] > negatives[None]).sum() + 0.5 * (positives[:, None] == negatives[None]).sum()
  return wins / (len(positives) * len(negatives))


def test_histogram_auc_equals_the_pairwise_definition():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 2, 3000)
  # Scores already on bin edges (ties included) give the exact value; continuous ones are within a bin.
  on_edges = rng.integers(0, HISTOGRAM_BINS, 3000)
  positives = np.bincount(on_edges[labels == 1], minlength=HISTOGRAM_BINS)
  negatives = np.bincount(on_edges[labels == 0], minlength=HISTOGRAM_BINS)
  assert histogram_auc(positives, negatives) == pytest.approx(_naive_auc(on_edges, labels), abs=1e-12)
  continuous = np.clip(rng.normal(0.5 + 0.1 * labels, 0.2), 0, 1)
  bins = np.clip(np.floor(continuous * HISTOGRAM_BINS), 0, HISTOGRAM_BINS - 1).astype(int)
  estimate = histogram_auc(np.bincount(bins[labels == 1], minlength=HISTOGRAM_BINS),
                           np.bincount(bins[labels == 0], minlength=HISTOGRAM_BINS))
  assert estimate == pytest.approx(_naive_auc(continuous, labels), abs=2e-3)
  assert 0.6 < estimate < 0.7  # the shift of half a standard deviation: Phi(0.5 / sqrt 2) = 0.64


def test_decoder_inputs_are_the_previous_responses_never_the_current_one():
  task = _task()
  answers = sat.correctness('quant')
  for length in (None, 10, 80):
    batch = task.batch(0, 2, 'eval' if length else 'train', 16, length=length)
    items = batch['source'] - FIRST_ITEM
    for row in range(16):
      valid = batch['valid'][row]
      first = items[row, 0]
      person = batch['person'][row]
      assert (person % 10 == 8) if length else (person % 10 not in (8, 9))
      expected_items = np.arange(first, first + valid.sum())
      np.testing.assert_array_equal(items[row][valid], expected_items)
      responses = answers[person, expected_items]
      tokens = np.select([responses == 1, responses == 0], [CORRECT, WRONG], NO_ANSWER)
      np.testing.assert_array_equal(batch['inputs'][row][valid], np.concatenate([[BOS], tokens[:-1]]))
      np.testing.assert_array_equal(batch['weights'][row][valid] > 0, responses >= 0)
      assert np.all(batch['inputs'][row][~valid] == PAD) and np.all(batch['weights'][row][~valid] == 0)
      # The input at step t is the response of step t - 1: the target of t is never among inputs <= t.
      for t in range(1, valid.sum()):
        assert batch['inputs'][row, t] == tokens[t - 1]


def test_batches_are_a_pure_function_of_seed_step_split():
  task = _task()
  first, again = task.batch(0, 7, 'train', 8), task.batch(0, 7, 'train', 8)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  for other in (task.batch(0, 8, 'train', 8), task.batch(1, 7, 'train', 8), task.batch(0, 7, 'eval', 8)):
    assert not np.array_equal(first['targets'], other['targets'])


def test_splits_are_disjoint_and_evaluation_scores_every_answer_once():
  task = _task()
  people = task._people
  assert not set(people['train']) & set(people['eval']) and not set(people['eval']) & set(people['test'])
  assert len(people['eval']) == len(people['test']) == 500 and len(people['train']) == 4000
  answers = sat.correctness('quant')
  answered = {(p, i) for p in people['eval'] for i in np.flatnonzero(answers[p] >= 0)}
  for length, batches in ((80, 8), (10, 63), (20, 32)):
    task = _task(eval_batches=batches)
    scored = []
    for index in range(batches):
      batch = task.batch(0, index, 'eval', 64, length=length)
      for row, col in zip(*np.nonzero(batch['weights'])):
        scored.append((batch['person'][row], batch['source'][row, col] - FIRST_ITEM))
    assert len(scored) == len(set(scored)) and set(scored) == answered, length


def test_item_difficulty_baseline_matches_a_direct_count_over_training_test_takers():
  task = _task()
  answers = sat.correctness('quant')
  train = [i for i in range(answers.shape[0]) if i % 10 not in (8, 9)]
  for item in (0, 41, 79):
    column = answers[train, item]
    assert task.item_difficulty[item] == pytest.approx(((column == 1).sum() + 1) / ((column >= 0).sum() + 2))
  batch = task.batch(0, 0, 'eval', 64, length=80)
  sums = task.host_metrics(batch)
  weights = batch['weights'].reshape(-1) > 0
  scores = batch['item_difficulty'].reshape(-1)[weights]
  labels = (batch['targets'].reshape(-1)[weights] == CORRECT).astype(int)
  assert histogram_auc(sums['baseline_positive_histogram'], sums['baseline_negative_histogram']) == \
      pytest.approx(_naive_auc(scores, labels), abs=2e-3)
  assert sums['baseline_correct_sum'] == pytest.approx(float(((scores > 0.5) == labels).sum()))


def test_metrics_match_a_direct_computation_from_the_logits():
  task = _task()
  batch = task.batch(0, 0, 'eval', 8, length=10)
  logits = jax.random.normal(jax.random.PRNGKey(0), batch['targets'].shape + (task.vocab_size,))
  sums = jax.tree_util.tree_map(np.asarray, task.loss_and_metrics(logits, batch))
  two = np.asarray(logits)[..., [WRONG, CORRECT]]
  probability = np.exp(two[..., 1]) / np.exp(two).sum(-1)
  labels = batch['targets'] == CORRECT
  weights = batch['weights']
  expected_loss = -np.sum(np.where(labels, np.log(probability), np.log(1 - probability)) * weights)
  assert float(sums['loss_sum']) == pytest.approx(expected_loss, rel=1e-5)
  assert float(sums['correct_sum']) == pytest.approx(float((((probability > 0.5) == labels) * weights).sum()))
  summary = task.summarize(sums)
  mask = weights.reshape(-1) > 0
  assert summary['auc'] == pytest.approx(_naive_auc(probability.reshape(-1)[mask], labels.reshape(-1)[mask]), abs=5e-3)


@pytest.mark.slow
@pytest.mark.parametrize('kind', [kind for kind in sorted(T.VARIANTS) if bidirectional(kind)])
def test_aligned_cross_attention_keeps_the_decoder_causal(kind):
  """SAINT: step t's prediction depends on the responses before t only, whatever the variant; the
  cross-attention weights never reach a later exercise."""
  config = tiny(kind, aligned_cross_attention=True, num_encoder_layers=1)  # the delta enters the decoder only
  model = T.EncoderDecoder(config)
  source = jnp.arange(6)[None] + 5
  target = jnp.asarray([[BOS, 4, 5, 4, 4, 5]])
  params = init(model, source, target)
  assert_causal(model, params, (source, target), 6, config.model_dim)
  _, state = model.apply(params, source, target, mutable=['intermediates'])
  for layer in range(config.num_decoder_layers):
    weights = state['intermediates']['decoder'][f'layer_{layer}']['cross_attention']['attention_weights'][0]
    assert float(jnp.abs(jnp.triu(weights[0], 1)).sum()) == 0.0
    assert float(jnp.abs(jnp.diagonal(weights[0], axis1=-2, axis2=-1)).min()) > 0.0


def test_aligned_cross_attention_needs_equal_lengths():
  model = T.EncoderDecoder(tiny('rope', aligned_cross_attention=True))
  with pytest.raises(ValueError, match='aligned_cross_attention: source length 5 differs from target length 6'):
    init(model, jnp.ones((1, 5), jnp.int32), jnp.ones((1, 6), jnp.int32))


@pytest.mark.parametrize('field,value,message', [
    ('task.dataset', 'math', "task.dataset: got 'math'; valid for tracing: quant, verb"),
    ('task.max_length', 81, 'task.max_length: got 81; valid: 1 to 80'),
    ('task.eval_lengths', (10, 160), 'task.eval_lengths: got 160; valid: 1 to 80'),
    ('task.model_kind', 'decoder_only', 'task.model_kind'),
])
def test_bad_settings_name_the_field(field, value, message):
  config = with_overrides(tracing_config.get_config(), {field: value})
  with pytest.raises(settings.ConfigError, match=message.replace('(', r'\(').replace(')', r'\)')):
    settings.from_config_dict(config, 1)
