"""FIRE, functional interpolation for relative positions (Li et al. 2023), in every self-attention layer.

  e_ij += f_theta(psi(i - j) / psi(max(L, i))),   psi(x) = log(c |x| + 1),

f_theta an MLP 1 -> width -> H (ReLU) giving one bias per head, c learned (from 0.1), L the threshold:
|m| L0 with a learned multiplier m (from 1; the paper's default) or the configured L0 alone. Dividing
by psi(max(L, i)) maps every distance a query can see into [0, 1] ("progressive interpolation"), so a
query beyond the training length sees inputs the MLP was trained on. Choices the paper leaves open,
taken from its reference code: psi(max(L, i)) gets + 1e-6 so it is never 0; the sign of i - j is
dropped (|i - j|), which in causal attention changes nothing (future keys are masked) and makes the
bias symmetric in encoders; each layer has its own MLP, c and m.

Shift-invariant only while every query position is at most L: beyond it the normaliser grows with i.
The MLP's hidden layer holds B x Lq x Lk x width numbers (width 32 by default, never the head width).
"""

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.layers import parameter
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, relative_positions, require

EPSILON = 1e-6  # added to psi(max(L, i)), as the reference code does
MAX_THRESHOLD = 2 ** 24  # float32 holds every integer position up to here; far beyond, c L overflows


@dataclasses.dataclass(frozen=True)
class FireSettings(Settings):
  fire_threshold: float = 512.0     # L0: queries at positions up to L = |m| L0 are normalised by psi(L)
  fire_learn_threshold: bool = True  # learn the multiplier m (from 1); False: L = L0 exactly
  fire_mlp_width: int = 32          # hidden units of f_theta

  def check(self):
    require(0 < self.fire_threshold <= MAX_THRESHOLD, 'position.fire_threshold', self.fire_threshold,
            f'a number of positions in (0, {MAX_THRESHOLD}] (psi(max(L, i)) is 0 at L = 0 for the first query; '
            f'float32 counts positions exactly up to 2^24)')
    require(self.fire_mlp_width >= 1, 'position.fire_mlp_width', self.fire_mlp_width, 'a positive integer')

  def shift_invariant_below(self):
    # The claim needs every query at or below L; a learned L moves with training.
    return None if self.fire_learn_threshold else int(self.fire_threshold) + 1


def fire_inputs(q_positions_BxLq, k_positions_BxLk, c: chex.Array, threshold: chex.Array) -> chex.Array:
  """psi(|i - j|) / (psi(max(L, i)) + eps): B x Lq x Lk, float32, in [0, 1] for keys up to the query."""
  distance_BxLqxLk = jnp.abs(relative_positions(q_positions_BxLq, k_positions_BxLk)).astype(jnp.float32)
  query_BxLqx1 = q_positions_BxLq.astype(jnp.float32)[:, :, None]
  c = jnp.abs(c)
  return jnp.log1p(c * distance_BxLqxLk) / (jnp.log1p(c * jnp.maximum(query_BxLqx1, threshold)) + EPSILON)


def fire_bias(inputs_BxLqxLk, hidden_kernel_W, hidden_bias_W, output_kernel_WxH, output_bias_H) -> chex.Array:
  """f_theta(inputs): B x H x Lq x Lk."""
  chex.assert_rank([inputs_BxLqxLk, hidden_kernel_W, output_kernel_WxH], [3, 1, 2])
  hidden_BxLqxLkxW = jnp.maximum(inputs_BxLqxLk[..., None] * hidden_kernel_W + hidden_bias_W, 0.0)
  bias = jnp.einsum('bqkw,wh->bhqk', hidden_BxLqxLkxW, output_kernel_WxH) + output_bias_H[:, None, None]
  chex.assert_shape(bias, (inputs_BxLqxLk.shape[0], output_kernel_WxH.shape[1], *inputs_BxLqxLk.shape[1:]))
  return bias


def _symmetric_uniform(bound: float):
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


class FireLayer(LayerPositions):
  """Owns this layer's MLP, c and multiplier, and adds the MLP's bias to the logits."""

  def setup(self):
    width = self.settings.fire_mlp_width
    # PyTorch's default initialisation of the reference's two nn.Linear: uniform in +-1/sqrt(fan-in).
    self.hidden_kernel = parameter(self, 'hidden_kernel', _symmetric_uniform(1.0), (width,))
    self.hidden_bias = parameter(self, 'hidden_bias', _symmetric_uniform(1.0), (width,))
    self.output_kernel = parameter(self, 'output_kernel', _symmetric_uniform(width ** -0.5), (width, self.num_heads))
    self.output_bias = parameter(self, 'output_bias', _symmetric_uniform(width ** -0.5), (self.num_heads,))
    self.c = parameter(self, 'c', nn.initializers.constant(0.1), ())
    if self.settings.fire_learn_threshold:
      self.threshold_multiplier = parameter(self, 'threshold_multiplier', nn.initializers.ones, ())

  def threshold(self) -> chex.Array:
    if self.settings.fire_learn_threshold:
      return jnp.abs(self.threshold_multiplier * self.settings.fire_threshold)
    return jnp.asarray(self.settings.fire_threshold, jnp.float32)

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    inputs = fire_inputs(q_positions_BxLq, k_positions_BxLk, self.c, self.threshold())
    return fire_bias(inputs, self.hidden_kernel, self.hidden_bias, self.output_kernel, self.output_bias)


VARIANT = Variant(StackPositions, FireLayer, 'Li et al. 2023 (FIRE)', FireSettings, shift_invariant=True)
