"""No positional encoding (NoPE; Haviv et al. 2022, "Transformer Language Models without Positional
Encodings Still Learn Positional Information"): the base hooks, which add nothing. A causal decoder
still tells positions apart through its mask; an encoder sees a bag of tokens.

Optionally, for a context longer than trained, the attention temperature of Llama 4's NoPE layers
(Meta 2025): query i multiplied by 1 + temperature_scale * ln(floor((i + 1) / temperature_floor) + 1),
which is 1 up to position temperature_floor - 1 and grows slowly after, sharpening attention that
longer contexts would spread (Llama 4: scale 0.1, floor 8192). Off (scale 0) by default; with it on, the
logits depend on the query's absolute position.
"""

import dataclasses

import jax.numpy as jnp

from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require


@dataclasses.dataclass(frozen=True)
class NoneSettings(Settings):
  temperature_scale: float = 0.0   # Llama 4's attn_scale (0.1); 0: off
  temperature_floor: int = 8192    # Llama 4's floor_scale: the temperature stays 1 below this position

  def check(self):
    require(self.temperature_scale >= 0.0, 'position.temperature_scale', self.temperature_scale,
            'a number >= 0 (0: off)')
    require(self.temperature_floor > 0, 'position.temperature_floor', self.temperature_floor, 'a positive integer')

  def shift_invariant_claim(self):
    return None if self.temperature_scale == 0.0 else False  # the temperature reads absolute positions


def query_temperature(positions_BxL, scale: float, floor: int):
  """1 + scale ln(floor((pos + 1) / floor) + 1): B x L, float32."""
  steps_BxL = jnp.floor((positions_BxL.astype(jnp.float32) + 1.0) / floor)
  return 1.0 + scale * jnp.log(steps_BxL + 1.0)


class NoneLayer(LayerPositions):
  """Leaves attention as it is, or scales queries by Llama 4's temperature."""

  def rotate(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, sequence_length=None):
    settings = self.settings
    if settings.temperature_scale == 0.0:
      return query_BxLqxHxK, key_BxLkxHxK
    temperature_BxLqx1x1 = query_temperature(q_positions_BxLq, settings.temperature_scale,
                                             settings.temperature_floor)[:, :, None, None]
    return (query_BxLqxHxK.astype(jnp.float32) * temperature_BxLqx1x1).astype(query_BxLqxHxK.dtype), key_BxLkxHxK


VARIANT = Variant(StackPositions, NoneLayer, 'Haviv et al. 2022 (NoPE)', NoneSettings, shift_invariant=True)
