"""Transformer-XL's relative positional encoding (Dai et al. 2019, section 3.3), in every self-attention
layer:

  e_ij = [q_i . k_j + u . k_j + (q_i + v) . (W_R R_{i-j})] / sqrt(d)

per head, with R_t = [sin(t w_c) ..., cos(t w_c) ...] the D-wide sinusoid of the distance t = i - j
(w_c = base^(-2c/D), c < D/2, sines first as the authors' code), W_R a D x (H d) projection of each
layer (no bias, as the code's r_net), and u (content bias) and v (position bias) learned, H x d each.
The paper shares u and v across layers (shared_across_layers=True, the default; False: a pair per
layer). Encoders see both signs of i - j. No memory of previous segments: this library's models
attend within one sequence.

For consecutive positions (the models' own) the position term is computed once per distance,
(Lq + Lk - 1) x H x d, and laid out by key as relative.py does for Shaw and T5. Otherwise it uses
sin((i-j)w) = sin(iw)cos(jw) - cos(iw)sin(jw) and the matching identity for cos to write the term as
one matmul of query features with key features: exact at any positions, at H times the cost of QK^T.
"""

import dataclasses

import chex
import flax.linen as nn
import jax.numpy as jnp

from transformer.layers import parameter
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require
from transformer.positions.relative import (by_distance_to_by_key, consecutive_or_gathered, contiguous_offset,
                                            distance_axis)


@dataclasses.dataclass(frozen=True)
class TransformerXLSettings(Settings):
  sinusoidal_base: float = 10000.0   # R_t's wavelength base
  shared_across_layers: bool = True  # one u and v for all layers (the paper), or a pair per layer

  def check(self):
    require(self.sinusoidal_base > 1.0, 'position.sinusoidal_base', self.sinusoidal_base, 'a number > 1')

  def check_attention(self, num_heads, head_dim, causal):
    require(num_heads * head_dim % 2 == 0, 'model_dim', num_heads * head_dim,
            'an even number, since R_t is made of sines and cosines in pairs')


def _frequencies(dim: int, base: float) -> chex.Array:
  return base ** (-2.0 * jnp.arange(dim // 2, dtype=jnp.float32) / dim)


def relative_sinusoid(distances_Ld: chex.Array, dim: int, base: float = 10000.0) -> chex.Array:
  """R_t = [sin(t w_c) for c < D/2, cos(t w_c) for c < D/2]: Ld x D, float32."""
  angle_LdxP = distances_Ld.astype(jnp.float32)[:, None] * _frequencies(dim, base)
  return jnp.concatenate([jnp.sin(angle_LdxP), jnp.cos(angle_LdxP)], axis=-1)


def position_term_consecutive(query_plus_v_BxLqxHxK, projection_DxHxK, length_k: int, offset, base: float):
  """(q_i + v) . W_R R_{i-j} for queries q_0 + i and keys q_0 + c + j: B x H x Lq x Lk, unscaled."""
  length_q = query_plus_v_BxLqxHxK.shape[1]
  distances_Ld = -distance_axis(length_q, length_k, offset)  # i - j along the distance axis
  relative_LdxHxK = jnp.einsum('td,dhk->thk', relative_sinusoid(distances_Ld, projection_DxHxK.shape[0], base),
                              projection_DxHxK)
  by_distance_BxHxLqxLd = jnp.einsum('bqhk,thk->bhqt', query_plus_v_BxLqxHxK, relative_LdxHxK)
  return by_distance_to_by_key(by_distance_BxHxLqxLd, length_k)


def position_term_any(query_plus_v_BxLqxHxK, projection_DxHxK, q_positions_BxLq, k_positions_BxLk, base: float):
  """The same term for any positions, through sin/cos of i w and j w: B x H x Lq x Lk, unscaled."""
  dim = projection_DxHxK.shape[0]
  through_projection_BxLqxHxD = jnp.einsum('bqhk,dhk->bqhd', query_plus_v_BxLqxHxK, projection_DxHxK)
  on_sines, on_cosines = jnp.split(through_projection_BxLqxHxD, 2, axis=-1)
  frequencies_P = _frequencies(dim, base)
  q_angle = (q_positions_BxLq.astype(jnp.float32)[..., None] * frequencies_P)[:, :, None, :]
  k_angle_BxLkxP = k_positions_BxLk.astype(jnp.float32)[..., None] * frequencies_P
  # a_s sin((i-j)w) + a_c cos((i-j)w) = cos(jw) [a_s sin(iw) + a_c cos(iw)] + sin(jw) [a_c sin(iw) - a_s cos(iw)]
  query_features = jnp.concatenate([on_sines * jnp.sin(q_angle) + on_cosines * jnp.cos(q_angle),
                                    on_cosines * jnp.sin(q_angle) - on_sines * jnp.cos(q_angle)], axis=-1)
  key_features = jnp.concatenate([jnp.cos(k_angle_BxLkxP), jnp.sin(k_angle_BxLkxP)], axis=-1)
  return jnp.einsum('bqhd,bkd->bhqk', query_features, jnp.broadcast_to(
      key_features, (query_features.shape[0], *key_features.shape[1:])))


def _biases(module: nn.Module):
  initializer = nn.initializers.normal(stddev=0.02)
  shape = (module.num_heads, module.head_dim)
  return parameter(module, 'content_bias', initializer, shape), parameter(module, 'position_bias', initializer, shape)


class TransformerXLStack(StackPositions):
  """With shared_across_layers, owns u and v and hands them to every layer. They travel as H x d x 1 x 1,
  so that blockwise attention, which cuts shared terms along their last two (query, key) axes, passes
  them whole."""

  def setup(self):
    if self.settings.shared_across_layers:
      self.content_bias, self.position_bias = _biases(self)

  def shared(self, q_positions_BxLq, k_positions_BxLk):
    if not self.settings.shared_across_layers:
      return None
    return self.content_bias[..., None, None], self.position_bias[..., None, None]


def content_term(key_BxLkxGxK: chex.Array, content_bias_HxK: chex.Array) -> chex.Array:
  """u_h . k_j for every query head h with its key head h // (H / G): B x H x 1 x Lk."""
  batch, length_k, groups, width = key_BxLkxGxK.shape
  heads = content_bias_HxK.shape[0]
  bias_GxNxK = content_bias_HxK.reshape(groups, heads // groups, width)
  content_BxGxNxLk = jnp.einsum('bkgd,gnd->bgnk', key_BxLkxGxK.astype(jnp.float32), bias_GxNxK)
  return content_BxGxNxLk.reshape(batch, heads, 1, length_k)


class TransformerXLLayer(LayerPositions):
  """Owns W_R (and, without sharing, its own u and v); adds the content and position terms."""

  def setup(self):
    self.projection = parameter(self, 'relative_projection', nn.initializers.xavier_uniform(),
                                (self.model_dim, self.num_heads * self.head_dim))
    if not self.settings.shared_across_layers:
      self.content_bias, self.position_bias = _biases(self)

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    if self.settings.shared_across_layers:
      content_bias_HxK, position_bias_HxK = (bias[..., 0, 0] for bias in shared)
    else:
      content_bias_HxK, position_bias_HxK = self.content_bias, self.position_bias
    content_BxHx1xLk = content_term(key_BxLkxHxK, content_bias_HxK)
    query_plus_v = query_BxLqxHxK.astype(jnp.float32) + position_bias_HxK
    projection_DxHxK = self.projection.reshape(self.model_dim, self.num_heads, self.head_dim)
    base = self.settings.sinusoidal_base
    consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
    position_BxHxLqxLk = consecutive_or_gathered(
        consecutive,
        lambda: position_term_consecutive(query_plus_v, projection_DxHxK, k_positions_BxLk.shape[1], offset, base),
        lambda: position_term_any(query_plus_v, projection_DxHxK, q_positions_BxLq, k_positions_BxLk, base))
    return (content_BxHx1xLk + position_BxHxLqxLk) * scale


VARIANT = Variant(TransformerXLStack, TransformerXLLayer, 'Dai et al. 2019 (Transformer-XL)', TransformerXLSettings,
                  shift_invariant=True)
