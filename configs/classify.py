"""Sentence classification through a [CLS] token on an encoder-only Transformer: which of four plays
(Julius Caesar, Much Ado About Nothing, Richard III, Othello) a speech comes from, read as
characters; beside a bag-of-characters naive Bayes baseline on the same speeches
(experiments/tasks/classify.py). Trained on speeches cut to 64 characters, evaluated on the
held-out speeches cut to 32 .. 512.

Command:  python -m experiments.train --config=configs/classify.py --workdir=runs/classify
          any variant: --config.model.position.kind=tupe_a (its [CLS] reset applies here);
          LSTM baseline: --config.model.architecture=lstm
CPU time: 9 minutes on a 2-core machine shared with two other runs (1,500 steps, 2 layers, 64 wide).
Expected (measured, seed 0, rope, the default here; 398 held-out speeches, so one standard error is
          about 0.025): accuracy 0.553 at 64 characters against 0.440 for the bag of characters
          (chance 0.25), and above it at every length: 0.430 / 0.510 / 0.497 / 0.492 at 32 / 128 /
          256 / 512 (baseline 0.389 / 0.460 / 0.467 / 0.477). Sinusoidal, the default before:
          0.538 at 64, below the baseline beyond it (0.455 / 0.450 / 0.462). Every variant and the
          LSTM: python -m experiments.compare --config=configs/classify.py --positions=all
          --baselines=lstm --workdir=runs/compare-classify (docs/results.md)
"""

from configs import base


def get_config():
  config = base.for_real_data(base.get_base_config())
  config.task.name = 'classify'
  config.task.model_kind = 'encoder_only'
  config.task.dataset = 'shakespeare_plays'
  config.task.max_length = 64
  config.task.eval_lengths = (32, 64, 128, 256, 512)
  config.task.eval_batches = 7  # 7 x 64 covers the 398 held-out speeches
  config.model.position.kind = 'rope'  # above the baseline at every length; sinusoidal is not (docstring)
  config.model.position.max_length = 1024
  config.train.steps = 1500
  return config
