"""Frozen dataclasses that the library takes, validated on construction, and model presets."""

import dataclasses
import math
from typing import Optional

import jax.numpy as jnp

from transformer.attention_core import IMPLEMENTATIONS
from transformer.layers import ACTIVATIONS, GATED_ACTIVATIONS, NORM_TYPES
from transformer.positions import VARIANTS
from transformer.positions.base import Settings, Variant, require

ARCHITECTURES = ('transformer', 'lstm', 'rnn')
NORMS = ('post', 'pre', 'output')
POOLINGS = ('cls', 'mean', 'last')
ACTIVATION_NAMES = (*ACTIVATIONS, *GATED_ACTIVATIONS)
COMPUTE_DTYPES = ('float32', 'bfloat16')
REMAT_POLICIES = ('none', 'block', 'matmuls')  # transformer/blocks.py: what a layer keeps for its backward pass

@dataclasses.dataclass(frozen=True, init=False)
class PositionConfig:
  """Which positional encoding and its settings: the kind is resolved to its variant here, once.

    PositionConfig('rope', rope_base=500.0)   # the variant's own fields only; the rest its defaults
  """
  kind: str
  settings: Settings  # an instance of VARIANTS[kind].settings

  def __init__(self, kind: str = 'sinusoidal', **fields):
    require(kind in VARIANTS, 'position.kind', kind, ', '.join(sorted(VARIANTS)))
    variant = VARIANTS[kind]
    names = variant.setting_names()
    for name in fields:
      require(name in names, f'position.{name}', fields[name],
               f'not a setting of {kind}, whose settings are: {", ".join(names) or "(none)"}')
    object.__setattr__(self, 'kind', kind)
    object.__setattr__(self, 'settings', variant.settings(**fields))

  @property
  def variant(self) -> Variant:
    return VARIANTS[self.kind]

  @property
  def shift_invariant(self) -> bool:
    """Whether these settings of the variant claim shift invariance (Variant.shift_invariant, unless the
    settings decide it)."""
    claim = self.settings.shift_invariant_claim()
    return self.variant.shift_invariant if claim is None else claim

  def check_attention(self, num_heads: int, head_dim: int, causal: bool) -> None:
    """ValueError for an attention this variant cannot serve: bidirectional for a causal-only variant,
    then the variant's own shape rules (Settings.check_attention)."""
    bidirectional_kinds = ', '.join(kind for kind, variant in VARIANTS.items() if not variant.causal_only)
    require(causal or not self.variant.causal_only, 'position.kind', self.kind,
            f'in bidirectional attention (an encoder) one of {bidirectional_kinds}; {self.kind} is causal only')
    self.settings.check_attention(num_heads, head_dim, causal)

  @property
  def rolling_cache(self) -> bool:
    """Whether a sliding layer with this position decodes through a rolling cache of its last W keys: unless the
    variant (or a part of the pattern) keeps every earlier token's data in a cache of its own (Variant)."""
    if self.kind == 'layer_pattern':
      return all(self.settings.parts[kind].rolling_cache for kind in self.settings.distinct())
    return self.variant.rolling_cache

  def fields(self) -> dict:
    """{'kind': ..., and every setting}: the flat form of model.position in configs and run records."""
    return {'kind': self.kind, **dataclasses.asdict(self.settings)}


LAYER_TYPES = ('full', 'sliding', 'chunked')
QK_NORMS = ('none', 'head', 'projection')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every model kind reads this; defaults are the base model of Vaswani et al. 2017."""
  vocab_size: int = 256
  model_dim: int = 512
  num_heads: int = 8
  head_width: int = 0                # each attention head's width K; 0: model_dim / num_heads (Gemma 3, Qwen3:
  #                                    wider heads than the width divides into)
  num_kv_heads: int = 0              # key and value heads, a divisor of num_heads: grouped-query attention
  #                                    (Ainslie et al. 2023), 1 multi-query; 0: num_heads (multi-head)
  feed_forward_dim: int = 2048
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  activation: str = 'relu'
  norm: str = 'post'                 # 'post' as in the paper, 'pre' for stability when deep, 'output': the norm on
  #                                    each sublayer's output, x + LN(F(x)), and a final one (OLMo 2)
  norm_type: str = 'layernorm'       # 'layernorm' as in the paper, or 'rmsnorm' (Llama's)
  layer_norm_eps: float = 1e-6       # the epsilon of either norm (Llama 1 1e-6; Llama 2, SmolLM2 1e-5)
  use_bias: bool = True              # biases on every projection and the feed-forward
  qkv_bias: bool = False             # biases on the query, key and value projections even without use_bias (Qwen2)
  attention_output_bias: bool = False  # a bias on attention's output projection even without use_bias (Llama's
  #                                    attention_bias, with qkv_bias)
  feed_forward_bias: bool = False    # biases on the feed-forward's projections even without use_bias (Llama's mlp_bias)
  parallel_residual: bool = False    # pre-LN x + Attention(LN1(x)) + FFN(LN2(x)) (GPT-J, GPT-NeoX); decoder-only
  scale_embeddings: bool = True      # multiply token embeddings by sqrt(model_dim), as in the paper
  tie_embeddings: bool = True        # output logits = x E^T with the input embedding table E
  position: PositionConfig = dataclasses.field(default_factory=PositionConfig)
  architecture: str = 'transformer'  # or the recurrent baselines 'lstm', 'rnn'
  bidirectional: bool = True         # recurrent encoders: read both directions
  num_outputs: int = 2               # encoder-only: classes, or regression targets
  pooling: str = 'cls'               # encoder-only: a learned [CLS] token, the last valid position, or the mean
  input_features: int = 0            # encoder-only: > 0 reads B x L x F floats instead of token ids
  remat: str = 'none'                # recompute layer activations in the backward pass: 'block' (all of them) or
  #                                    'matmuls' (all but the matmuls' outputs); 'none' keeps them
  compute_dtype: str = 'float32'     # activations and matmuls; parameters, softmax, norms and logits stay float32
  attention_block_size: int = 0      # > 0: causal attention over longer sequences runs this many queries
  #                                    at a time, the keys after them skipped; 0: one L x L softmax
  attention_key_block_size: int = 0  # with blocks: keys per block of an online softmax, in every layer
  #                                    (bidirectional too: memory bounded by the blocks); 0: all keys at once
  aligned_cross_attention: bool = False  # encoder-decoder with source and target aligned position by
  #                                    position (SAINT): cross-attention is causal and gets the variant's hooks
  randomized_max_length: int = 0     # > 0: positions are a sorted random subset of [0, this) (Ruoss et al.
  #                                    2023; positions/randomized.py), from the 'positions' rng; 0: 0 .. L-1
  attention_implementation: str = 'auto'  # the attention core: auto, explicit, blockwise, xla, cudnn
  #                                    (attention_core.py); anything but auto is refused where it cannot run
  layer_types: str = 'full'          # what each layer attends to, a comma-separated cycle over the stack: full,
  #                                    sliding (the sliding_window keys up to the query) or chunked (its chunk)
  sliding_window: int = 0            # W: a sliding layer's query sees itself and the W - 1 keys before it
  attention_chunk_size: int = 0      # C: a chunked layer's query sees the keys of its chunk of C positions
  qk_norm: str = 'none'              # RMSNorm of queries and keys before the rotation: 'head' (each head's width:
  #                                    Qwen3, Gemma 3), 'projection' (the whole projection: OLMo 2) or 'none'
  final_logit_softcap: float = 0.0   # c > 0: output logits c tanh(x / c) (Gemma 2); 0: none
  logit_scale: float = 1.0           # output logits multiplied by it, before any cap (Cohere's logit_scale)
  attention_softcap: float = 0.0     # c > 0: attention logits c tanh(x / c) before the softmax (Gemma 2); 0: none
  attention_sinks: bool = False      # a learned logit per head and layer in every softmax denominator (GPT-OSS)
  query_scale: float = 0.0           # > 0: attention logits scaled by its inverse square root (Gemma's
  #                                    query_pre_attn_scalar); 0: 1/sqrt(head width)
  sandwich_norm: bool = False        # pre-LN with a norm after each sublayer too: x + LN'(F(LN(x))) (Gemma 2, 3)
  local_position: Optional[PositionConfig] = None  # the position of the sliding and chunked layers; None:
  #                                    model.position (Gemma 3: RoPE base 1e4 local, 1e6 global)

  def __post_init__(self):
    for name in ('vocab_size', 'model_dim', 'num_heads', 'feed_forward_dim', 'num_outputs'):
      require(getattr(self, name) > 0, name, getattr(self, name), 'a positive integer')
    for name in ('num_encoder_layers', 'num_decoder_layers', 'input_features', 'attention_block_size',
                 'attention_key_block_size', 'randomized_max_length'):
      require(getattr(self, name) >= 0, name, getattr(self, name), 'an integer >= 0')
    require(self.head_width >= 0, 'head_width', self.head_width, 'an integer >= 0 (0: model_dim / num_heads)')
    require(self.head_width or self.model_dim % self.num_heads == 0, 'num_heads', self.num_heads,
            f'a divisor of model_dim={self.model_dim} (or set head_width)')
    require(self.num_kv_heads >= 0 and self.num_heads % max(self.num_kv_heads, 1) == 0, 'num_kv_heads',
            self.num_kv_heads, f'a divisor of num_heads={self.num_heads} (or 0: num_heads, multi-head attention)')
    for name in ('dropout_rate', 'attention_dropout_rate'):
      require(0.0 <= getattr(self, name) < 1.0, name, getattr(self, name), 'a rate in [0, 1)')
    require(self.activation in ACTIVATION_NAMES, 'activation', self.activation, ', '.join(ACTIVATION_NAMES))
    require(self.norm in NORMS, 'norm', self.norm, ', '.join(NORMS))
    require(self.norm_type in NORM_TYPES, 'norm_type', self.norm_type, ', '.join(NORM_TYPES))
    require(self.layer_norm_eps > 0.0, 'layer_norm_eps', self.layer_norm_eps, 'a positive number')
    require(not self.parallel_residual or self.norm == 'pre', 'parallel_residual', self.parallel_residual,
            f"False with norm='{self.norm}' (the parallel residual reads each sublayer's own pre-LN of x)")
    require(self.pooling in POOLINGS, 'pooling', self.pooling, ', '.join(POOLINGS))
    require(self.remat in REMAT_POLICIES, 'remat', self.remat, ', '.join(REMAT_POLICIES))
    require(self.compute_dtype in COMPUTE_DTYPES, 'compute_dtype', self.compute_dtype, ', '.join(COMPUTE_DTYPES))
    require(self.architecture in ARCHITECTURES, 'architecture', self.architecture, ', '.join(ARCHITECTURES))
    require(self.attention_implementation in IMPLEMENTATIONS, 'attention_implementation',
            self.attention_implementation, ', '.join(IMPLEMENTATIONS))
    self._check_layer_types()
    require(self.qk_norm in QK_NORMS, 'qk_norm', self.qk_norm, ', '.join(QK_NORMS))
    require(math.isfinite(self.logit_scale) and self.logit_scale > 0.0, 'logit_scale', self.logit_scale,
            'a finite number > 0 (1: the logits as they are)')
    for name in ('final_logit_softcap', 'attention_softcap', 'query_scale'):
      value = getattr(self, name)
      require(math.isfinite(value) and value >= 0.0, name, value, 'a finite number >= 0 (0: off)')
    require(not self.sandwich_norm or self.norm == 'pre', 'sandwich_norm', self.sandwich_norm,
            f"False with norm='{self.norm}' (the sandwich adds a norm after each sublayer of a pre-LN block)")
    self._check_local_position()
    rows = self.position.settings.longest_sequence()
    require(rows is None or self.randomized_max_length <= rows, 'randomized_max_length', self.randomized_max_length,
            f'0 (off) or at most position.max_length={rows}, the rows of the {self.position.kind} table that '
            f'randomized positions index')

  def _check_layer_types(self):
    types = self.layer_type_cycle
    require(all(kind in LAYER_TYPES for kind in types), 'layer_types', self.layer_types,
            f'a comma-separated cycle of {", ".join(LAYER_TYPES)}')
    for name in ('sliding_window', 'attention_chunk_size'):
      require(getattr(self, name) >= 0, name, getattr(self, name), 'an integer >= 0')
    require('sliding' not in types or self.sliding_window > 0, 'sliding_window', self.sliding_window,
            f'a positive number of keys with layer_types={self.layer_types!r}')
    require('chunked' not in types or self.attention_chunk_size > 0, 'attention_chunk_size',
            self.attention_chunk_size, f'a positive number of positions with layer_types={self.layer_types!r}')
    require(types == ('full',) or not self.randomized_max_length, 'randomized_max_length', self.randomized_max_length,
            f'0 with layer_types={self.layer_types!r} (a window counts positions, and randomized ones skip some)')

  def _check_local_position(self):
    if self.local_position is None:
      return
    require(isinstance(self.local_position, PositionConfig), 'local_position', self.local_position,
            'a PositionConfig, or None (the local layers take model.position)')
    require(self.layer_type_cycle != ('full',), 'local_position', self.local_position.kind,
            f'None with layer_types={self.layer_types!r} (no layer is sliding or chunked)')
    for name, position in (('position', self.position), ('local_position', self.local_position)):
      require(not position.variant.embeds, f'{name}.kind', position.kind,
              'with model.local_position, a variant that does not add to the token embeddings (an embedding acts '
              'once per stack, not in the local layers alone)')

  def layer_position(self, index: int) -> PositionConfig:
    """The position of layer `index`: model.local_position in a sliding or chunked layer where it is set, else
    model.position."""
    if self.local_position is not None and self.layer_type(index) != 'full':
      return self.local_position
    return self.position

  @property
  def layer_type_cycle(self) -> tuple:
    return tuple(kind.strip() for kind in self.layer_types.split(','))

  def layer_type(self, index: int) -> str:
    """What layer `index` of a stack attends to: full, sliding or chunked."""
    types = self.layer_type_cycle
    return types[index % len(types)]

  @property
  def dtype(self):
    return jnp.dtype(self.compute_dtype)

  @property
  def head_dim(self) -> int:
    """K, each attention head's width: head_width, or model_dim / num_heads."""
    return self.head_width or self.model_dim // self.num_heads

  @property
  def key_value_heads(self) -> int:
    """G, the key and value heads (num_kv_heads, or num_heads where it is 0)."""
    return self.num_kv_heads or self.num_heads

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
