"""Knowledge tracing in the SAINT design (Choi et al. 2020): will a test-taker answer the next item
of the Swedish SAT correctly? Items into the encoder, the past responses into the decoder, with
encoder and decoder aligned step by step (experiments/tasks/tracing.py); AUC and accuracy on the
held-out test-takers beside the per-item difficulty baseline. Trained on whole tests (80 items),
evaluated with 10, 20, 40 and 80 items of history per chunk.

Command:  python -m experiments.train --config=configs/tracing.py --workdir=runs/tracing
          the verbal part: --config.task.dataset=verb; any variant: --config.model.position.kind=rope
CPU time: about 20 minutes on a 2-core machine shared with three other runs (1,000 steps, 2 + 2
          layers, 64 wide; 5,120 responses per step).
Expected (measured, seed 0, sinusoidal, held-out test-takers): AUC 0.755 and accuracy 0.691 with 80
          items of history, against 0.636 and 0.614 for the per-item difficulty baseline; with 10
          items of history per chunk 0.662 / 0.618 (baseline 0.636 / 0.607): more history, better
          predictions
"""

from configs import base


def get_config():
  config = base.for_real_data(base.get_base_config())
  config.task.name = 'tracing'
  config.task.model_kind = 'encoder_decoder'
  config.task.dataset = 'quant'
  config.task.max_length = 80
  config.task.eval_lengths = (10, 20, 40, 80)
  config.task.eval_batches = 8  # 8 x 64 rows cover the 500 held-out test-takers at 80 items
  config.train.steps = 1000
  return config
