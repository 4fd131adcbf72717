"""Algorithmic length generalisation with a decoder-only Transformer: trained on sizes up to L,
evaluated up to 4L, with token and whole-sequence accuracy per length.

Command:  python -m experiments.train --config=configs/algorithmic.py:<task> --workdir=runs/<task>
          task: copy, reverse, sort, addition, parity, recall
          any variant: --config.model.position.kind=rope (a key of transformer.VARIANTS, listed in the
          README under "The variants"); encoder-decoder: --config.task.model_kind=encoder_decoder
CPU time: about 4 minutes per run on a 2-core machine (2,000 steps of a 3-layer, 64-wide model);
          parity about 1 minute; addition (4,000 steps, 128 wide) 14-17 minutes and recall (8,000
          steps, 128 wide, 8 heads) 58 minutes, each beside two to four other runs.
Expected (measured, seed 0, token accuracy at the training size L, whole sequences in brackets;
          docs/results.md holds the tables for copy, reverse and addition):
          copy     1.000 for all nine variants of 2017-2022 (1.000; tupe_r 0.992); greedy decoding exact on
                   0.998-1.000 of sizes 1-16 (python -m experiments.exact_match); beyond L ALiBi
                   keeps 0.97 at 1.5L, the others 0.10-0.79
          reverse  1.000 for all nine of 2017-2022 (1.000; tupe_r 0.992); at 1.5L at most 0.66 (rope)
          sort     none 1.000 (still 0.97 at 4L), sinusoidal 1.000 (0.68 at 4L), rope 1.000 (0.99; 0.34 at 4L)
          parity   1.000 (1.00) for none, sinusoidal and rope; beyond L 0.67-0.88
          addition none, sinusoidal and rope 1.000 (1.00); beyond L at most 0.31 (none at 12
                   digits)
          recall   (8 heads of 16, 8,000 steps) none 0.991 (0.92; 1.000 at L/2), sinusoidal 1.000
                   (1.00; 0.71 at 1.5L), rope 1.000 (1.00; 0.91 at 2L)
"""

from configs import base

# Per task: training sizes up to max_length (L), evaluation sizes up to 4L.
TASKS = {
    'copy': dict(vocab_size=16, max_length=16, eval_lengths=(8, 16, 24, 32, 48, 64)),
    'reverse': dict(vocab_size=16, max_length=16, eval_lengths=(8, 16, 24, 32, 48, 64)),
    'sort': dict(vocab_size=16, max_length=16, eval_lengths=(8, 16, 24, 32, 48, 64)),
    'addition': dict(vocab_size=10, max_length=8, eval_lengths=(4, 8, 12, 16, 24, 32)),
    'parity': dict(vocab_size=2, max_length=8, eval_lengths=(4, 8, 12, 16, 24, 32)),
    'recall': dict(vocab_size=32, max_length=8, eval_lengths=(4, 8, 12, 16, 24, 32)),
}
# Addition and recall need the width, and NoPE the steps. Addition at 64 wide (2,000 steps, lr 3e-3):
# none 0.53, sinusoidal 0.48 (6,000 steps: sinusoidal 1.000, none still 0.45); at 128 wide with lr
# 1e-3 and 4,000 steps none, sinusoidal and rope all reach 1.000. Recall at 64 wide: rope stayed near
# 0.6 through 3,500 steps; at 128 rope reaches 1.000 by step 600 and none 0.98 by step 3,000.
WIDE = {'model.model_dim': 128, 'model.feed_forward_dim': 512, 'train.learning_rate': 1e-3,
        'train.eval_every': 1000, 'train.checkpoint_every': 1000}
# Recall with sinusoidal positions and 4 heads of 32 stayed at 0.53 (seed 0) on a shortcut that needs
# no induction head (the last query's value is the one value not yet recalled); with 8 heads of 16
# it learns, while NoPE then needs the steps (seed 0, token accuracy at L: 0.895 after 3,000 steps,
# 0.977 after 5,000, 0.991 after 8,000).
CHANGES = {'addition': dict(WIDE, **{'train.steps': 4000}),
           'recall': dict(WIDE, **{'train.steps': 8000, 'model.num_heads': 8, 'train.eval_every': 2000,
                                   'train.checkpoint_every': 2000})}


def get_config(task: str = 'copy'):
  if task not in TASKS:
    raise ValueError(f'configs/algorithmic.py:{task}: unknown task; valid: {", ".join(TASKS)}')
  config = base.get_base_config()
  config.task.name = task
  config.task.min_length = 1
  for field, value in TASKS[task].items():
    config.task[field] = value
  config.task.eval_batches = 2
  config.model.num_decoder_layers = 3  # NoPE needs the third layer to learn copy at L=16
  config.model.num_encoder_layers = 3
  config.model.position.max_length = 256
  config.train.steps = 2000
  config.train.batch_size = 64
  config.train.learning_rate = 3e-3
  config.train.warmup_steps = 100
  config.train.schedule = 'warmup_cosine'  # decaying to 0 makes greedy copy exact (rsqrt: 0.90-0.98)
  config.train.log_every = 100
  config.train.eval_every = 1000
  config.train.checkpoint_every = 1000
  for field, value in CHANGES.get(task, {}).items():
    section, name = field.split('.')
    config[section][name] = value
  return config
