"""Translation, Spanish to English, on the verse-aligned Bible: an encoder-decoder over a joint
4,000-piece byte-pair vocabulary, trained on verses of up to 32 pieces and evaluated on the held-out
books in buckets of source length up to 96 pieces (experiments/tasks/translation.py).

Command:  python -m experiments.train --config=configs/translation.py --workdir=runs/translation
          then BLEU and chrF per bucket, greedy and beam search:
          python -m experiments.translate --workdir=runs/translation [--beam=4]
          any variant: --config.model.position.kind=rope
CPU time: 22 minutes on a 2-core machine beside one other run (2,000 steps, 2 + 2 layers, 128
          wide); experiments.translate then takes about 1.5 minutes (greedy and beam 4 through the
          decoder's cache; about 15 without it).
Expected (measured, seed 0, sinusoidal, the held-out 'eval' books, 345 verses; greedy / beam 4):
          BLEU 24.4 / 33.0 on sources of up to 16 pieces (16 verses), 16.8 / 17.8 up to 32 (the
          training lengths), then 12.7 / 12.7 up to 48, 9.8 / 9.5 up to 64, 5.3 / 7.4 up to 96; all
          verses 13.0 / 13.3 BLEU, chrF 33.1 / 32.7; the copy baseline (the Spanish as the
          translation) scores 0.1-0.9 BLEU
"""

from configs import base


def get_config():
  config = base.for_real_data(base.get_base_config())
  config.task.name = 'translation'
  config.task.model_kind = 'encoder_decoder'
  config.task.dataset = 'bible_es_en'
  config.task.min_length = 1
  config.task.max_length = 32  # source pieces; half of the training verses
  config.task.eval_lengths = (16, 32, 48, 64, 96)
  config.task.eval_batches = 4
  config.model.model_dim = 128
  config.model.feed_forward_dim = 512
  config.model.position.max_length = 256
  config.train.steps = 2000
  config.train.learning_rate = 2e-3
  config.train.label_smoothing = 0.1
  return config
