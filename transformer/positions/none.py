"""No positional encoding (NoPE; Haviv et al. 2022, "Transformer Language Models without Positional
Encodings Still Learn Positional Information"): the base hooks, which add nothing. A causal decoder
still tells positions apart through its mask; an encoder sees a bag of tokens. Llama 4's NoPE layers add the
attention temperature (position.temperature_scale, a setting of every variant: temperature.py).
"""

from transformer.positions.base import LayerPositions, StackPositions, Variant

VARIANT = Variant(StackPositions, LayerPositions, 'Haviv et al. 2022 (NoPE)', shift_invariant=True)
