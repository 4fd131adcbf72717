"""Language modelling on a prepared corpus (experiments/prepare_corpus.py), scored in bits per byte on
held-out documents at the training length (256) and at 2x, 4x and 8x it.

Command:  python -m experiments.train --config=configs/corpus.py --workdir=runs/corpus
          (your own text: python -m experiments.prepare_corpus --input=DIR --output=corpora/mine, then
          --config.task.path=corpora/mine; any variant: --config.model.position.kind=alibi)
"""

import os

from configs import base

# The shipped corpus (experiments/data/prepare_default_corpus.py), found from this file wherever it runs.
SHIPPED = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'experiments', 'data',
                                        'corpus'))


def get_config():
  config = base.get_base_config()
  config.task.name = 'corpus'
  config.task.path = SHIPPED
  config.task.packing = 'stream'
  config.task.max_length = 256
  config.task.eval_lengths = (256, 512, 1024, 2048)
  config.task.eval_batches = 4
  config.model.model_dim = 128
  config.model.num_heads = 4
  config.model.feed_forward_dim = 512
  config.model.num_decoder_layers = 2
  config.model.position.max_length = 2048
  config.train.steps = 1000
  config.train.batch_size = 16
  config.train.learning_rate = 2e-3
  config.train.warmup_steps = 100
  config.train.schedule = 'warmup_cosine'
  config.train.log_every = 100
  config.train.eval_every = 500
  config.train.checkpoint_every = 500
  return config
