"""Algorithmic length generalisation: train on lengths 1..16, evaluate up to 64 (4x).

Command:  python -m experiments.train --config=configs/algorithmic.py:copy --workdir=runs/copy
          (tasks: copy, reverse, sort; any variant with --config.model.position.kind=rope, ...)
CPU time: about 2-3 minutes on a 2-core laptop (1,000 steps of a 2-layer, 64-wide decoder).
Expected: copy with sinusoidal positions reaches > 0.99 token accuracy at the training lengths;
          beyond them accuracy falls, how fast depending on the positional encoding.
"""

from configs import base


def get_config(task: str = 'copy'):
  config = base.get_base_config()
  config.task.name = task
  config.task.vocab_size = 16
  config.task.min_length = 1
  config.task.max_length = 16
  config.task.eval_lengths = (8, 16, 32, 64)
  config.model.position.max_length = 256
  config.train.steps = 1000
  config.train.batch_size = 64
  config.train.learning_rate = 3e-3
  config.train.warmup_steps = 100
  config.train.log_every = 50
  config.train.eval_every = 250
  config.train.checkpoint_every = 250
  return config
