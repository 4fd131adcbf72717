"""Knowledge tracing in the SAINT design (Choi et al. 2020): will a test-taker answer the next item
of the Swedish SAT correctly? Items into the encoder, the past responses into the decoder, with
encoder and decoder aligned step by step (experiments/tasks/tracing.py); AUC and accuracy on the
held-out test-takers beside the per-item difficulty baseline. Trained on whole tests (80 items),
evaluated with 10, 20, 40 and 80 items of history per chunk.

Command:  python -m experiments.train --config=configs/tracing.py --workdir=runs/tracing
          the verbal part: --config.task.dataset=verb; any variant: --config.model.position.kind=rope
CPU time: about 20 minutes on a 2-core machine shared with three other runs (1,000 steps, 2 + 2
          layers, 64 wide; 5,120 responses per step).
Expected (measured, held-out test-takers, seeds 0 and 1, ALiBi, the default here): AUC 0.688 / 0.716
          / 0.736 / 0.758 with 10 / 20 / 40 / 80 items of history per chunk (the two seeds within
          0.002), accuracy 0.695 at 80; the per-item difficulty baseline 0.636 (accuracy 0.614 at
          80): more history, better predictions. Sinusoidal (the default before): 0.662 / 0.698 /
          0.720 / 0.755 (seed 0) and 0.650 / 0.680 / 0.718 / 0.755 (seed 1): ALiBi, whose
          attention favours recent responses, is ahead with short histories and level at 80.
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
  config.model.position.kind = 'alibi'  # ahead of sinusoidal with short histories (docstring)
  config.train.steps = 1000
  return config
