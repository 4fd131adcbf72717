"""Forecasting: windows never see their targets or the future's statistics; baselines are right."""

import jax
import numpy as np
import pytest

from configs import forecast as forecast_config
from experiments.runs import evaluation, settings, trainer
from experiments.data import series as series_data
from experiments.data.manifest import DataError
from experiments.tasks import TASKS
from experiments.tasks.base import TaskSettings
from experiments.tasks.forecast import SEASONS, Forecast
from tests.helpers import with_overrides


def _task(dataset='co2', horizon=6, min_length=52, max_length=60, eval_lengths=(52, 80), eval_batches=2,
          patch_length=1):
  return Forecast(TaskSettings(name='forecast', model_kind='encoder_only', vocab_size=1, min_length=min_length,
                               max_length=max_length, eval_lengths=eval_lengths, eval_batches=eval_batches,
                               dataset=dataset, horizon=horizon, patch_length=patch_length))


def _with_series(task, values):
  """The task reading `values` (T x C, already scaled) in place of the real series."""
  task.__dict__['_series'] = np.asarray(values, np.float64)
  return task


def test_windows_lie_in_their_split_and_splits_do_not_overlap():
  task = _task()
  steps = task._series.shape[0]
  targets = {}
  for split in ('train', 'eval', 'test'):
    start, end = Forecast.boundaries(split, steps)
    windows = task.windows(split, 80)
    assert len(windows)
    assert windows[:, 1].min() >= max(start, 80) and windows[:, 1].max() + task.settings.horizon <= end
    targets[split] = {(c, t + h) for c, t in windows for h in range(task.settings.horizon)}
  assert not targets['train'] & targets['eval'] and not targets['eval'] & targets['test']
  assert not targets['train'] & targets['test']


@pytest.mark.parametrize('split,length', [('train', None), ('eval', 52), ('eval', 80), ('test', 64)])
def test_inputs_hold_only_the_past(split, length):
  """With z_t = t every input is a time before the first target: relative to the last input it is
  <= 0, and the targets are exactly 1 .. H; padding is zero and invalid."""
  task = _task()
  steps = task._series.shape[0]
  _with_series(task, np.arange(steps, dtype=np.float64)[:, None])
  batch = task.batch(0, 1, split, 16, length=length)
  valid = batch['valid']
  inputs = batch['inputs'][..., 0]
  assert np.all(inputs[valid] <= 0) and np.all(inputs[~valid] == 0)
  rows = batch['weights'][:, 0] > 0
  np.testing.assert_array_equal(batch['targets'][rows], np.tile(np.arange(1, 7), (rows.sum(), 1)))
  sizes = valid.sum(1)
  for row, size in zip(inputs, sizes):  # consecutive times ending at the last input
    np.testing.assert_array_equal(row[:size], np.arange(-size + 1, 1))


@pytest.mark.parametrize('split,length', [('train', None), ('eval', 52), ('test', 80)])
def test_patches_are_the_window_cut_into_consecutive_pieces_ending_at_the_last_input(split, length):
  """With z_t = t and patches of 4: patch p of a window of W values holds the times t-W+4p ..
  t-W+4p+3 (relative to t-1), so the last valid patch ends at 0, every value is in the past, the
  window lengths are whole patches, and the targets are those of the same window read value by value."""
  patched, single = _task(patch_length=4), _task()
  for task in (patched, single):
    _with_series(task, np.arange(task._series.shape[0], dtype=np.float64)[:, None])
  batch, reference = patched.batch(0, 1, split, 16, length=length), single.batch(0, 1, split, 16, length=length)
  assert batch['inputs'].shape == (16, (length or 60) // 4, 4)
  patches = batch['valid'].sum(1)
  if length is None:  # training: whole patches within min_length .. max_length
    assert np.all(patches * 4 >= 52) and np.all(patches * 4 <= 60) and len(set(patches)) > 1
  else:
    assert np.all(patches * 4 == length)
  for row, count in zip(batch['inputs'], patches):
    np.testing.assert_array_equal(row[:count].reshape(-1), np.arange(-4 * count + 1, 1))
    assert np.all(row[count:] == 0)
  if length is not None:  # evaluation: the same windows as without patches
    np.testing.assert_array_equal(batch['targets'], reference['targets'])
    np.testing.assert_array_equal(batch['inputs'].reshape(16, -1), reference['inputs'][..., 0])


def test_scaling_uses_the_training_span_only(monkeypatch):
  """Changing every value after the training span leaves the scaled training span unchanged."""
  labels, values, columns = series_data.load('co2')
  end = Forecast.boundaries('train', len(values))[1]
  future = values.copy()
  future[end:] *= 3.0
  scaled = {}
  for name, array in (('real', values), ('changed', future)):
    monkeypatch.setattr(series_data, 'load', lambda _, array=array: (labels, array, columns))
    scaled[name] = _task()._scaled()
  np.testing.assert_allclose(scaled['changed'][:end], scaled['real'][:end])
  assert not np.allclose(scaled['changed'][end:], scaled['real'][end:])
  np.testing.assert_allclose(scaled['real'][:end].mean(0), 0.0, atol=1e-9)
  np.testing.assert_allclose(scaled['real'][:end].std(0), 1.0, atol=1e-9)


def test_baselines_against_a_direct_computation():
  """z_t = t: the naive forecast misses target h by h + 1; the seasonal one (one season back) by
  exactly the season, whenever the horizon is within one season."""
  task = _task(horizon=6)
  _with_series(task, np.arange(task._series.shape[0], dtype=np.float64)[:, None])
  batch = task.batch(0, 0, 'eval', 8, length=52)
  sums = task.host_metrics(batch)
  summary = task.summarize(dict(sums, loss_sum=0.0, squared_error_sum=0.0, absolute_error_sum=0.0,
                                weight_sum=batch['weights'].sum()))
  assert summary['naive_mae'] == pytest.approx(np.mean(np.arange(1, 7)))
  assert summary['seasonal_naive_mae'] == pytest.approx(SEASONS['co2'])


@pytest.mark.parametrize('eval_batches', [11, 3])
def test_evaluation_covers_every_window_once_and_pads_with_zero_weight(eval_batches):
  """11 x 32 >= the 337 eval windows: each is scored exactly once and the last batch is padded with
  zero-weight rows; with 3 x 32 an even spread of 96 distinct windows is scored."""
  task = _task(eval_batches=eval_batches)
  windows = task.windows('eval', 52)
  seen, padding = [], 0
  for index in range(eval_batches):
    chosen, weights = task._evaluation_windows('eval', 52, index, 32)
    seen += [tuple(w) for w, weight in zip(chosen, weights) if weight > 0]
    padding += int(np.sum(weights == 0))
  assert len(seen) == len(set(seen)) == min(len(windows), eval_batches * 32)
  assert set(seen) <= set(map(tuple, windows))
  if eval_batches == 11:
    assert len(windows) == 337 and padding == 11 * 32 - 337
  else:
    times = sorted(t for _, t in seen)
    assert times[0] == windows[0, 1] and times[-1] == windows[-1, 1]  # spread end to end


def test_evaluation_padding_leaves_the_targets_alone():
  task = _task()
  batch = task.batch(0, 0, 'eval', 4, length=52)
  padded = evaluation.pad_batch(batch, fixed_width_keys=task.fixed_width_keys)
  assert padded['inputs'].shape[1] == 64 and padded['valid'][:, 52:].sum() == 0
  assert padded['targets'].shape == batch['targets'].shape


@pytest.mark.parametrize('change,message', [
    ({'task.dataset': 'weather'}, "task.dataset: got 'weather'; valid for forecast: sunspots, co2, stocks"),
    ({'task.min_length': 20}, 'at least the season 52 of co2'),
    ({'task.eval_lengths': (52, 4000)}, 'leaves no train window of co2'),
    ({'task.horizon': 0}, 'task.horizon: got 0; valid: a positive number'),
    ({'task.patch_length': 8}, 'task.min_length: got 52; valid: multiples of task.patch_length=8'),
    ({'task.patch_length': 4, 'task.eval_lengths': (64, 210)},
     'task.eval_lengths: got (64, 210); valid: multiples of task.patch_length=4'),
    ({'task.patch_length': 0}, 'task.patch_length: got 0'),
    ({'task.model_kind': 'decoder_only'}, "task.model_kind: got 'decoder_only'; valid: encoder_only"),
])
def test_bad_forecast_settings_name_the_field(change, message):
  config = forecast_config.get_config()
  for key, value in change.items():
    section, field = key.split('.')
    config[section][field] = value
  with pytest.raises(settings.ConfigError, match=message.replace('(', r'\(').replace(')', r'\)')):
    settings.from_config_dict(config, jax.device_count())


@pytest.mark.slow
def test_a_learned_table_covers_every_evaluation_with_the_cls_token_in_front(tmp_path):
  """A window of 100 is padded for evaluation to at most 127 values, so that with [CLS] in front it
  fits the 128 rows of a learned table (padded to 128, the model saw 129 positions and failed)."""
  config = with_overrides(forecast_config.get_config('sunspots'), {
      'model.position.kind': 'learned', 'model.pooling': 'cls', 'model.position.max_length': 128,
      'task.eval_lengths': (16, 100),
      'task.eval_batches': 1, 'train.steps': 2, 'train.eval_every': 2, 'model.model_dim': 16,
      'model.feed_forward_dim': 32, 'train.batch_size': 8})
  experiment = settings.from_config_dict(config, jax.device_count())
  assert settings.evaluation_width_cap(experiment) == 127
  records = trainer.run(experiment, str(tmp_path))
  assert np.isfinite(records[100]['mae'])


def test_every_series_loads_and_a_missing_one_is_named(tmp_path):
  for name in ('sunspots', 'co2', 'stocks'):
    labels, values, columns = series_data.load(name)
    assert len(labels) == len(values) and values.shape[1] == len(columns) and np.all(np.isfinite(values))
  assert series_data.load('stocks')[1].shape == (3270, 3)
  with pytest.raises(DataError, match='weather: no such series'):
    series_data.load('weather')


def test_the_task_is_registered():
  assert TASKS['forecast'] is Forecast
