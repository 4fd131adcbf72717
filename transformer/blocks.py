"""Encoder and decoder layers, and the stack that owns a stack's positional hooks.

Post-LN (the paper): x = LN(x + Dropout(Sublayer(x))). Pre-LN: x = x + Dropout(Sublayer(LN(x))),
with a final LN after the last layer.
"""

from typing import Optional

import chex
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from transformer.attention import MultiHeadAttention
from transformer.config import ModelConfig
from transformer.layers import Dropout, FeedForward, LayerNorm
from transformer.masks import causal_mask, cross_attention_mask, self_attention_mask
from transformer.positions import VARIANTS
from transformer.positions.base import Shared


def _hook_fields(config: ModelConfig, num_layers: int, causal: bool, has_cls: bool) -> dict:
  return dict(config=config.position, num_heads=config.num_heads, head_dim=config.head_dim,
              model_dim=config.model_dim, num_layers=num_layers, causal=causal, has_cls=has_cls)


class _Residual(nn.Module):
  """Wraps one sublayer with dropout, the residual connection and post- or pre-LN."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, sublayer, deterministic: bool):
    norm = LayerNorm(self.config.layer_norm_eps)
    drop = Dropout(self.config.dropout_rate)
    if self.config.norm == 'pre':
      return x + drop(sublayer(norm(x)), deterministic)
    return norm(x + drop(sublayer(x), deterministic))


class TransformerLayer(nn.Module):
  """Encoder layer (self-attention, FFN) or, with cross_attention, decoder layer (masked
  self-attention, attention over the encoder's memory, FFN)."""
  config: ModelConfig
  num_layers: int
  causal: bool
  cross_attention: bool = False
  has_cls: bool = False

  @nn.compact
  def __call__(self, x_BxLxD, self_mask, positions_1xL, shared: Shared, memory_BxLsxD=None, memory_mask=None,
               deterministic: bool = True):
    """With config.aligned_cross_attention, target position i and source position i are the same
    step (SAINT's exercises and responses), so cross-attention gets position hooks of its own."""
    config = self.config
    hooks = VARIANTS[config.position.kind].layer(
        **_hook_fields(config, self.num_layers, self.causal, self.has_cls), name='position')
    self_attention = MultiHeadAttention(config.num_heads, config.attention_dropout_rate, config.attention_block_size,
                                        config.attention_key_block_size, name='self_attention')
    x_BxLxD = _Residual(config, name='self_attention_residual')(
        x_BxLxD, lambda y: self_attention(y, y, mask=self_mask, positions=hooks, q_positions_BxLq=positions_1xL,
                                          k_positions_BxLk=positions_1xL, shared=shared,
                                          causal=self.causal, deterministic=deterministic), deterministic)
    if self.cross_attention:
      cross = MultiHeadAttention(config.num_heads, config.attention_dropout_rate, config.attention_block_size,
                                 config.attention_key_block_size, name='cross_attention')
      cross_hooks = VARIANTS[config.position.kind].layer(
          **_hook_fields(config, self.num_layers, self.causal, self.has_cls),
          name='cross_position') if config.aligned_cross_attention else None
      x_BxLxD = _Residual(config, name='cross_attention_residual')(
          x_BxLxD, lambda y: cross(y, memory_BxLsxD, mask=memory_mask, positions=cross_hooks,
                                   q_positions_BxLq=positions_1xL, k_positions_BxLk=positions_1xL,
                                   shared=shared, deterministic=deterministic),
          deterministic)
    feed_forward = FeedForward(config.feed_forward_dim, config.activation, config.dropout_rate,
                               name='feed_forward')
    return _Residual(config, name='feed_forward_residual')(
        x_BxLxD, lambda y: feed_forward(y, deterministic), deterministic)


class TransformerStack(nn.Module):
  """Embedded inputs -> positional embed hook -> N layers (sharing the stack's shared terms)."""
  config: ModelConfig
  num_layers: int
  causal: bool
  cross_attention: bool = False
  has_cls: bool = False

  @nn.compact
  def __call__(self, x_BxLxD: chex.Array, *, valid_BxL: Optional[chex.Array] = None,
               memory_BxLsxD: Optional[chex.Array] = None, memory_valid_BxLs: Optional[chex.Array] = None,
               deterministic: bool = True) -> chex.Array:
    config = self.config
    chex.assert_rank(x_BxLxD, 3)
    chex.assert_axis_dimension(x_BxLxD, 2, config.model_dim)
    length = x_BxLxD.shape[1]
    positions_1xL = np.arange(length, dtype=np.int32)[None]  # a constant: hooks see consecutive positions while tracing
    hooks = VARIANTS[config.position.kind].stack(
        **_hook_fields(config, self.num_layers, self.causal, self.has_cls), name='position')
    x_BxLxD = hooks.embed(x_BxLxD, positions_1xL).astype(config.dtype)  # a float32 table would promote
    x_BxLxD = Dropout(config.dropout_rate)(x_BxLxD, deterministic)
    shared = hooks.shared(positions_1xL, positions_1xL)
    self_mask = self_attention_mask(valid_BxL, length, self.causal)
    memory_mask = None
    if self.cross_attention:
      memory_mask = cross_attention_mask(memory_valid_BxLs)
      if config.aligned_cross_attention:
        if memory_BxLsxD.shape[1] != length:
          raise ValueError(f'aligned_cross_attention: source length {memory_BxLsxD.shape[1]} differs from '
                           f'target length {length}; valid: aligned sequences of equal length')
        mask = causal_mask(length)
        memory_mask = mask if memory_mask is None else jnp.logical_and(mask, memory_mask)
    # With remat, a layer's activations are recomputed in the backward pass instead of stored:
    # memory per layer falls to its inputs, for about one more forward pass of compute.
    layer_type = nn.remat(TransformerLayer, static_argnums=(7,)) if config.remat else TransformerLayer
    for index in range(self.num_layers):
      x_BxLxD = layer_type(config, self.num_layers, self.causal, self.cross_attention, self.has_cls,
                           name=f'layer_{index}')(
          x_BxLxD, self_mask, positions_1xL, shared, memory_BxLsxD, memory_mask, deterministic)
    if config.norm == 'pre':
      x_BxLxD = LayerNorm(config.layer_norm_eps, name='final_norm')(x_BxLxD)
    chex.assert_shape(x_BxLxD, (None, length, config.model_dim))
    return x_BxLxD
