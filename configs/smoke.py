"""Smoke test: a tiny copy model that trains in seconds. Used by the tests.

Command:  python -m experiments.train --config=configs/smoke.py --workdir=/tmp/smoke
CPU time: about 10 seconds on a 2-core laptop, most of it compilation.
Expected: the training loss falls from about 3.8 at step 5 to about 3.0 at step 20; accuracy
          is not the point.
"""

from configs import base


def get_config():
  config = base.get_base_config()
  config.task.vocab_size = 8
  config.task.max_length = 6
  config.task.eval_lengths = (6, 12)
  config.task.eval_batches = 1
  config.model.model_dim = 32
  config.model.num_heads = 2
  config.model.feed_forward_dim = 64
  config.model.num_encoder_layers = 1
  config.model.num_decoder_layers = 1
  config.model.position.max_length = 32
  config.train.steps = 20
  config.train.batch_size = 16
  config.train.warmup_steps = 5
  config.train.log_every = 5
  config.train.eval_every = 10
  config.train.checkpoint_every = 10
  return config
