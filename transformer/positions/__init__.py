"""Every positional encoding, behind the interface of `base.py`. A new variant is one new file
plus one line in VARIANTS."""

from transformer.positions.alibi import AlibiLayer, AlibiStack, alibi_bias, alibi_slopes
from transformer.positions.base import LayerPositions, StackPositions, Variant, relative_positions
from transformer.positions.composite import compose
from transformer.positions.learned import Learned
from transformer.positions.rope import Rope, rotate
from transformer.positions.shaw import Shaw, shaw_buckets, shaw_logits, shaw_values
from transformer.positions.sinusoidal import Sinusoidal, sinusoidal_encoding, sinusoidal_table
from transformer.positions.t5 import T5Layer, T5Stack, t5_bias, t5_bucket
from transformer.positions.tupe import TupeLayer, TupeStack, reset_cls, tupe_scale, untied_position_term

_T5 = Variant(T5Stack, T5Layer, 'Raffel et al. 2020 (T5)', extrapolates=True)
_TUPE = Variant(TupeStack, TupeLayer, 'Ke et al. 2021 (TUPE-A)', extrapolates=True)

VARIANTS: dict[str, Variant] = {
    'none': Variant(StackPositions, LayerPositions, 'Haviv et al. 2022 (NoPE)', extrapolates=True),
    'sinusoidal': Variant(Sinusoidal, LayerPositions, 'Vaswani et al. 2017', extrapolates=True),
    'learned': Variant(Learned, LayerPositions, 'Gehring et al. 2017', extrapolates=False),
    'shaw': Variant(StackPositions, Shaw, 'Shaw et al. 2018', extrapolates=True),
    't5': _T5,
    'tupe_a': _TUPE,
    'tupe_r': compose(_TUPE, _T5, paper='Ke et al. 2021 (TUPE-R)'),
    'rope': Variant(StackPositions, Rope, 'Su et al. 2021 (RoFormer)', extrapolates=True),
    'alibi': Variant(AlibiStack, AlibiLayer, 'Press et al. 2022', extrapolates=True),
}
