"""Multi-step time-series forecasting with an encoder-only model, as practitioners set it up.

A window of the W most recent values x_{t-W} .. x_{t-1} goes in (W drawn from [task.min_length,
task.max_length] in training, fixed per evaluation length); the next H = task.horizon values come
out, as H regression outputs of the pooled encoder (the newest value's state, [CLS] or mean).

  splits      chronological: the first 70% of the time axis trains, the next 15% evaluates ('eval'),
              the last 15% tests. A window belongs to the split that holds all its targets; its
              inputs are the past before them (which may lie in an earlier split, never a later one).
  scaling     per column, z = (f(x) - mean) / std with mean and std fitted on the training span only
              (f = log for prices, identity otherwise).
  patches     with task.patch_length = P > 1 each token carries P consecutive values (PatchTST, Nie et
              al. 2023): W / P tokens of P features, the last patch ending at x_{t-1}; every window
              length is then a multiple of P, and positions count patches.
  relative    inputs and targets are changes from the last input: z_{t-W+i} - z_{t-1} in, z_{t+h} -
              z_{t-1} out for h = 0 .. H-1, so a trending level never leaves the training range and
              predicting 0 is the naive forecast (instance normalisation, as in RevIN, Kim et al.
              2022, without the scale); the loss is the mean squared error.
  metrics     MSE and MAE in z units on every target of the split, beside the naive (last value) and
              seasonal-naive (the value one season before) forecasts of the same windows.
"""

import functools

import jax.numpy as jnp
import numpy as np

from experiments.data import series as series_data
from experiments.data.manifest import DataError
from experiments.tasks.base import SPLITS, Task, batch_rng, evaluation_rows

SPLIT_FRACTIONS = {'train': (0.0, 0.7), 'eval': (0.7, 0.85), 'test': (0.85, 1.0)}
SEASONS = {'sunspots': 11, 'co2': 52, 'stocks': 5}  # years of the solar cycle; weeks; trading days
LOG_SCALED = ('stocks',)


class Forecast(Task):
  model_kinds = ('encoder_only',)
  fixed_width_keys = ('targets', 'weights', 'seasonal')
  headline_metric = 'mae'

  @property
  def vocab_size(self) -> int:
    return 1  # no tokens: the model reads float features

  @property
  def model_fields(self) -> dict:
    return dict(input_features=self.settings.patch_length, num_outputs=self.settings.horizon)

  @property
  def season(self) -> int:
    return SEASONS[self.settings.dataset]

  def validate(self):
    settings = self.settings
    if settings.dataset not in SEASONS:
      return f'task.dataset: got {settings.dataset!r}; valid for forecast: {", ".join(SEASONS)}'
    if settings.horizon < 1:
      return f'task.horizon: got {settings.horizon}; valid: a positive number of steps to forecast'
    shortest = min(settings.min_length, *settings.eval_lengths)
    if shortest < self.season:
      return (f'task.min_length/task.eval_lengths: got a window of {shortest}; valid: at least the season '
              f'{self.season} of {settings.dataset}, which the seasonal-naive baseline looks back')
    patch = settings.patch_length
    for field in ('min_length', 'max_length', 'eval_lengths'):
      value = getattr(settings, field)
      if np.any(np.asarray(value) % patch):
        return (f'task.{field}: got {value}; valid: multiples of task.patch_length={patch} (whole patches), '
                f'or task.patch_length=1')
    try:
      scaled = self._scaled()
    except DataError as error:
      return str(error)
    for split in SPLITS:
      if not len(self.windows(split, max(settings.max_length, *settings.eval_lengths))):
        return (f'task.max_length/task.eval_lengths: a window of {max(settings.max_length, *settings.eval_lengths)} '
                f'leaves no {split} window of {settings.dataset} ({scaled.shape[0]} steps); valid: shorter windows')
    return None

  @functools.cached_property
  def _series(self) -> np.ndarray:
    return self._scaled()

  def _scaled(self) -> np.ndarray:
    """T x C z-scores, with mean and std from the training span only."""
    _, values, _ = series_data.load(self.settings.dataset)
    transformed = np.log(values) if self.settings.dataset in LOG_SCALED else values
    train_end = self.boundaries('train', len(values))[1]
    mean, std = transformed[:train_end].mean(0), transformed[:train_end].std(0)
    return (transformed - mean) / std

  @staticmethod
  def boundaries(split: str, steps: int) -> tuple[int, int]:
    start, end = SPLIT_FRACTIONS[split]
    return int(round(start * steps)), int(round(end * steps))

  def windows(self, split: str, window: int) -> np.ndarray:
    """(column, t) of every forecast whose targets t .. t+H-1 lie in the split and whose window
    t-W .. t-1 starts at or after time 0: N x 2."""
    steps, columns = self._series.shape
    start, end = self.boundaries(split, steps)
    first_target = np.arange(max(start, window), end - self.settings.horizon + 1)
    return np.stack(np.broadcast_arrays(np.arange(columns)[:, None], first_target[None]), -1).reshape(-1, 2)

  def sequence_length(self, length: int) -> int:
    return length // self.settings.patch_length + 1  # the patches and the [CLS] token

  def batch(self, seed, step, split, batch_size, length=None):
    settings = self.settings
    rng = batch_rng(seed, split, step, length or 0)
    patch = settings.patch_length
    if length is None:
      sizes = patch * rng.integers(settings.min_length // patch, settings.max_length // patch + 1, size=batch_size)
      candidates = self.windows(split, settings.max_length)
      chosen = candidates[rng.integers(0, len(candidates), size=batch_size)]
      weights = np.ones(batch_size, np.float32)
      padded = settings.max_length
    else:
      sizes = np.full(batch_size, length)
      chosen, weights = self._evaluation_windows(split, length, step, batch_size)
      padded = length
    horizon = settings.horizon
    inputs = np.zeros((batch_size, padded // patch, patch), np.float32)
    valid = np.zeros((batch_size, padded // patch), bool)
    targets = np.zeros((batch_size, horizon), np.float32)
    seasonal = np.zeros((batch_size, horizon), np.float32)
    for b, ((column, t), size) in enumerate(zip(chosen, sizes)):
      values = self._series[:, column]
      last = values[t - 1]
      inputs[b, :size // patch] = (values[t - size:t] - last).reshape(size // patch, patch)
      valid[b, :size // patch] = True
      targets[b] = values[t:t + horizon] - last
      lags = self.season * np.ceil((np.arange(horizon) + 1) / self.season).astype(int)  # one season back, in the window
      seasonal[b] = values[t + np.arange(horizon) - lags] - last
    weights = np.broadcast_to(weights[:, None], (batch_size, horizon)).astype(np.float32)
    return dict(inputs=inputs, valid=valid, targets=targets, weights=weights, seasonal=seasonal)

  def _evaluation_windows(self, split, length, index, batch_size):
    """Batch `index` of the split's windows (tasks.base.evaluation_rows)."""
    candidates = self.windows(split, length)
    rows, weights = evaluation_rows(len(candidates), self.settings.eval_batches, batch_size, index)
    return candidates[rows], weights

  def model_inputs(self, batch):
    return (batch['inputs'],), dict(valid_BxL=batch['valid'])

  def loss_and_metrics(self, outputs_BxH, batch, label_smoothing=0.0):
    del label_smoothing
    error = (outputs_BxH.astype(jnp.float32) - batch['targets']) * (batch['weights'] > 0)
    return dict(loss_sum=jnp.sum(error ** 2), squared_error_sum=jnp.sum(error ** 2),
                absolute_error_sum=jnp.sum(jnp.abs(error)), weight_sum=jnp.sum(batch['weights']))

  def host_metrics(self, batch):
    sums = {}
    for name, forecast in (('naive', np.zeros_like(batch['targets'])), ('seasonal', batch['seasonal'])):
      error = (forecast - batch['targets']) * (batch['weights'] > 0)
      sums[f'{name}_squared_error_sum'] = float(np.sum(error.astype(np.float64) ** 2))
      sums[f'{name}_absolute_error_sum'] = float(np.sum(np.abs(error.astype(np.float64))))
    return sums

  def summarize(self, sums):
    weight = max(float(sums['weight_sum']), 1.0)
    summary = dict(loss=float(sums['loss_sum']) / weight, mse=float(sums['squared_error_sum']) / weight,
                   mae=float(sums['absolute_error_sum']) / weight)
    for name, label in (('naive', 'naive'), ('seasonal', 'seasonal_naive')):
      if f'{name}_squared_error_sum' in sums:
        summary[f'{label}_mse'] = float(sums[f'{name}_squared_error_sum']) / weight
        summary[f'{label}_mae'] = float(sums[f'{name}_absolute_error_sum']) / weight
    return summary
