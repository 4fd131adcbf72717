"""Frozen dataclasses that the library takes, validated on construction, and model presets."""

import dataclasses
from typing import Optional

import jax.numpy as jnp

ARCHITECTURES = ('transformer', 'lstm', 'rnn')
NORMS = ('post', 'pre')
POOLINGS = ('cls', 'mean', 'last')
ACTIVATION_NAMES = ('relu', 'gelu')
ABSOLUTE_TABLES = ('sinusoidal', 'learned')
COMPUTE_DTYPES = ('float32', 'bfloat16')


def _require(condition: bool, field: str, value, valid: str) -> None:
  if not condition:
    raise ValueError(f'{field}: got {value!r}; valid: {valid}')


@dataclasses.dataclass(frozen=True)
class PositionConfig:
  """Which positional encoding, and the knobs of every variant (each reads only its own)."""
  kind: str = 'sinusoidal'           # a key of transformer.positions.VARIANTS
  max_length: int = 512              # learned: rows of the absolute table (and TUPE's, if learned)
  sinusoidal_base: float = 10000.0   # sinusoidal / TUPE's sinusoidal table: wavelength base
  rope_base: float = 10000.0         # rope: theta_i = base^(-2i/d)
  clip_distance: int = 16            # shaw: k, relative distances clipped to [-k, k]
  per_head: bool = False             # shaw: one a^K, a^V table per head instead of shared
  num_buckets: int = 32              # t5 / tupe_r: relative-position buckets
  max_distance: int = 128            # t5 / tupe_r: distance of the last (log-spaced) bucket
  shared_across_layers: bool = True  # t5 / tupe_r: one bias for all layers, or one per layer
  absolute_table: str = 'sinusoidal'  # tupe: p_i from a fixed sinusoidal or a learned table
  cls_reset: bool = True             # tupe: reset the [CLS] row/column (encoders with a CLS token)

  def __post_init__(self):
    for name in ('max_length', 'clip_distance', 'num_buckets', 'max_distance'):
      _require(getattr(self, name) > 0, f'position.{name}', getattr(self, name), 'a positive integer')
    for name in ('sinusoidal_base', 'rope_base'):
      _require(getattr(self, name) > 1.0, f'position.{name}', getattr(self, name), 'a number > 1')
    _require(self.num_buckets % 2 == 0, 'position.num_buckets', self.num_buckets,
             'an even number (half the buckets for each direction in encoders)')
    _require(self.absolute_table in ABSOLUTE_TABLES, 'position.absolute_table', self.absolute_table,
             ', '.join(ABSOLUTE_TABLES))
    from transformer.positions import VARIANTS  # pylint: disable=g-import-not-at-top
    _require(self.kind in VARIANTS, 'position.kind', self.kind, ', '.join(sorted(VARIANTS)))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every model kind reads this; defaults are the base model of Vaswani et al. 2017."""
  vocab_size: int = 256
  model_dim: int = 512
  num_heads: int = 8
  feed_forward_dim: int = 2048
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  activation: str = 'relu'
  norm: str = 'post'                 # 'post' as in the paper, 'pre' for stability when deep
  layer_norm_eps: float = 1e-6
  scale_embeddings: bool = True      # multiply token embeddings by sqrt(model_dim), as in the paper
  tie_embeddings: bool = True        # output logits = x E^T with the input embedding table E
  position: PositionConfig = dataclasses.field(default_factory=PositionConfig)
  architecture: str = 'transformer'  # or the recurrent baselines 'lstm', 'rnn'
  bidirectional: bool = True         # recurrent encoders: read both directions
  num_outputs: int = 2               # encoder-only: classes, or regression targets
  pooling: str = 'cls'               # encoder-only: a learned [CLS] token, the last valid position, or the mean
  input_features: int = 0            # encoder-only: > 0 reads B x L x F floats instead of token ids
  remat: bool = False                # recompute each layer's activations in the backward pass (saves memory)
  compute_dtype: str = 'float32'     # activations and matmuls; parameters, softmax, norms and logits stay float32
  attention_block_size: int = 0      # > 0: causal attention over longer sequences runs this many queries
  #                                    at a time, the keys after them skipped; 0: one L x L softmax
  attention_key_block_size: int = 0  # with blocks: keys per block of an online softmax, in every layer
  #                                    (bidirectional too: memory bounded by the blocks); 0: all keys at once
  aligned_cross_attention: bool = False  # encoder-decoder with source and target aligned position by
  #                                    position (SAINT): cross-attention is causal and gets the variant's hooks

  def __post_init__(self):
    for name in ('vocab_size', 'model_dim', 'num_heads', 'feed_forward_dim', 'num_outputs'):
      _require(getattr(self, name) > 0, name, getattr(self, name), 'a positive integer')
    for name in ('num_encoder_layers', 'num_decoder_layers', 'input_features', 'attention_block_size',
                 'attention_key_block_size'):
      _require(getattr(self, name) >= 0, name, getattr(self, name), 'an integer >= 0')
    _require(self.model_dim % self.num_heads == 0, 'num_heads', self.num_heads,
             f'a divisor of model_dim={self.model_dim}')
    for name in ('dropout_rate', 'attention_dropout_rate'):
      _require(0.0 <= getattr(self, name) < 1.0, name, getattr(self, name), 'a rate in [0, 1)')
    _require(self.activation in ACTIVATION_NAMES, 'activation', self.activation, ', '.join(ACTIVATION_NAMES))
    _require(self.norm in NORMS, 'norm', self.norm, ', '.join(NORMS))
    _require(self.pooling in POOLINGS, 'pooling', self.pooling, ', '.join(POOLINGS))
    _require(self.compute_dtype in COMPUTE_DTYPES, 'compute_dtype', self.compute_dtype, ', '.join(COMPUTE_DTYPES))
    _require(self.architecture in ARCHITECTURES, 'architecture', self.architecture, ', '.join(ARCHITECTURES))
    if self.position.kind == 'rope':
      _require(self.head_dim % 2 == 0, 'model_dim', self.model_dim,
               'model_dim / num_heads even, since rope rotates pairs of dimensions')

  @property
  def dtype(self):
    return jnp.dtype(self.compute_dtype)

  @property
  def head_dim(self) -> int:
    return self.model_dim // self.num_heads

  def replace(self, **changes) -> 'ModelConfig':
    return dataclasses.replace(self, **changes)


def base_preset(position: Optional[PositionConfig] = None, **changes) -> ModelConfig:
  """The paper's base model: d_model 512, 8 heads of 64, d_ff 2048, 6 + 6 layers, dropout 0.1."""
  return ModelConfig(position=position or PositionConfig(), **changes)


def small_preset(position: Optional[PositionConfig] = None, **changes) -> ModelConfig:
  """A CPU-sized model: trains on a laptop in minutes."""
  fields = dict(model_dim=128, num_heads=4, feed_forward_dim=512, num_encoder_layers=2,
                num_decoder_layers=2, dropout_rate=0.0, norm='pre')
  fields.update(changes)
  return ModelConfig(position=position or PositionConfig(), **fields)


def tiny_preset(position: Optional[PositionConfig] = None, **changes) -> ModelConfig:
  """A test-sized model: compiles and runs in well under a second."""
  fields = dict(vocab_size=32, model_dim=32, num_heads=4, feed_forward_dim=64, num_encoder_layers=2,
                num_decoder_layers=2, dropout_rate=0.0, norm='pre')
  fields.update(changes)
  return ModelConfig(position=position or PositionConfig(), **fields)
