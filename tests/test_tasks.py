"""Tasks: deterministic batches, no leaks, correct answers, data integrity, buckets, end to end."""

import math
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

import transformer
from configs import algorithmic, base, classify as classify_config, forecast as forecast_config
from configs import shakespeare as shakespeare_config, smoke, tracing as tracing_config
from configs import corpus as corpus_config, translation as translation_config
from configs import llama as llama_config
from experiments.runs import evaluation, settings, trainer
from experiments.data import shakespeare as shakespeare_data
from experiments.data.manifest import DataError
from experiments.tasks import TASKS
from experiments.tasks.base import BOS, EOS, NUM_SPECIALS, SEP, TaskSettings
from tests.helpers import with_overrides

ALGORITHMIC = sorted(algorithmic.TASKS)


def _task(name, model_kind='decoder_only', **changes):
  fields = dict(name=name, model_kind=model_kind, vocab_size=32, min_length=1, max_length=6,
                eval_lengths=(6, 12), eval_batches=1)
  if name in algorithmic.TASKS:
    fields.update({k: v for k, v in algorithmic.TASKS[name].items() if k == 'vocab_size'})
    fields['vocab_size'] = max(fields['vocab_size'], 12) if name == 'recall' else fields['vocab_size']
  fields.update(changes)
  return TASKS[name](TaskSettings(**fields))


KINDS = [(name, kind) for name in ALGORITHMIC for kind in ('decoder_only', 'encoder_decoder')] + [
    ('shakespeare', 'decoder_only')]


@pytest.mark.parametrize('name,kind', KINDS)
def test_batches_are_a_pure_function_of_seed_step_split(name, kind):
  task = _task(name, kind)
  first, again = task.batch(0, 7, 'train', 8), task.batch(0, 7, 'train', 8)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  for other in (task.batch(0, 8, 'train', 8), task.batch(1, 7, 'train', 8), task.batch(0, 7, 'eval', 8)):
    assert not np.array_equal(first['targets'], other['targets'])


@pytest.mark.parametrize('name,kind', KINDS)
def test_targets_never_leak_into_inputs(name, kind):
  """Teacher forcing: the input at position t is the target of t - 1, so a causal model predicting
  target t has seen only targets before it. The loss covers the answer only."""
  task = _task(name, kind)
  for length in (None, 6):
    batch = task.batch(3, 1, 'train', 16, length=length)
    valid = batch['valid'][:, 1:]
    np.testing.assert_array_equal(np.where(valid, batch['inputs'][:, 1:], 0),
                                  np.where(valid, batch['targets'][:, :-1], 0))
    assert np.all(batch['weights'] <= batch['valid'])
    if name != 'shakespeare':
      if kind == 'decoder_only':
        assert np.all(batch['inputs'][:, 0] == BOS)
        weighted_inputs = batch['inputs'][batch['weights'] > 0]
        assert not np.any(weighted_inputs == BOS)  # the prompt is never scored
      sizes = (batch['weights'] > 0).sum(1)
      expected = [task.scored(n).sum() + 1 for n in _sizes(task, batch, kind)]
      np.testing.assert_array_equal(sizes, expected)


def _sizes(task, batch, kind):
  """Problem sizes, recovered from the layout."""
  if kind == 'encoder_decoder':
    lengths = batch['source_valid'].sum(1)
  else:
    lengths = np.argmax(batch['inputs'] == SEP, axis=1) - 1
  return [next(n for n in range(1, 100) if task.input_size(n) == length) for length in lengths]


def _examples(task, n=6, count=40):
  batch = task.batch(0, 0, 'eval', count, length=n)
  xs = batch['inputs'][:, 1:task.input_size(n) + 1] - NUM_SPECIALS
  ys = batch['targets'][:, task.input_size(n) + 1:task.input_size(n) + 1 + task.output_size(n)] - NUM_SPECIALS
  assert np.all(batch['targets'][:, task.input_size(n) + 1 + task.output_size(n)] == EOS)
  return xs, ys


def test_algorithmic_answers_are_right():
  for x, y in zip(*_examples(_task('copy'))):
    np.testing.assert_array_equal(y, x)
  for x, y in zip(*_examples(_task('reverse'))):
    np.testing.assert_array_equal(y, x[::-1])
  for x, y in zip(*_examples(_task('sort'))):
    np.testing.assert_array_equal(y, sorted(x))
  for x, y in zip(*_examples(_task('addition'))):
    a, b = x[0::2], x[1::2]  # interleaved: a_0 b_0 a_1 b_1 ..
    def value(digits):
      return int(''.join(str(d) for d in digits[::-1]))
    assert value(a) + value(b) == value(y)
  for x, y in zip(*_examples(_task('parity'))):
    assert y[0] == x.sum() % 2
  task = _task('recall')
  for x, y in zip(*_examples(task)):
    keys, values, queries, answers = x[0::2], x[1::2], y[0::2], y[1::2]
    assert len(set(keys)) == 6 and sorted(queries) == sorted(keys)
    assert [values[list(keys).index(q)] for q in queries] == list(answers)
    assert np.all(values >= task.settings.vocab_size)
  np.testing.assert_array_equal(task.scored(3), [False, True] * 3)  # the random queries are not scored


def test_unscored_outputs_carry_no_weight():
  """Recall scores only the values: the loss and both accuracies ignore the random queries."""
  for kind in ('decoder_only', 'encoder_decoder'):
    batch = _task('recall', kind).batch(0, 0, 'eval', 4, length=5)
    offset = 0 if kind == 'encoder_decoder' else 2 * 5 + 1
    weights = batch['weights'][:, offset:offset + 2 * 5 + 1]
    np.testing.assert_array_equal(weights, np.tile([0, 1] * 5 + [1], (4, 1)))
    assert batch['weights'].sum() == 4 * 6


def test_recall_needs_enough_distinct_keys():
  config = algorithmic.get_config('recall')
  config.task.eval_lengths = (8, 64)
  with pytest.raises(settings.ConfigError, match='task.vocab_size: got 32; valid: at least 64'):
    settings.from_config_dict(config, 1)


def test_shakespeare_held_out_windows_come_from_held_out_works_only():
  task = _task('shakespeare', max_length=64, eval_lengths=(64,))
  train_text, vocabulary = shakespeare_data.load('train')
  held_out, _ = shakespeare_data.load('heldout')
  train_bytes = train_text.tobytes()
  batch = task.batch(0, 0, 'eval', 6, length=64)
  assert task.bos == len(vocabulary) and np.all(batch['inputs'][:, 0] == task.bos)
  assert np.all(batch['weights'][:, 0] == 0)
  assert np.all(batch['weights'][:, 1:] == 1)
  for window in batch['targets']:
    assert window.astype(np.uint8).tobytes() in held_out.tobytes()
    assert window.astype(np.uint8).tobytes() not in train_bytes
  assert len(vocabulary) + 1 == task.vocab_size and 'A' in vocabulary and '\n' in vocabulary
  assert 4_000_000 < len(train_text) and 400_000 < len(held_out) < 600_000


def test_shakespeare_baselines_match_a_direct_count():
  task = _task('shakespeare', max_length=16, eval_lengths=(16,))
  train, vocabulary = shakespeare_data.load('train')
  batch = task.batch(0, 0, 'eval', 2, length=16)
  unigram = np.bincount(train, minlength=len(vocabulary)) + 1.0
  expected = -sum(math.log2(unigram[t] / unigram.sum()) for t in batch['targets'][:, 1:].reshape(-1))
  assert task.host_metrics(batch)['unigram_bits_sum'] == pytest.approx(expected, rel=1e-9)
  previous, following = train[:-1].astype(int), train[1:].astype(int)
  p, n = int(batch['inputs'][0, 5]), int(batch['targets'][0, 5])
  row = np.bincount(following[previous == p], minlength=len(vocabulary)) + 1.0
  single = dict(inputs=batch['inputs'][:1, 5:6], targets=batch['targets'][:1, 5:6], weights=np.ones((1, 1)))
  assert task.host_metrics(single)['bigram_bits_sum'] == pytest.approx(-math.log2(row[n] / row.sum()), rel=1e-9)


@pytest.mark.parametrize('damage', ['missing', 'corrupt'])
def test_missing_or_corrupt_data_names_the_file_and_the_rebuild_command(tmp_path, damage):
  directory = tmp_path / 'shakespeare'
  shutil.copytree(shakespeare_data.DIRECTORY, directory)
  target = directory / 'heldout.txt.xz'
  if damage == 'missing':
    target.unlink()
  else:
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))
  with pytest.raises(DataError, match=rf'heldout.txt.xz: {damage}.*python -m '
                     r'experiments.data.prepare_shakespeare'):
    shakespeare_data.load('heldout', str(directory))


def test_bucket_lengths():
  assert [evaluation.bucket_length(n) for n in (1, 8, 9, 16, 17, 130)] == [8, 8, 16, 16, 32, 256]
  assert evaluation.bucket_length(130, cap=200) == 200
  assert evaluation.bucket_length(201, cap=200) == 256


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['decoder_only', 'encoder_decoder'])
def test_padding_to_a_bucket_leaves_the_metrics_unchanged(kind):
  task = _task('reverse', kind)
  config = transformer.tiny_preset(transformer.PositionConfig(kind='alibi'), vocab_size=task.vocab_size)
  model = transformer.build_model(config, kind)
  batch = task.batch(0, 0, 'eval', 4, length=5)
  args, kwargs = task.model_inputs(batch)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), *args, **kwargs))

  def sums(b):
    a, k = task.model_inputs(b)
    return task.loss_and_metrics(model.apply(params, *a, **k), b)

  padded = evaluation.pad_batch(batch)
  assert padded['inputs'].shape[1] == 16 if kind == 'decoder_only' else padded['source'].shape[1] == 8
  exact, bucketed = sums(batch), sums(padded)
  for name in exact:
    np.testing.assert_allclose(bucketed[name], exact[name], rtol=1e-5)


def _quick(config, **changes):
  config.train.steps = 2
  config.train.log_every = 1
  config.train.eval_every = 2
  config.train.checkpoint_every = 2
  config.train.batch_size = 8
  config.task.eval_batches = 1
  return settings.from_config_dict(with_overrides(config, changes), jax.device_count())


CONFIGS = [(f'algorithmic.py:{t}', lambda t=t: algorithmic.get_config(t)) for t in ALGORITHMIC] + [
    ('shakespeare.py', shakespeare_config.get_config), ('smoke.py', smoke.get_config),
    ('shakespeare.py:passkey', lambda: shakespeare_config.get_config('passkey'))] + [
    (f'forecast.py:{s}', lambda s=s: forecast_config.get_config(s)) for s in forecast_config.SERIES] + [
    ('classify.py', classify_config.get_config), ('tracing.py', tracing_config.get_config),
    ('translation.py', translation_config.get_config), ('corpus.py', corpus_config.get_config),
    ('llama.py:smoke', lambda: llama_config.get_config('smoke'))]


@pytest.mark.slow
@pytest.mark.parametrize('name,make', CONFIGS, ids=[c[0] for c in CONFIGS])
def test_every_config_trains_end_to_end(tmp_path, name, make):
  config = make()
  changes = {'model.model_dim': 32, 'model.feed_forward_dim': 64, 'model.num_encoder_layers': 1,
             'model.num_decoder_layers': 1, 'task.eval_lengths': tuple(config.task.eval_lengths[:2])}
  if name in ('shakespeare.py', 'corpus.py'):
    changes.update({'task.max_length': 32, 'task.eval_lengths': (32, 64)})
  if name == 'shakespeare.py:passkey':  # the shortest row that holds the needle, the question and the answer
    changes.update({'task.max_length': 103, 'task.eval_lengths': (103,)})
  experiment = _quick(config, **changes)
  evaluation_records = trainer.run(experiment, str(tmp_path))
  assert sorted(evaluation_records) == sorted(experiment.task.eval_lengths)
  assert all(np.isfinite(r['loss']) for r in evaluation_records.values())
  assert (tmp_path / 'summary.json').exists()


@pytest.mark.slow
def test_evaluating_many_lengths_compiles_once_per_bucket(tmp_path):
  config = algorithmic.get_config('copy')
  experiment = _quick(config, **{'task.eval_lengths': (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14),
                                 'model.model_dim': 32, 'model.feed_forward_dim': 64})
  task = TASKS['copy'](experiment.task)
  lengths = {evaluation.bucket_length(task.sequence_length(n)) for n in experiment.task.eval_lengths}
  assert len(lengths) == 3  # 13 lengths, 3 buckets: 8, 16, 32
  from experiments.runs import steps
  traced = []
  original = steps.eval_step

  def counting(params, batch, **kwargs):
    traced.append(batch['inputs'].shape)
    return original(params, batch, **kwargs)

  steps.eval_step = counting
  try:
    trainer.run(experiment, str(tmp_path))
  finally:
    steps.eval_step = original
  assert len(traced) == 3, traced


def test_base_config_documents_every_field():
  source = open(os.path.join(os.path.dirname(base.__file__), 'base.py')).read()
  for line in source.splitlines():
    if line.strip().startswith('config.') and '=' in line and 'ConfigDict()' not in line:
      assert '#' in line, f'field without a comment: {line.strip()}'
