"""ALiBi, attention with linear biases (Press et al. 2022, "Train Short, Test Long").

logits_ij += -m_h * (i - j) for a causal decoder (future keys are masked anyway), and the
symmetric -m_h * |i - j| for encoders. Slopes are the geometric sequence 2^(-8h/n), h = 1..n, for
n a power of two; otherwise the slopes of the nearest lower power of two, then every other slope
of the next power of two.
"""

import math

import chex
import jax.numpy as jnp
import numpy as np

from transformer.flash_attention import KernelTerm
from transformer.positions.base import LayerPositions, StackPositions, Variant, relative_positions


def alibi_slopes(num_heads: int) -> np.ndarray:
  """The paper's head-specific slopes, float32, shape [num_heads]."""
  if num_heads <= 0:
    raise ValueError(f'num_heads must be positive, got {num_heads}')

  def power_of_two_slopes(n: int) -> list[float]:
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

  lower = 2 ** int(math.floor(math.log2(num_heads)))
  slopes = power_of_two_slopes(lower)
  slopes += power_of_two_slopes(2 * lower)[0::2][:num_heads - lower]
  return np.asarray(slopes, dtype=np.float32)


def alibi_distance(relative: chex.Array, causal: bool) -> chex.Array:
  """i - j for a causal decoder (future keys are masked), |i - j| for encoders; elementwise, from j - i."""
  return -relative if causal else jnp.abs(relative)


def alibi_bias(q_positions_BxLq, k_positions_BxLk, num_heads: int, causal: bool) -> chex.Array:
  """-m_h * distance: B x H x Lq x Lk, float32."""
  relative_BxLqxLk = relative_positions(q_positions_BxLq, k_positions_BxLk).astype(jnp.float32)
  slopes_H = jnp.asarray(alibi_slopes(num_heads))
  return -slopes_H[None, :, None, None] * alibi_distance(relative_BxLqxLk, causal)[:, None]


def alibi_kernel_term(num_heads: int, causal: bool) -> KernelTerm:
  """-m_h * distance for a kernel: the slopes as one parameter per head."""
  def bias(parameters, q_positions_bqx1, k_positions_1xbk):
    return -parameters[0] * alibi_distance(k_positions_1xbk - q_positions_bqx1, causal)
  return KernelTerm(bias, jnp.asarray(alibi_slopes(num_heads))[:, None])


class AlibiStack(StackPositions):
  """The bias has no parameters and is the same in every layer: built once per forward pass."""

  def shared(self, q_positions_BxLq, k_positions_BxLk):
    return alibi_bias(q_positions_BxLq, k_positions_BxLk, self.num_heads, self.causal)


class AlibiLayer(LayerPositions):

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    return shared

  def kernel_term(self, kernel_shared, shared=None):
    return alibi_kernel_term(self.num_heads, self.causal)

  def kernel_serves(self):
    return True


VARIANT = Variant(AlibiStack, AlibiLayer, 'Press et al. 2022', shift_invariant=True)
