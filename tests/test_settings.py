"""Config validation in process: every bad value is a ConfigError of one line naming the field, the
value and what is valid. (tests/test_robustness.py checks that the command line turns it into exit
code 2 with that line, writing nothing.)"""

import math

import jax
import jax.numpy as jnp
import pytest

import transformer
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
    ({'model.position.kind': 'fourier'}, "model.position.kind: got 'fourier'; valid: " + ', '.join(sorted(transformer.VARIANTS))),
    ({'task.name': 'tetris'}, "task.name: got 'tetris'; valid: addition, classify, copy"),
    ({'task.model_kind': 'encoder_only'}, "task.model_kind: got 'encoder_only'; valid: decoder_only"),
    ({'model.position.kind': 'learned', 'model.position.max_length': 20},
     'model.position.max_length: got 20; valid: at least 26'),
    ({'train.batch_size': 12}, 'train.batch_size: got 12; valid: a multiple of the device count 8'),
    ({'train.gradient_accumulation': 0}, 'train.gradient_accumulation: got 0; valid: a positive number'),
    ({'train.batch_size': 16, 'train.gradient_accumulation': 4},
     'train.batch_size: got 16 with train.gradient_accumulation=4 on 8 device(s); valid: a multiple of 32'),
    ({'train.eval_microbatches': 0}, 'train.eval_microbatches: got 0; valid: a positive number'),
    ({'train.batch_size': 16, 'train.eval_microbatches': 4},
     'train.eval_microbatches: got 4 with train.batch_size=16 on 8 device(s); valid: a divisor of 2'),
    ({'parallel.mode': 'fsdp'}, "parallel.mode: got 'fsdp'; valid: pmap, mesh"),
    ({'parallel.fsdp': 8}, 'parallel.fsdp: got 8 with parallel.mode=pmap, which replicates parameters; valid: 1, or '
                           'parallel.mode=mesh'),
    ({'parallel.mode': 'mesh', 'parallel.fsdp': 3},
     'parallel.fsdp: got 3 with parallel.tensor=1 on 8 device(s); valid: a divisor of 8, or -1 for all of them'),
    ({'parallel.mode': 'mesh', 'parallel.tensor': 3}, 'parallel.tensor: got 3 on 8 device(s); valid: a divisor of 8'),
    ({'parallel.mode': 'mesh', 'parallel.fsdp': 0}, 'parallel.fsdp: got 0; valid: a positive number'),
    ({'parallel.rules.embed': 'data'}, "parallel.rules.embed: got 'data'; valid: 'fsdp', 'tensor', or ''"),
    ({'model.norm': 'middle'}, "model.norm: got 'middle'; valid: post, pre"),
    ({'model.activation': 'swish'}, "model.activation: got 'swish'; valid: relu, gelu"),
    ({'model.dropout_rate': 1.5}, 'model.dropout_rate: got 1.5; valid: a rate in [0, 1)'),
    ({'train.label_smoothing': 1.0}, 'train.label_smoothing: got 1.0; valid: a number in [0, 1)'),
    ({'train.schedule': 'cosine'}, "train.schedule: got 'cosine'; valid: warmup_rsqrt"),
    ({'task.min_length': 10}, 'task.min_length: got 10; valid: at most task.max_length=6'),
    ({'model.position.kind': 't5', 'model.position.num_buckets': 7},
     'model.position.num_buckets: got 7; valid: a positive even number'),
    ({'model.position.kind': 'rope', 'model.position.rope_base': 0.5},
     'model.position.rope_base: got 0.5; valid: a number > 1'),
    ({'model.position.rope_bass': 2.0}, 'model.position.rope_bass: unknown field; valid fields of model.position: '
                                        'kind, absolute_table'),
    ({'model.position.kind': 'rope', 'model.num_heads': 8, 'model.model_dim': 24},
     'model.model_dim: got 24; valid: model_dim / num_heads even (now 3)'),
    # T5's log-spaced buckets start at num_buckets / 2 (causal): a max_distance at or below it has none.
    ({'model.position.kind': 't5', 'model.position.num_buckets': 32, 'model.position.max_distance': 16},
     'model.position.max_distance: got 16; valid: more than num_buckets / 2 = 16 in causal attention'),
    # Numbers that comparisons of the form `value <= 0` let through.
    ({'train.gradient_clip': math.nan}, 'train.gradient_clip: got nan; valid: a finite number'),
    ({'train.learning_rate': math.nan}, 'train.learning_rate: got nan; valid: a finite number'),
    ({'train.learning_rate': math.inf}, 'train.learning_rate: got inf; valid: a finite number'),
    ({'train.weight_decay': -math.inf}, 'train.weight_decay: got -inf; valid: a finite number'),
    ({'model.dropout_rate': math.nan}, 'model.dropout_rate: got nan; valid: a finite number'),
    ({'model.position.kind': 'rope', 'model.position.rope_base': math.inf},
     'model.position.rope_base: got inf; valid: a finite number'),
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
  assert len(names) >= 8, names
  for name in names:
    with pytest.raises(settings.ConfigError, match=f'^{name.replace(".", "[.]")}: got nan; valid: a finite number'):
      settings.from_config_dict(with_overrides(smoke.get_config(), {name: math.nan}), 8)


@pytest.mark.parametrize('kind', sorted(transformer.VARIANTS))
def test_every_float_setting_of_every_variant_refuses_nan(kind):
  variant = transformer.VARIANTS[kind]
  defaults = variant.settings()
  for name in variant.setting_names():
    if isinstance(getattr(defaults, name), float):
      overrides = {'model.position.kind': kind, f'model.position.{name}': math.nan}
      with pytest.raises(settings.ConfigError, match=f'^model[.]position[.]{name}: got nan; valid: a finite number'):
        settings.from_config_dict(with_overrides(smoke.get_config(), overrides), 8)


def test_a_run_reads_and_records_only_its_own_variants_settings():
  """Another variant's setting in the config is not this run's: left out of its record, not refused."""
  overrides = {'model.position.kind': 'shaw', 'model.position.rope_base': 500.0, 'model.position.clip_distance': 3}
  experiment = settings.from_config_dict(with_overrides(smoke.get_config(), overrides), 8)
  assert settings.to_dict(experiment)['model']['position'] == {'kind': 'shaw', 'clip_distance': 3, 'per_head': False,
                                                                'ssmax': False, 'ssmax_initial_scale': 0.43,
                                                                'temperature_scale': 0.0, 'temperature_floor': 8192}


def test_t5_buckets_are_checked_for_the_attention_the_model_has():
  """16 buckets: causal attention's log-spaced buckets start at distance 8, so max_distance 6 has
  none (refused); an encoder's start at 4 (accepted there, refused at 4)."""
  overrides = {'model.position.kind': 't5', 'model.position.num_buckets': 16, 'model.position.max_distance': 6}
  with pytest.raises(settings.ConfigError, match=r'model.position.max_distance: got 6; valid: more than '
                                                 r'num_buckets / 2 = 8 in causal attention .*decoder_only'):
    settings.from_config_dict(with_overrides(smoke.get_config(), overrides), 8)
  t5 = transformer.positions.t5.T5Settings(num_buckets=16, max_distance=6)
  t5.check_attention(num_heads=4, head_dim=8, causal=False)
  with pytest.raises(ValueError, match='position.max_distance: got 4; valid: more than num_buckets / 4 = 4 in '
                                       'bidirectional attention'):
    transformer.positions.t5.T5Settings(num_buckets=16, max_distance=4).check_attention(4, 8, causal=False)
  with pytest.raises(ValueError, match='position.num_buckets: got 2; valid: at least 4 in bidirectional'):
    transformer.positions.t5.T5Settings(num_buckets=2, max_distance=8).check_attention(4, 8, causal=False)


def test_a_causal_only_variant_is_refused_for_every_bidirectional_stack_and_left_out_of_all(monkeypatch):
  """A variant that declares causal_only: refused, naming the kind and the valid ones, by the library
  (an encoder's hooks) and by the run's settings (an encoder-decoder task, not
  decoder-only); compare --positions=all leaves it out of a sweep whose model has an encoder."""
  from experiments.sweeps import variants  # pylint: disable=g-import-not-at-top
  none = transformer.VARIANTS['none']
  monkeypatch.setitem(transformer.VARIANTS, 'causal_none', transformer.positions.Variant(
      none.stack, none.layer, 'a test', causal_only=True))
  position = transformer.PositionConfig('causal_none')
  position.check_attention(4, 8, causal=True)
  with pytest.raises(ValueError, match="^position.kind: got 'causal_none'; valid: in bidirectional attention "
                                       r'\(an encoder\) one of none, .*; causal_none is causal only$'):
    position.check_attention(4, 8, causal=False)
  with pytest.raises(ValueError, match='causal_none is causal only'):
    model = transformer.EncoderOnly(transformer.tiny_preset(position))
    model.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))
  overrides = {'model.position.kind': 'causal_none'}
  settings.from_config_dict(with_overrides(smoke.get_config(), overrides), 8)  # decoder-only: accepted
  for model_kind in ('encoder_decoder',):  # the smoke task's model kind with an encoder
    with pytest.raises(settings.ConfigError, match=f"^model.position.kind: got 'causal_none'.*causal only "
                                                   rf'\(model.position.kind=causal_none, {model_kind}\)$'):
      settings.from_config_dict(with_overrides(smoke.get_config(), dict(overrides, **{'task.model_kind': model_kind})), 8)
  assert 'causal_none' in variants.variants_from_flag('all', bidirectional=False)
  assert 'causal_none' not in variants.variants_from_flag('all', bidirectional=True)
  assert variants.variants_from_flag('all', bidirectional=True) == [
      kind for kind, variant in transformer.VARIANTS.items() if not variant.causal_only]
