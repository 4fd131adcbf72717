"""Ke et al. 2021, section 3.2: TUPE-A's e_ij (tupe_a.py) + T5's b_h[bucket(j - i)] (t5.py)."""

from tests.transcriptions import t5, tupe_a
from tests.transcriptions.tupe_a import prepare, scale  # pylint: disable=unused-import


def logit(context, i, j, q_i, k_j, h):
  t5_bias = t5.bias(context, context.stack.get('components_1', {}), context.layer.get('components_1', {}), i, j, h)
  return tupe_a.logit(context, i, j, q_i, k_j, h) + t5_bias
