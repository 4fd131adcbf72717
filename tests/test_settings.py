"""Config validation in process: every bad value is a ConfigError of one line naming the field, the
value and what is valid. (tests/test_robustness.py checks that the command line turns it into exit
code 2 with that line, writing nothing.)"""

import math

import pytest

from configs import base, smoke
from experiments.runs import settings
from tests.helpers import with_overrides

BAD_VALUES = [  # (overrides on configs/smoke.py, what the one line must say); 8 devices
    ({'train.steps': 0}, 'train.steps: got 0; valid: a positive number'),
    ({'train.steps': -5}, 'train.steps: got -5; valid: a positive number'),
    ({'train.batch_size': 0}, 'train.batch_size: got 0; valid: a positive number'),
    ({'model.model_dim': 0}, 'model.model_dim: got 0; valid: a positive integer'),
    ({'model.feed_forward_dim': -1}, 'model.feed_forward_dim: got -1; valid: a positive integer'),
    ({'model.num_heads': 3}, 'model.num_heads: got 3; valid: a divisor of model_dim=32'),
    ({'model.position.kind': 'fourier'}, "model.position.kind: got 'fourier'; valid: alibi, learned"),
    ({'task.name': 'tetris'}, "task.name: got 'tetris'; valid: addition, classify, copy"),
    ({'task.model_kind': 'encoder_only'}, "task.model_kind: got 'encoder_only'; valid: decoder_only"),
    ({'model.position.kind': 'learned', 'model.position.max_length': 20},
     'model.position.max_length: got 20; valid: at least 26'),
    ({'train.batch_size': 12}, 'train.batch_size: got 12; valid: a multiple of the device count 8'),
    ({'parallel': 'fsdp'}, "parallel: got 'fsdp'; valid: pmap, mesh"),
    ({'model.norm': 'middle'}, "model.norm: got 'middle'; valid: post, pre"),
    ({'model.activation': 'swish'}, "model.activation: got 'swish'; valid: relu, gelu"),
    ({'model.dropout_rate': 1.5}, 'model.dropout_rate: got 1.5; valid: a rate in [0, 1)'),
    ({'train.label_smoothing': 1.0}, 'train.label_smoothing: got 1.0; valid: a number in [0, 1)'),
    ({'train.schedule': 'cosine'}, "train.schedule: got 'cosine'; valid: warmup_rsqrt"),
    ({'task.min_length': 10}, 'task.min_length: got 10; valid: at most task.max_length=6'),
    ({'model.position.num_buckets': 7}, 'model.position.num_buckets: got 7; valid: an even number'),
    ({'model.position.rope_base': 0.5}, 'model.position.rope_base: got 0.5; valid: a number > 1'),
    # Numbers that comparisons of the form `value <= 0` let through.
    ({'train.gradient_clip': math.nan}, 'train.gradient_clip: got nan; valid: a finite number'),
    ({'train.learning_rate': math.nan}, 'train.learning_rate: got nan; valid: a finite number'),
    ({'train.learning_rate': math.inf}, 'train.learning_rate: got inf; valid: a finite number'),
    ({'train.weight_decay': -math.inf}, 'train.weight_decay: got -inf; valid: a finite number'),
    ({'model.dropout_rate': math.nan}, 'model.dropout_rate: got nan; valid: a finite number'),
    ({'model.position.rope_base': math.inf}, 'model.position.rope_base: got inf; valid: a finite number'),
    ({'train.gradient_clip': -1.0}, 'train.gradient_clip: got -1.0; valid: a positive global norm, or 0 for no'),
    ({'train.beta1': 1.5}, 'train.beta1: got 1.5; valid: a number in [0, 1)'),
    ({'train.beta1': 1.0}, 'train.beta1: got 1.0; valid: a number in [0, 1)'),
    ({'train.beta2': -0.1}, 'train.beta2: got -0.1; valid: a number in [0, 1)'),
    ({'train.epsilon': 0.0}, 'train.epsilon: got 0.0; valid: a positive number'),
    ({'seed': -1}, 'seed: got -1; valid: an integer in [0, 2147483647]'),
    ({'seed': 2**40}, 'seed: got 1099511627776; valid: an integer in [0, 2147483647]'),
    ({'task.eval_lengths': (6, 12, 6)}, 'task.eval_lengths: got (6, 12, 6), which repeats [6]; valid: each length once'),
]


@pytest.mark.parametrize('overrides,expected', BAD_VALUES, ids=[repr(o) for o, _ in BAD_VALUES])
def test_a_bad_value_is_one_line_naming_field_value_and_what_is_valid(overrides, expected):
  with pytest.raises(settings.ConfigError) as raised:
    settings.from_config_dict(with_overrides(smoke.get_config(), overrides), 8)
  assert '\n' not in str(raised.value)
  assert expected in str(raised.value), str(raised.value)


def test_the_edges_of_the_valid_ranges_are_accepted():
  config = with_overrides(smoke.get_config(), {'train.beta1': 0.0, 'train.beta2': 0.999, 'train.gradient_clip': 0.0,
                                               'seed': 2**31 - 1, 'train.epsilon': 1e-12})
  experiment = settings.from_config_dict(config, 8)
  assert experiment.seed == 2**31 - 1 and experiment.train.gradient_clip == 0.0


def test_every_float_field_of_the_base_config_refuses_nan():
  """Whatever field a later change adds: a float anywhere in the config is checked for finiteness."""
  def floats(section, prefix=''):
    for name, value in section.items():
      if hasattr(value, 'items'):
        yield from floats(value, f'{prefix}{name}.')
      elif isinstance(value, float):
        yield prefix + name
  names = list(floats(base.get_base_config()))
  assert len(names) >= 10, names
  for name in names:
    with pytest.raises(settings.ConfigError, match=f'^{name.replace(".", "[.]")}: got nan; valid: a finite number'):
      settings.from_config_dict(with_overrides(smoke.get_config(), {name: math.nan}), 8)
