"""Composition of variants through the interface: embeds chain, logits and values terms add.

`tupe_r` (tupe_r.py) is TUPE's untied positional term plus a T5 bias, built as compose(tupe, t5)
with no code specific to either. Every part reads its own fields of the one settings object.
"""

import dataclasses
from typing import ClassVar

from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, module_fields


class CompositeStack(StackPositions):
  parts: ClassVar[tuple] = ()

  def setup(self):
    self.components = [part(**module_fields(self)) for part in self.parts]

  def embed(self, x_BxLxD, positions_BxL):
    for component in self.components:
      x_BxLxD = component.embed(x_BxLxD, positions_BxL)
    return x_BxLxD

  def shared(self, q_positions_BxLq, k_positions_BxLk):
    return tuple(c.shared(q_positions_BxLq, k_positions_BxLk) for c in self.components)


def _sum(terms):
  present = [t for t in terms if t is not None]
  if not present:
    return None
  total = present[0]
  for term in present[1:]:
    total = total + term
  return total


class CompositeLayer(LayerPositions):
  parts: ClassVar[tuple] = ()

  def setup(self):
    self.components = [part(**module_fields(self)) for part in self.parts]

  def from_inputs(self, inputs_BxLqxD, shared, use_cache=False, cache_index=None):
    parts = (None,) * len(self.components) if shared is None else shared  # None: the stack's are not computed
    return tuple(c.from_inputs(inputs_BxLqxD, s, use_cache, cache_index) for c, s in zip(self.components, parts))

  def rotate(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, sequence_length=None):
    for component in self.components:
      query_BxLqxHxK, key_BxLkxHxK = component.rotate(query_BxLqxHxK, key_BxLkxHxK,
                                                      q_positions_BxLq, k_positions_BxLk, sequence_length)
    return query_BxLqxHxK, key_BxLkxHxK

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    return _sum(c.logits(query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, s, scale)
                for c, s in zip(self.components, shared))

  def values(self, weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk):
    return _sum(c.values(weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk) for c in self.components)

  def needs_weights(self):
    return any(c.needs_weights() for c in self.components)

  def needs_all_keys(self):
    return any(c.needs_all_keys() for c in self.components)

  def weights_rule(self):
    rules = [rule for rule in (c.weights_rule() for c in self.components) if rule is not None]
    if len(rules) > 1:
      raise ValueError(f'composed position variants ask for {len(rules)} rules for the weights; valid: at most one')
    return rules[0] if rules else None

  def scale(self):
    scales = {s for s in (c.scale() for c in self.components) if s is not None}
    if len(scales) > 1:
      raise ValueError(f'composed position variants ask for different logit scales: {sorted(scales)}')
    return scales.pop() if scales else None


def compose(*variants: Variant, paper: str, settings: type[Settings]) -> Variant:
  """A variant whose hooks are those of `variants`, applied in order (terms summed). `settings` must
  have every field of each part's settings (subclass them all)."""
  missing = [name for v in variants for name in v.setting_names() if name not in
             {f.name for f in dataclasses.fields(settings)}]
  if missing:
    raise TypeError(f'{settings.__name__} lacks the settings {missing} of the composed variants')
  stack = type('ComposedStack', (CompositeStack,), {'parts': tuple(v.stack for v in variants)})
  layer = type('ComposedLayer', (CompositeLayer,), {'parts': tuple(v.layer for v in variants)})
  return Variant(stack=stack, layer=layer, paper=paper, settings=settings,
                 shift_invariant=all(v.shift_invariant for v in variants))
