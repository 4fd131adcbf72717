"""Time-series forecasting with an encoder-only Transformer: a window of past values in, the next
task.horizon values out; chronological splits, scaling fitted on the training span only, MSE and
MAE against the naive (last value) and seasonal-naive forecasts (experiments/tasks/forecast.py).

Command:  python -m experiments.train --config=configs/forecast.py --workdir=runs/forecast
          series (configs/forecast.py:<series>): co2 (weekly, 2,284; the default), sunspots (yearly,
          309), stocks (daily AAPL, IBM, MSFT, 3,270)
          LSTM baseline: --config.model.architecture=lstm; any variant: --config.model.position.kind=t5
          every variant and the LSTM: python -m experiments.compare --config=configs/forecast.py
          --positions=all --baselines=lstm --workdir=runs/compare-forecast (docs/results.md)
CPU time: co2 (2,000 steps, 2 layers, 64 wide) about 5 minutes alone on a 2-core machine, 6 beside
          one other run; sunspots and stocks (1,000 steps, shorter windows) 2.5 minutes beside two.
Expected (measured, rope with 'last' pooling, the defaults here; held-out 'eval' span, MAE in z units):
          co2       three seeds: 0.0403 +- 0.0004 at a 64-week window and 0.0401 +- 0.0007 at 104 (the
                    training windows are 52-104), against 0.117 seasonal-naive and 0.253 naive; at
                    208 and 416 weeks, beyond the training windows, 0.104 +- 0.045 and 0.169 +- 0.026.
                    The LSTM baseline at the same budget: 0.0424 +- 0.0001 / 0.0417 +- 0.0007, then
                    0.044 +- 0.001 / 0.061 +- 0.025 (docs/results.md).
          sunspots  MAE 0.69 at 32 years against 0.68 seasonal-naive (11 years back) and 1.59 naive:
                    with 176 training windows the model does not beat the seasonal baseline
          stocks    MAE 0.0792 at 32 days, 5 days ahead, against 0.0788 naive and 0.106 seasonal-naive; every
                    variant and the LSTM within 0.0018 of naive and none below it: daily prices are
                    close to a random walk
"""

from configs import base

# Per series: the season of the seasonal-naive baseline is fixed by the task (11 years, 52 weeks,
# 5 trading days); training windows of min_length..max_length values, evaluated at eval_lengths.
SERIES = {
    'sunspots': dict(horizon=8, min_length=12, max_length=32, eval_lengths=(16, 32, 64, 128)),
    'co2': dict(horizon=26, min_length=52, max_length=104, eval_lengths=(64, 104, 208, 416)),
    'stocks': dict(horizon=5, min_length=8, max_length=32, eval_lengths=(16, 32, 64, 128)),
}
# Optimisation steps per series: co2 gained from 2,000 (RoPE and the LSTM alike, docstring); the
# budgets of the small sunspots and the near-random-walk stocks stay where they were measured.
STEPS = {'sunspots': 1000, 'co2': 2000, 'stocks': 1000}


def get_config(series: str = 'co2'):
  if series not in SERIES:
    raise ValueError(f'configs/forecast.py:{series}: unknown series; valid: {", ".join(SERIES)}')
  config = base.for_real_data(base.get_base_config())
  config.task.name = 'forecast'
  config.task.model_kind = 'encoder_only'
  config.task.dataset = series
  for field, value in SERIES[series].items():
    config.task[field] = value
  config.task.eval_batches = 8
  config.model.position.kind = 'rope'  # measured better than sinusoidal here (docstring)
  config.model.pooling = 'last'  # the newest value's state: its distances to the past are fixed (docstring)
  config.model.feed_forward_dim = 128
  config.model.position.max_length = 512
  config.train.steps = STEPS[series]
  return config
