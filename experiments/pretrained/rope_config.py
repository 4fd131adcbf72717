"""A Hugging Face config's RoPE (rope_theta, and rope_scaling or transformers 5's rope_parameters) as this library's
RoPE with a context extension: linear -> pi, llama3, longrope (its factor lists, the set chosen by the sequence's
length, as transformers does), yarn (its ramp over pair indices, beta_fast, beta_slow, truncate, attention_factor or
DeepSeek's mscale pair), each with its original_max_position_embeddings; dynamic -> dynamic_ntk_sequence, whose L
is max_position_embeddings (transformers' dynamic reads that one). Any other type, a field out of range, or the two
schemas disagreeing is refused by name, never dropped or guessed."""

import math
from typing import Optional

import transformer
from experiments.pretrained.tables import PretrainedError, number, position_config

ROPE_TYPES = ('default', 'linear', 'dynamic', 'llama3', 'longrope', 'yarn')
WHERE = 'config.json'


def yarn_scale(factor: float, mscale: float = 1.0) -> float:
  """0.1 mscale ln s + 1 (1 for s <= 1): YaRN's attention factor, and DeepSeek's mscale ratio's terms."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _kind(scaling: dict):
  return scaling.get('rope_type') or scaling.get('type')


def scaling_of(hf_config: dict) -> dict:
  """One dict of RoPE parameters from rope_scaling and rope_parameters (and rope_theta), refusing a config where
  they disagree: transformers 4 reads the first, 5 the second, so such a checkpoint has no single meaning."""
  found = {}
  for name in ('rope_scaling', 'rope_parameters'):
    value = hf_config.get(name)
    if value is not None and not isinstance(value, dict):
      raise PretrainedError(f'{WHERE}: {name}: got {value!r}; valid: null or an object of RoPE parameters')
    if value and any(isinstance(entry, dict) for entry in value.values()):
      raise PretrainedError(f'{WHERE}: {name}: keyed by {", ".join(sorted(value))}; valid: one set of RoPE '
                            'parameters for every layer (parameters by layer type are not read here)')
    found[name] = dict(value or {})
  old, new = found['rope_scaling'], found['rope_parameters']
  if old and new:
    kinds = (_kind(old) or 'default', _kind(new) or 'default')
    differing = sorted(key for key in set(old) & set(new) - {'type', 'rope_type'} if old[key] != new[key])
    if kinds[0] != kinds[1] or differing:
      what = f'type {kinds[0]!r} against {kinds[1]!r}' if kinds[0] != kinds[1] else f'{differing[0]}'
      raise PretrainedError(f'{WHERE}: rope_scaling and rope_parameters disagree ({what}); valid: one of them, or '
                            'both with the same values (transformers 4 reads rope_scaling, 5 rope_parameters)')
  if 'rope_theta' in new and hf_config.get('rope_theta') is not None and new['rope_theta'] != hf_config['rope_theta']:
    raise PretrainedError(f'{WHERE}: rope_theta {hf_config["rope_theta"]!r} and rope_parameters.rope_theta '
                          f'{new["rope_theta"]!r} disagree; valid: one value')
  return {**old, **new}


def rope_position(hf_config: dict, kind_of_position: str = 'rope', **extra) -> transformer.PositionConfig:
  """The config's RoPE as this library's PositionConfig(kind_of_position, ..., **extra)."""
  scaling = scaling_of(hf_config)
  kind = _kind(scaling) or 'default'
  where = f'{WHERE}: rope_scaling'
  base = number(scaling, 'rope_theta', None, where=where)
  fields = {'rope_base': base if base is not None else number(hf_config, 'rope_theta', 10000.0, minimum=1.0)}
  longest = number(hf_config, 'max_position_embeddings', 0, integer=True, above=False)
  original = number(scaling, 'original_max_position_embeddings', longest, integer=True, above=False, where=where)

  def factor():
    return number(scaling, 'factor', where=where)
  if kind == 'linear':
    fields.update(rope_extension='pi', extension_factor=factor())
  elif kind == 'yarn':
    if not original:
      raise PretrainedError(f'{where}: original_max_position_embeddings: missing, and so is max_position_embeddings; '
                            'valid: the length the model was trained at')
    stretch = number(scaling, 'factor', longest / original if longest else None, where=where)
    attention = number(scaling, 'attention_factor', None, where=where)
    mscale, mscale_all = (number(scaling, name, None, where=where) for name in ('mscale', 'mscale_all_dim'))
    if attention is None and mscale and mscale_all:
      attention = yarn_scale(stretch, mscale) / yarn_scale(stretch, mscale_all)
    fields.update(rope_extension='yarn', extension_factor=stretch, original_length=original,
                  yarn_alpha=number(scaling, 'beta_slow', 1.0, where=where),
                  yarn_beta=number(scaling, 'beta_fast', 32.0, where=where),
                  yarn_ramp='dimensions' if scaling.get('truncate', True) else 'exact_dimensions',
                  yarn_attention_factor=attention or 0.0)
  elif kind == 'dynamic':
    if not longest:
      raise PretrainedError(f'{WHERE}: max_position_embeddings: missing; valid: the context length, which '
                            'transformers\' dynamic scaling reads as its original length')
    fields.update(rope_extension='dynamic_ntk_sequence', extension_factor=factor(), original_length=longest)
  elif kind == 'llama3':
    fields.update(rope_extension='llama3', extension_factor=factor(), original_length=original,
                  llama3_low_frequency_factor=number(scaling, 'low_freq_factor', where=where),
                  llama3_high_frequency_factor=number(scaling, 'high_freq_factor', where=where))
  elif kind == 'longrope':
    if not original:
      raise PretrainedError(f'{where}: original_max_position_embeddings: missing; valid: the length the factors '
                            'were searched from')
    lists = {}
    for name in ('short_factor', 'long_factor'):
      values = scaling.get(name)
      if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 and math.isfinite(v) and v > 0 for v in values):
        raise PretrainedError(f'{where}: {name}: got {values!r}; valid: a list of finite numbers > 0, one per pair')
      lists[name] = ' '.join(str(float(v)) for v in values)
    fields.update(rope_extension='longrope', extension_factor=max(1.0, (longest or original) / original),
                  original_length=original, longrope_short_factors=lists['short_factor'],
                  longrope_long_factors=lists['long_factor'],
                  longrope_attention_factor=number(scaling, 'attention_factor', 0.0, where=where),
                  longrope_by_length=True)
  elif kind != 'default':
    raise PretrainedError(f'{WHERE}: rope scaling type {kind!r}; valid: {", ".join(ROPE_TYPES)}')
  return position_config(kind_of_position, **fields, **extra)


def positions_by_layer_type(hf_config: dict, layer_types: dict) -> Optional[tuple]:
  """(the full layers' RoPE, the sliding layers') from transformers 5's rope_parameters keyed by layer type
  (layer_types: its keys, e.g. tables.HF_LAYER_TYPES); None where rope_parameters is one set for every layer."""
  keyed = hf_config.get('rope_parameters')
  if not isinstance(keyed, dict) or not any(isinstance(value, dict) for value in keyed.values()):
    return None
  unknown = sorted(set(keyed) - set(layer_types))
  if unknown:
    raise PretrainedError(f'{WHERE}: rope_parameters: keyed by {unknown[0]!r}; valid: {", ".join(layer_types)}')
  by_type = {kind: rope_position({**hf_config, 'rope_parameters': keyed.get(kind) or {}, 'rope_scaling': None,
                                  'rope_theta': None})
             for kind in layer_types}
  return by_type['full_attention'], by_type['sliding_attention']


# This library's extension -> transformers' rope_type (the methods it computes the same way).
ROPE_SCALING = {'none': None, 'pi': 'linear', 'dynamic_ntk_sequence': 'dynamic', 'llama3': 'llama3', 'yarn': 'yarn'}


def unexportable(position: transformer.PositionConfig) -> str:
  """'' when transformers computes the run's RoPE and extension as this library does; else the field that differs,
  with what would be valid."""
  settings = position.settings
  if settings.rope_extension not in ROPE_SCALING:
    return (f'model.position.rope_extension: got {settings.rope_extension!r}; valid: {", ".join(ROPE_SCALING)} '
            '(transformers\' dynamic is dynamic_ntk_sequence, one factor per sequence, and it has no static ntk or '
            'longrope by factor)')
  if settings.rope_extension == 'yarn' and settings.yarn_ramp == 'rotations':
    return ('model.position.yarn_ramp: got \'rotations\'; valid: dimensions or exact_dimensions (transformers\' yarn '
            'ramps over pair indices, not over rotations as the paper\'s gamma(r))')
  if settings.ssmax:
    return 'model.position.ssmax: got True; valid: False (transformers does not scale the softmax by length)'
  if settings.temperature_scale:
    return (f'model.position.temperature_scale: got {settings.temperature_scale}; valid: 0 (this block in '
            'transformers has no attention temperature)')
  return ''


def unexportable_layers(config: transformer.ModelConfig, block: str) -> str:
  """'' when every layer of the run is full or sliding with RoPE that transformers computes as this library does
  (model.position and model.local_position); else the field that is not, naming the block."""
  if set(config.layer_type_cycle) - {'full', 'sliding'}:
    return f'model.layer_types: got {config.layer_types!r}; valid: full and sliding layers ({block} has no chunks)'
  for name, position in (('position', config.position), ('local_position', config.local_position)):
    if position is not None and position.kind != 'rope':
      return f'model.{name}.kind: got {position.kind!r}; valid: rope ({block}\'s layers rotate)'
    refused = '' if position is None else unexportable(position)
    if refused:
      return refused.replace('model.position.', f'model.{name}.')
  return ''


def rope_fields(position: transformer.PositionConfig, context_length: int) -> dict:
  """rope_theta and rope_scaling of config.json for the run's RoPE (the inverse of rope_position; unexportable
  says which it cannot write); dynamic also sets max_position_embeddings, the L transformers' dynamic reads."""
  settings = position.settings
  kind = ROPE_SCALING[settings.rope_extension]
  fields = {'rope_theta': settings.rope_base}
  if kind == 'linear':
    fields['rope_scaling'] = dict(rope_type='linear', factor=settings.extension_factor)
  elif kind == 'dynamic':
    fields.update(rope_scaling=dict(rope_type='dynamic', factor=settings.extension_factor),
                  max_position_embeddings=settings.original_length)
  elif kind == 'llama3':
    fields['rope_scaling'] = dict(rope_type='llama3', factor=settings.extension_factor,
                                  original_max_position_embeddings=settings.original_length or context_length,
                                  low_freq_factor=settings.llama3_low_frequency_factor,
                                  high_freq_factor=settings.llama3_high_frequency_factor)
  elif kind == 'yarn':
    fields['rope_scaling'] = dict(rope_type='yarn', factor=settings.extension_factor,
                                  original_max_position_embeddings=settings.original_length,
                                  beta_fast=settings.yarn_beta, beta_slow=settings.yarn_alpha,
                                  truncate=settings.yarn_ramp == 'dimensions',
                                  **({'attention_factor': settings.yarn_attention_factor}
                                     if settings.yarn_attention_factor else {}))
  return fields


def rope_parameters(position: transformer.PositionConfig, context_length: int) -> dict:
  """One layer type's entry of transformers 5's rope_parameters for the run's RoPE (rope_type, its fields and
  rope_theta)."""
  fields = rope_fields(position, context_length)
  return {'rope_type': 'default', **fields.pop('rope_scaling', {}), 'rope_theta': fields['rope_theta']}
