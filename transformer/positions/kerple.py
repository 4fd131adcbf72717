"""KERPLE, kernelized relative positional embedding (Chi, Fan, Ramadge and Rudnicky 2022), in every
self-attention layer; two of its conditionally positive definite kernels as variants:

  kerple_log:    e_ij += -r1_h log(1 + r2_h |i - j|)
  kerple_power:  e_ij += -r1_h |i - j|^r2_h

r1_h, r2_h > 0 learned per head and layer; the power kernel also needs r2 <= 2. As in the authors'
GPT-NeoX code: r1, r2 initialised uniformly, the log kernel's r1 in (0, 2) and r2 in (0, 1), the
power kernel's r1 in (0, 1) and r2 in (0, 2); both clamped to at least 0.01 (and the power's r2 to at
most 2) before use. Their code clamps the stored parameters in place before each step; here the
forward pass clamps (a straight-through clamp: the value is clamped, the gradient passes as if it
were not), so a parameter pushed below 0.01 still receives the gradient that can bring it back.
Causal attention uses the distance i - j of keys in the past (future keys are masked); encoders
|i - j|, as the paper.
"""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.flash_attention import KernelTerm
from transformer.layers import parameter
from transformer.positions.base import LayerPositions, StackPositions, Variant, relative_positions

SMALLEST = 0.01  # the reference's clamp of r1 and r2
LARGEST_POWER = 2.0  # the power kernel is conditionally positive definite for 0 < r2 <= 2


def straight_through_clip(x: chex.Array, low: float, high=None) -> chex.Array:
  """clip(x, low, high) in the forward pass; the identity's gradient in the backward pass."""
  return x + jax.lax.stop_gradient(jnp.clip(x, low, high) - x)


def distance_from_relative(relative: chex.Array, causal: bool) -> chex.Array:
  """i - j for keys in the past (0 for future keys, which causal attention masks), |i - j| in encoders;
  elementwise, from j - i."""
  return jnp.maximum(-relative, 0.0) if causal else jnp.abs(relative)


def kerple_distance(q_positions_BxLq, k_positions_BxLk, causal: bool) -> chex.Array:
  """distance_from_relative as B x 1 x Lq x Lk, float32."""
  relative_BxLqxLk = relative_positions(q_positions_BxLq, k_positions_BxLk).astype(jnp.float32)
  return distance_from_relative(relative_BxLqxLk, causal)[:, None]


def log_kernel(r1, r2, distance):
  """-r1 log(1 + r2 d), elementwise."""
  return -r1 * jnp.log1p(r2 * distance)


def power_kernel(r1, r2, distance):
  """-r1 d^r2, elementwise; 0 at d = 0, with a finite gradient there."""
  positive = distance > 0
  log_distance = jnp.log(jnp.where(positive, distance, 1.0))
  return -r1 * jnp.where(positive, jnp.exp(r2 * log_distance), 0.0)


def kerple_log_bias(r1_H, r2_H, distance_Bx1xLqxLk) -> chex.Array:
  """-r1_h log(1 + r2_h d): B x H x Lq x Lk."""
  return log_kernel(r1_H[:, None, None], r2_H[:, None, None], distance_Bx1xLqxLk)


def kerple_power_bias(r1_H, r2_H, distance_Bx1xLqxLk) -> chex.Array:
  """-r1_h d^r2_h: B x H x Lq x Lk."""
  return power_kernel(r1_H[:, None, None], r2_H[:, None, None], distance_Bx1xLqxLk)


class _KerpleLayer(LayerPositions):
  """Owns this layer's r1 and r2 (one per head) and adds the kernel's bias to the logits."""
  r1_scale = 1.0
  r2_scale = 1.0
  r2_largest = None
  elementwise = None  # log_kernel or power_kernel

  def setup(self):
    self.r1 = parameter(self, 'r1', nn.initializers.uniform(self.r1_scale), (self.num_heads,))
    self.r2 = parameter(self, 'r2', nn.initializers.uniform(self.r2_scale), (self.num_heads,))

  def clamped(self):
    return (straight_through_clip(self.r1, SMALLEST),
            straight_through_clip(self.r2, SMALLEST, self.r2_largest))

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    r1_H, r2_H = self.clamped()
    return type(self).elementwise(r1_H[:, None, None], r2_H[:, None, None],
                                  kerple_distance(q_positions_BxLq, k_positions_BxLk, self.causal))

  def kernel_term(self, kernel_shared, shared=None):
    causal, elementwise = self.causal, type(self).elementwise

    def bias(parameters, q_positions_bqx1, k_positions_1xbk):
      return elementwise(parameters[0], parameters[1],
                         distance_from_relative(k_positions_1xbk - q_positions_bqx1, causal))
    return KernelTerm(bias, jnp.stack(self.clamped(), axis=1))

  def kernel_serves(self):
    return True


class KerpleLogLayer(_KerpleLayer):
  r1_scale = 2.0
  r2_scale = 1.0
  elementwise = staticmethod(log_kernel)


class KerplePowerLayer(_KerpleLayer):
  r1_scale = 1.0
  r2_scale = 2.0
  r2_largest = LARGEST_POWER
  elementwise = staticmethod(power_kernel)


LOG_VARIANT = Variant(StackPositions, KerpleLogLayer, 'Chi et al. 2022 (KERPLE, logarithmic)', shift_invariant=True)
POWER_VARIANT = Variant(StackPositions, KerplePowerLayer, 'Chi et al. 2022 (KERPLE, power)', shift_invariant=True)
