"""Character-level language model on Shakespeare, held out by work; bits per character at the
training context (128) and at 2x, 4x and 8x it, the shape of the ALiBi paper's Figure 1. Every
window starts with a BOS token (the first character is not scored).

Command:  python -m experiments.train --config=configs/shakespeare.py --workdir=runs/shakespeare
          (any variant: --config.model.position.kind=alibi)
CPU time: 15-26 minutes on a 2-core machine shared with two to four other runs (1,200 steps of a
          2-layer, 128-wide decoder; Shaw the slowest).
Fine-tuning at 512 from a finished run, with a context extension of RoPE (configs/shakespeare.py:extend):
          python -m experiments.train --config=configs/shakespeare.py:extend --workdir=runs/rope-yarn-512 \
              --config.train.init_from=runs/shakespeare --config.model.position.rope_extension=yarn \
              --config.model.position.extension_factor=16
          (200 steps of 8 windows of 512: the tokens of 800 steps at 128; original_length is the 128 trained at).
Retrieval (configs/shakespeare.py:passkey): a 3-layer decoder trained at 256 for 2,400 steps with nine in ten
          training rows passkey prompts and their answers (task.passkey_fraction), then probed beyond it:
          python -m experiments.evaluate --workdir=RUN --probe=passkey --lengths=256,512,1024,2048
          and fine-tuned from such a run at 512 as :extend does, passkey rows kept (configs/shakespeare.py:passkey_extend,
          original_length 256).
Expected (measured, seed 0): 2.42-2.68 bits per character on the held-out plays at context 128 for
          every variant but NoPE (2.96), against 3.61 (bigram) and 4.78 (unigram) on the same
          positions; at 1024 ALiBi (2.52) and Shaw (2.46) stay flat while the absolute and TUPE
          encodings exceed 4.5."""

from configs import base


def get_config(stage: str = 'train'):
  if stage not in ('train', 'extend', 'passkey', 'passkey_extend'):
    raise ValueError(f'configs/shakespeare.py:{stage}: unknown stage; valid: train, extend, passkey, passkey_extend')
  config = base.get_base_config()
  config.task.name = 'shakespeare'
  config.task.max_length = 128
  config.task.eval_lengths = (128, 256, 512, 1024)
  config.task.eval_batches = 4
  config.model.model_dim = 128
  config.model.num_heads = 4
  config.model.feed_forward_dim = 512
  config.model.num_decoder_layers = 2
  config.model.position.max_length = 1024
  config.train.steps = 1200
  config.train.batch_size = 32
  config.train.learning_rate = 3e-3
  config.train.warmup_steps = 200
  config.train.log_every = 100
  config.train.eval_every = 600
  config.train.checkpoint_every = 600
  if stage in ('passkey', 'passkey_extend'):
    config.task.max_length = 256
    config.task.eval_lengths = (256, 512, 1024, 2048)
    config.task.passkey_fraction = 0.9
    config.model.num_decoder_layers = 3
    config.model.position.max_length = 2048
    config.train.steps = 2400
    config.train.batch_size = 16
    config.train.eval_every = 2400
    config.train.checkpoint_every = 1200
  if stage in ('extend', 'passkey_extend'):
    config.task.max_length = 512
    config.task.eval_lengths = (512,)
    config.task.eval_batches = 2
    config.model.position.kind = 'rope'
    config.model.position.original_length = 256 if stage == 'passkey_extend' else 128
    config.train.steps = 200
    config.train.batch_size = 8
    config.train.learning_rate = 1e-3
    config.train.schedule = 'warmup_cosine'
    config.train.warmup_steps = 20
    config.train.log_every = 50
    config.train.eval_every = 200
    config.train.checkpoint_every = 100
  return config
