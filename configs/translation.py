"""Translation, Spanish to English, on the verse-aligned Bible: an encoder-decoder over a joint
4,000-piece byte-pair vocabulary, trained on verses of up to 32 pieces and evaluated on the held-out
books in buckets of source length up to 96 pieces (experiments/tasks/translation.py).

Command:  python -m experiments.train --config=configs/translation.py --workdir=runs/translation
          then BLEU and chrF per bucket, greedy and beam search:
          python -m experiments.translate --workdir=runs/translation [--beam=4]
          any variant: --config.model.position.kind=rope
CPU time: 50 minutes on a 2-core machine shared with two other runs (2,000 steps, 2 + 2 layers,
          128 wide); experiments.translate then takes 15 minutes (greedy and beam 4, no cache).
Expected (measured, seed 0, sinusoidal, the held-out 'eval' books, 345 verses; greedy / beam 4; before
          five chapters were realigned in 22ada03, among them the ten 'eval' verses of Jonah 2):
          BLEU 24.9 / 27.0 on sources of up to 16 pieces, 15.7 / 16.7 up to 32 (the training
          lengths), then 12.8 / 12.5 up to 48, 9.8 / 8.6 up to 64, 8.1 / 6.9 up to 96; all verses
          13.1 / 12.7 BLEU, chrF 32.4 / 32.0; the copy baseline (the Spanish as the translation)
          scores 0.1-0.8 BLEU
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
