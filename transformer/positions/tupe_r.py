"""TUPE-R (Ke, He and Liu 2021, section 3.2): TUPE's untied positional term (tupe.py) plus a T5
relative bias (t5.py), composed through the interface (composite.py):
  alpha_ij = (x_i W^Q)(x_j W^K)^T / sqrt(2d) + (LN(p_i) U^Q)(LN(p_j) U^K)^T / sqrt(2d) + b_h[bucket(j - i)].
"""

import dataclasses

from transformer.positions import t5, tupe
from transformer.positions.composite import compose


@dataclasses.dataclass(frozen=True)
class TupeRSettings(tupe.TupeSettings, t5.T5Settings):
  """TUPE's settings and T5's."""

  def check(self):
    tupe.TupeSettings.check(self)
    t5.T5Settings.check(self)

  def check_attention(self, num_heads, head_dim, causal):
    t5.T5Settings.check_attention(self, num_heads, head_dim, causal)


VARIANT = compose(tupe.VARIANT, t5.VARIANT, paper='Ke et al. 2021 (TUPE-R)', settings=TupeRSettings)
