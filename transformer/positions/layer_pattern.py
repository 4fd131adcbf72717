"""A pattern of variants by layer: layer n of a stack takes the hooks of kinds[n mod len(kinds)], e.g.
'rope,rope,rope,none' for RoPE in three layers of four and none in the fourth, as Llama 4 interleaves
RoPE layers with NoPE ones (and Command A sliding-window RoPE layers with global NoPE ones: with
model.layer_types for the windows).

Any variant without an embedding hook may appear (those that add to the token embeddings act once per
stack, not per layer). The stack builds each kind's stack hooks once, so shared terms (ALiBi's bias,
TUPE's positional term, a shared T5 table) are computed once per pass and handed to the layers of
their kind. The settings hold `layer_pattern` and every setting of every such variant (their
defaults), each kind reading its own. The pattern claims shift invariance when every kind in it does,
extrapolates as far as its shortest part, and serves an encoder only if every kind in it does.
"""

import dataclasses
from typing import ClassVar, Optional

from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, module_fields, require

DEFAULT_PATTERN = 'rope,rope,rope,none'


class PatternSettings(Settings):
  """The methods of a pattern's settings; `parts` ({kind: Variant}) and the fields (`layer_pattern` and
  every part's settings) come from pattern_variant."""
  parts: ClassVar[dict]  # {kind: Variant}, set by pattern_variant

  def kinds(self) -> tuple[str, ...]:
    """The kind of each layer in the cycle."""
    return tuple(kind.strip() for kind in self.layer_pattern.split(','))

  def part(self, kind: str) -> Settings:
    """The settings of one kind of the pattern."""
    variant = self.parts[kind]
    return variant.settings(**{name: getattr(self, name) for name in variant.setting_names()})

  def distinct(self) -> list[str]:
    return list(dict.fromkeys(self.kinds()))

  def check(self):
    valid = (f'a comma-separated list of kinds, one per layer (repeated over the stack), from '
             f'{", ".join(self.parts)} (variants that add to the embeddings cannot be placed by layer)')
    require(all(kind in self.parts for kind in self.kinds()), 'position.layer_pattern', self.layer_pattern, valid)
    for kind in self.distinct():
      self.part(kind)  # runs that kind's checks

  def check_attention(self, num_heads, head_dim, causal):
    for kind in self.distinct():
      require(causal or not self.parts[kind].causal_only, 'position.layer_pattern', self.layer_pattern,
              f'in bidirectional attention (an encoder) kinds that are not causal only; {kind} is')
      self.part(kind).check_attention(num_heads, head_dim, causal)

  def longest_sequence(self) -> Optional[int]:
    limits = [self.part(kind).longest_sequence() for kind in self.distinct()]
    return min((limit for limit in limits if limit is not None), default=None)

  def check_positions(self, largest):
    for kind in self.distinct():
      self.part(kind).check_positions(largest)

  def shift_invariant_claim(self) -> bool:
    return all(self.parts[kind].shift_invariant for kind in self.distinct()) and not self.temperature_scale

  def shift_invariant_below(self) -> Optional[int]:
    limits = [self.part(kind).shift_invariant_below() for kind in self.distinct()]
    return min((limit for limit in limits if limit is not None), default=None)


class PatternStack(StackPositions):
  """Each kind's stack hooks, once; shared terms by kind."""

  def setup(self):
    fields = module_fields(self)
    self.parts = {kind: self.settings.parts[kind].stack(**dict(fields, settings=self.settings.part(kind)))
                  for kind in self.settings.distinct()}

  def shared(self, q_positions_BxLq, k_positions_BxLk):
    return {kind: stack.shared(q_positions_BxLq, k_positions_BxLk) for kind, stack in self.parts.items()}

  def kernel_shared(self):
    return {kind: stack.kernel_shared() for kind, stack in self.parts.items()}

  def masked(self, shared, mask_Bx1xLqxLk):
    return {kind: stack.masked(shared[kind], mask_Bx1xLqxLk) for kind, stack in self.parts.items()}


class PatternLayer(LayerPositions):
  """The hooks of this layer's kind, with that kind's shared terms."""

  def setup(self):
    kinds = self.settings.kinds()
    self.kind = kinds[self.layer_index % len(kinds)]
    self.part = self.settings.parts[self.kind].layer(**dict(module_fields(self),
                                                            settings=self.settings.part(self.kind)))

  def from_inputs(self, inputs_BxLqxD, shared, use_cache=False, cache_index=None):
    own = None if shared is None else shared[self.kind]  # None: the stack's are not computed
    return dict(shared or {}, **{self.kind: self.part.from_inputs(inputs_BxLqxD, own, use_cache, cache_index)})

  def rotate(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, sequence_length=None):
    return self.part.rotate(query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, sequence_length)

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    return self.part.logits(query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared[self.kind],
                            scale)

  def values(self, weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk):
    return self.part.values(weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk)

  def scale(self):
    return self.part.scale()

  def needs_weights(self):
    return self.part.needs_weights()

  def needs_all_keys(self):
    return self.part.needs_all_keys()

  def causal_band(self):
    return self.part.causal_band()

  def kernel_term(self, kernel_shared, shared=None):
    return self.part.kernel_term(kernel_shared[self.kind], None if shared is None else shared[self.kind])

  def kernel_serves(self):
    return self.part.kernel_serves()

  def weights_rule(self):
    return self.part.weights_rule()


def pattern_variant(table: dict[str, Variant]) -> Variant:
  """The layer_pattern variant over the variants of `table` that have no embedding hook: its settings
  hold `layer_pattern` and every part's settings (one field per name; parts that share a name must
  share its type and default)."""
  parts = {kind: variant for kind, variant in table.items() if not variant.embeds}
  fields, seen = [('layer_pattern', str, dataclasses.field(default=DEFAULT_PATTERN))], {}
  for kind, variant in parts.items():
    for field in dataclasses.fields(variant.settings):
      if field.name in seen:
        if seen[field.name] != (field.type, field.default):
          raise TypeError(f'{kind}.{field.name} differs from another variant\'s setting of that name')
        continue
      seen[field.name] = (field.type, field.default)
      fields.append((field.name, field.type, dataclasses.field(default=field.default)))
  settings = dataclasses.make_dataclass('LayerPatternSettings', fields, bases=(PatternSettings,), frozen=True,
                                        namespace=dict(parts=parts))
  return Variant(PatternStack, PatternLayer, 'a pattern by layer (Llama 4, Command A)', settings, shift_invariant=True)
