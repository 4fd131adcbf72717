"""Every positional encoding, behind the interface of `base.py`. A variant is one file (its hooks,
its settings and its `VARIANT`) plus one line in VARIANTS."""

from transformer.positions import (alibi, cope, fire, fox, kerple, layer_pattern, learned, none, p_rope, path, rope,
                                  shaw, sinusoidal, stick_breaking, t5, temperature, transformer_xl, tupe, tupe_r, xpos)
from transformer.positions.alibi import AlibiLayer, AlibiStack, alibi_bias, alibi_slopes
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, relative_positions
from transformer.positions.composite import compose
from transformer.positions.learned import Learned
from transformer.positions.rope import Rope, rotate
from transformer.positions.shaw import Shaw, shaw_buckets, shaw_logits, shaw_values
from transformer.positions.sinusoidal import Sinusoidal, sinusoidal_encoding, sinusoidal_table
from transformer.positions.randomized import randomized_positions
from transformer.positions.t5 import T5Layer, T5Stack, t5_bias, t5_bucket
from transformer.positions.tupe import TupeLayer, TupeStack, reset_cls, tupe_scale, untied_position_term

VARIANTS: dict[str, Variant] = {
    'none': none.VARIANT,
    'sinusoidal': sinusoidal.VARIANT,
    'learned': learned.VARIANT,
    'shaw': shaw.VARIANT,
    't5': t5.VARIANT,
    'tupe_a': tupe.VARIANT,
    'tupe_r': tupe_r.VARIANT,
    'rope': rope.VARIANT,
    'alibi': alibi.VARIANT,
    'kerple_log': kerple.LOG_VARIANT,
    'kerple_power': kerple.POWER_VARIANT,
    'fire': fire.VARIANT,
    'xpos': xpos.VARIANT,
    'p_rope': p_rope.VARIANT,
    'transformer_xl': transformer_xl.VARIANT,
    'cope': cope.VARIANT,
    'fox': fox.VARIANT,
    'stick_breaking': stick_breaking.VARIANT,
    'path': path.VARIANT,
}
VARIANTS['layer_pattern'] = layer_pattern.pattern_variant(VARIANTS)  # over the variants above


def setting_names() -> tuple[str, ...]:
  """Every variant's settings, once each: the fields model.position may have besides `kind`."""
  return tuple(sorted({name for variant in VARIANTS.values() for name in variant.setting_names()}))
