"""The one narrow interface through which every positional encoding reaches the model.

A variant is a pair of Linen modules; every hook defaults to "no position information", and a
variant overrides only the hooks it needs. Attention calls every hook the same way, whatever the
variant, and never branches on the variant's name.

  StackPositions (one per encoder or decoder stack, called once per forward pass)
    embed(x, positions)          add a vector to the token embeddings        sinusoidal, learned
    shared(q_pos, k_pos)         terms that no layer owns (a pytree), handed  TUPE, shared T5
                                 unchanged to every layer
  LayerPositions (one per self-attention layer)
    from_inputs(x, shared,       the layer's own terms read from its input     FoX
      use_cache, cache_index)    (a data-dependent gate), returned as the
                                 shared terms its other hooks then receive
    rotate(q, k, q_pos, k_pos)   transform queries and keys by position        RoPE
    logits(q, k, q_pos, k_pos, shared, scale)
                                 a term added to the scaled logits QK^T*scale  ALiBi, T5, TUPE, Shaw,
                                 (it may read the keys)                        KERPLE, FIRE
    values(weights, q_pos, k_pos)
                                 a term added to the attention output         Shaw
    needs_weights()              values() reads the attention weights, so     Shaw
                                 attention must materialise them
    needs_all_keys()             logits() reads all of a query's keys at      CoPE
                                 once, so no key blocks
    scale()                      the logit scale (None: 1/sqrt(head_dim))    TUPE: 1/sqrt(2d)
    causal_band()                an object whose terms blockwise causal      Shaw
                                 attention may use on a band of keys only
    kernel_term(kernel_shared,   logits() as a function of positions and a   ALiBi, T5, KERPLE,
      shared)                    few numbers per head (and per token), which FoX
                                 a fused kernel computes inside
                                 (flash_attention.py)
    kernel_serves()              whether such a kernel gives this layer's     + none, the rotary ones
                                 attention (no term, or kernel_term's)
    weights_rule()               the weights from the logits when they are    stick-breaking
                                 not a softmax (attention_request.WeightsRule)
  StackPositions.kernel_shared() parameters the layers' kernel terms read     shared T5 table
                                 that no layer owns

A variant is one file: its hooks, its `Settings` (a frozen dataclass whose fields are its knobs,
`model.position.<field>` in the configs, each validated with the field, the value and what is
valid), and one `Variant` that names them with the paper. `VARIANTS` in __init__.py lists them;
`PositionConfig` (config.py) resolves a kind to its variant once and holds its settings, which the
hooks receive as `settings`.

Positions are integer arrays of shape B x L (B may be 1, broadcast over the batch). Cross-attention
gets no hooks, unless the model's source and target are aligned step by step
(ModelConfig.aligned_cross_attention): then a second set of layer hooks, with the decoder's shared
terms, relates target step i to source step j as self-attention would.
"""

import dataclasses
import math
from typing import Any, Optional

import chex
import flax.linen as nn

from transformer.flash_attention import KernelTerm

Shared = Any  # whatever pytree a StackPositions.shared returns; None when there is nothing


def require(condition: bool, field: str, value, valid: str) -> None:
  """ValueError naming the field, the value it got and what would be valid, unless condition."""
  if not condition:
    raise ValueError(f'{field}: got {value!r}; valid: {valid}')


@dataclasses.dataclass(frozen=True)
class Settings:
  """A variant's knobs: subclasses add fields (a default and a comment each) and override the
  checks. This base holds the settings every variant has: scalable softmax (ssmax.py) and Llama 4's temperature
  tuning (temperature.py), which combine with any of them."""
  ssmax: bool = False               # scalable softmax: queries times s_h log n (Nakanishi 2025), any variant
  ssmax_initial_scale: float = 0.43  # s_h at initialisation, learned per head and layer
  temperature_scale: float = 0.0    # Llama 4's attn_scale (0.1): queries times its temperature (temperature.py); 0 off
  temperature_floor: int = 8192     # Llama 4's floor_scale: the temperature stays 1 below this position

  def __post_init__(self):
    require(isinstance(self.ssmax, bool), 'position.ssmax', self.ssmax, 'true or false')
    require(math.isfinite(self.ssmax_initial_scale) and self.ssmax_initial_scale > 0,
            'position.ssmax_initial_scale', self.ssmax_initial_scale, 'a finite number > 0')
    require(self.temperature_scale >= 0.0, 'position.temperature_scale', self.temperature_scale,
            'a number >= 0 (0: off)')
    require(self.temperature_floor > 0, 'position.temperature_floor', self.temperature_floor, 'a positive integer')
    self.check()

  def check(self) -> None:
    """Raise ValueError (require) for a field whose value the variant cannot use."""

  def check_attention(self, num_heads: int, head_dim: int, causal: bool) -> None:
    """Raise ValueError for an attention the variant cannot serve (head shape, bidirectional, ...)."""
    del num_heads, head_dim, causal

  def longest_sequence(self) -> Optional[int]:
    """The longest sequence the variant can represent; None: any length (it extrapolates)."""
    return None

  def check_positions(self, largest: int) -> None:
    """Raise ValueError (require) when positions 0 .. largest take the variant's float32 arithmetic out of
    range (xPos's scales); by default they never do."""
    del largest

  def shift_invariant_claim(self) -> Optional[bool]:
    """The claim of shift invariance when it depends on the settings (a pattern of variants by layer, the
    temperature, which reads absolute positions); None: the variant's own (Variant.shift_invariant)."""
    return False if self.temperature_scale else None

  def shift_invariant_below(self) -> Optional[int]:
    """Where the variant's claim of shift invariance (Variant.shift_invariant) ends: it holds while every
    position is below this; None: at every position."""
    return None


class StackPositions(nn.Module):
  """Stack-level hooks. The base class carries no position information (NoPE)."""
  settings: Settings  # the variant's own settings
  num_heads: int
  head_dim: int
  model_dim: int
  num_layers: int
  causal: bool
  has_cls: bool = False

  def embed(self, x_BxLxD: chex.Array, positions_BxL: chex.Array) -> chex.Array:
    del positions_BxL
    return x_BxLxD

  def shared(self, q_positions_BxLq: chex.Array, k_positions_BxLk: chex.Array) -> Shared:
    del q_positions_BxLq, k_positions_BxLk
    return None

  def kernel_shared(self) -> Shared:
    """Parameters that no layer owns and the layers' kernel terms read (T5's shared table); None for none."""
    return None

  def masked(self, shared: Shared, mask_Bx1xLqxLk: chex.Array) -> Shared:
    """The shared terms of a call whose rows pack several documents, given its self-attention mask (True:
    attend), for a variant whose terms depend on which keys a query sees (CoPE's gates); by default the
    shared terms as they are."""
    del mask_Bx1xLqxLk
    return shared


class LayerPositions(nn.Module):
  """Per-self-attention-layer hooks. The base class leaves attention untouched."""
  settings: Settings  # the variant's own settings
  num_heads: int
  head_dim: int
  model_dim: int
  num_layers: int
  causal: bool
  has_cls: bool = False
  layer_index: int = 0  # which self-attention layer of its stack (0 first): a pattern by layer reads it
  num_kv_heads: int = 0  # the attention's key and value heads G (0: num_heads); query head h reads h // (H / G)

  @property
  def key_value_heads(self) -> int:
    """G: the key and value heads that rotate() and logits() receive (the queries have num_heads)."""
    return self.num_kv_heads or self.num_heads

  def from_inputs(self, inputs_BxLqxD: chex.Array, shared: Shared, use_cache: bool = False,
                  cache_index: Optional[chex.Array] = None) -> Shared:
    """The shared terms this layer's logits() and kernel_term() receive, given the layer's input (the
    queries' side, after the layer's norm): by default the stack's, unchanged. A variant whose terms depend
    on the content (FoX's forget gates) computes them here, per token. With use_cache (incremental
    decoding) the first call (cache_index None) sees the cache's whole capacity and later calls the tokens
    fed from cache_index on: a variant that needs the earlier tokens' terms keeps them in the 'cache'
    collection."""
    del inputs_BxLqxD, use_cache, cache_index
    return shared

  def rotate(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, sequence_length=None):
    """Queries and keys as the variant rotates or scales them. sequence_length: AttentionPositions'. The keys
    (here and in logits) have key_value_heads heads, fewer than the queries' with grouped-query attention."""
    del q_positions_BxLq, k_positions_BxLk, sequence_length
    return query_BxLqxHxK, key_BxLkxHxK

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared: Shared,
             scale: float) -> Optional[chex.Array]:
    """A term broadcastable to B x H x Lq x Lk, added after QK^T has been scaled; None for none. It may
    read the (rotated) queries and keys: Transformer-XL's content bias u.k_j, CoPE's gates on q.k."""
    del query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale
    return None

  def values(self, weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk) -> Optional[chex.Array]:
    """A term B x Lq x H x K added to the attention output; None for none."""
    del weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk
    return None

  def scale(self) -> Optional[float]:
    """The logit scale; None means the default 1/sqrt(head_dim)."""
    return None

  def needs_weights(self) -> bool:
    """True when values() reads the attention weights (which a fused attention never forms)."""
    return False

  def needs_all_keys(self) -> bool:
    """True when logits() must see every key a query attends to at once (CoPE's sums over the keys):
    blockwise attention then gives each query block its keys in one block, never in key blocks."""
    return False

  def kernel_term(self, kernel_shared: Shared, shared: Shared = None) -> Optional[KernelTerm]:
    """logits() as a KernelTerm (a function of one head's parameters and the positions of a block of
    queries and keys, and of a number per query and key: FoX's) for a kernel that computes it inside;
    None when the layer adds no term. shared: what from_inputs returned (the stack's terms are not computed
    for a kernel)."""
    del kernel_shared, shared
    return None

  def kernel_serves(self) -> bool:
    """Whether attention with kernel_term() computed inside a kernel is this layer's attention: by
    default where the layer adds no logits or values term; a variant that writes kernel_term says so."""
    return type(self).logits is LayerPositions.logits and not self.needs_weights() and self.weights_rule() is None

  def weights_rule(self) -> Optional[Any]:
    """None: the weights are softmax(logits). Otherwise an attention_request.WeightsRule (stick-breaking),
    which the explicit and blockwise cores apply in its place and the fused ones refuse."""
    return None

  def causal_band(self) -> Optional[Any]:
    """None, or an object that lets causal blockwise attention add this layer's terms on a band of
    keys next to each query block only (attributes width, logits, values, value_offset: Shaw's band
    in shaw.py says what each means)."""
    return None


def module_fields(module: nn.Module) -> dict:
  """The interface fields of a hooks module, to build a sibling or a part with the same ones."""
  interface = LayerPositions if isinstance(module, LayerPositions) else StackPositions
  return {f.name: getattr(module, f.name) for f in dataclasses.fields(interface) if f.name not in ('parent', 'name')}


def relative_positions(q_positions_BxLq: chex.Array, k_positions_BxLk: chex.Array) -> chex.Array:
  """r_ij = pos_k[j] - pos_q[i]: B x Lq x Lk (negative for keys in the past)."""
  chex.assert_rank([q_positions_BxLq, k_positions_BxLk], 2)
  return k_positions_BxLk[:, None, :] - q_positions_BxLq[:, :, None]


def default_scale(head_dim: int) -> float:
  return 1.0 / math.sqrt(head_dim)


@dataclasses.dataclass(frozen=True)
class Variant:
  """One row of the table of variants."""
  stack: type[StackPositions]
  layer: type[LayerPositions]
  paper: str
  settings: type[Settings] = Settings
  shift_invariant: bool = False  # the paper's claim: attention depends on positions only through i - j
  causal_only: bool = False  # serves causal attention only (decoders); bidirectional attention is refused
  rolling_cache: bool = True  # a sliding layer may decode through a rolling cache of its last W keys (False: the
  #                             layer keeps every earlier token's data in a cache of its own, so its keys stay too)

  def setting_names(self) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(self.settings))

  @property
  def embeds(self) -> bool:
    """Whether the variant adds to the token embeddings (a stack's embed hook): once per stack, never by layer."""
    return self.stack.embed is not StackPositions.embed

  def own_settings(self, fields: dict) -> dict:
    """The entries of `fields` that are this variant's settings (the rest belong to others)."""
    names = self.setting_names()
    return {name: value for name, value in fields.items() if name in names}
