"""A pattern of variants by layer: the attention of layer n is that of kinds[n mod len(kinds)], each kind's
own transcription with its own parameters and settings. The suite's single attention is layer 0."""

import types

from tests import transcriptions


def _part(context):
  """The transcription of layer 0's kind, and a context that holds only that kind's parameters."""
  kind = context.settings.kinds()[0]
  sub = types.SimpleNamespace(**vars(context))
  sub.settings = context.settings.part(kind)
  sub.stack = context.stack.get(f'parts_{kind}', {})  # the stack's hooks of that kind: its dict attribute parts
  sub.layer = context.layer.get('part', {})
  return transcriptions.transcription(kind), sub


def prepare(context):
  variant, sub = _part(context)
  if hasattr(variant, 'prepare'):
    variant.prepare(sub)
  context.part_context = sub
  if hasattr(variant, 'scale'):
    context.scale = variant.scale(context.head_dim)


def rotate(vector, position, settings):
  kind = settings.kinds()[0]
  variant = transcriptions.transcription(kind)
  return variant.rotate(vector, position, settings.part(kind)) if hasattr(variant, 'rotate') else vector


def logit(context, i, j, q_i, k_j, h):
  variant, _ = _part(context)
  sub = context.part_context
  sub.keys = context.keys
  sub.scale = context.scale
  return variant.logit(sub, i, j, q_i, k_j, h) if hasattr(variant, 'logit') else transcriptions.default_logit(
      sub, i, j, q_i, k_j, h)


def value(context, i, j, v_j, h):
  variant, _ = _part(context)
  return variant.value(context.part_context, i, j, v_j, h) if hasattr(variant, 'value') else v_j
