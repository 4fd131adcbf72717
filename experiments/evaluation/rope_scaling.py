"""LongRoPE's rescale factors from a Hugging Face model's config.json (its `rope_scaling`), as the settings
of rope_extension=longrope (transformer/positions/extension.py).

  "rope_scaling": {"rope_type": "longrope", "short_factor": [...], "long_factor": [...],
                   "attention_factor": 1.19}          (Phi-3 writes "type": "longrope" or "su")

attention_factor is optional (absent: sqrt(1 + ln s / ln L)); the lists hold one number per pair of a
head's dimensions.
"""

import json
import math

LONGROPE_TYPES = ('longrope', 'su')  # 'su': the name Phi-3's first configs gave it


def _refuse(path: str, what: str, valid: str) -> ValueError:
  return ValueError(f'--rope_scaling: {path}: got {what}; valid: {valid}')


def longrope_overrides(path: str) -> tuple:
  """((field, value), ...) of longrope_short_factors, longrope_long_factors and longrope_attention_factor,
  read from the config.json at path; ValueError naming the file and what is wrong."""
  try:
    with open(path) as file:
      config = json.load(file)
  except (OSError, json.JSONDecodeError) as error:
    raise _refuse(path, f'a file that does not read as JSON ({type(error).__name__}: {error})',
                  'a Hugging Face config.json') from None
  scaling = config.get('rope_scaling') if isinstance(config, dict) else None
  if not isinstance(scaling, dict):
    raise _refuse(path, f'rope_scaling {scaling!r}', 'a config whose rope_scaling is LongRoPE\'s')
  kind = scaling.get('rope_type', scaling.get('type'))
  if kind not in LONGROPE_TYPES:
    raise _refuse(path, f'rope_scaling of type {kind!r}', f'type {" or ".join(LONGROPE_TYPES)} (LongRoPE)')
  fields = []
  for key, field in (('short_factor', 'longrope_short_factors'), ('long_factor', 'longrope_long_factors')):
    factors = scaling.get(key)
    if not isinstance(factors, list) or not factors or not all(
        isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) and f > 0 for f in factors):
      raise _refuse(path, f'rope_scaling.{key} {factors!r}', 'a list of numbers > 0, one per pair of dimensions')
    fields.append((field, ' '.join(repr(float(f)) for f in factors)))
  attention = scaling.get('attention_factor')
  if attention is not None and not (isinstance(attention, (int, float)) and math.isfinite(attention)
                                    and attention > 0):
    raise _refuse(path, f'rope_scaling.attention_factor {attention!r}', 'a number > 0, or absent')
  fields.append(('longrope_attention_factor', float(attention or 0.0)))
  return tuple(fields)
