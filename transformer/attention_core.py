"""The attention cores, and the one place that decides which runs a self- or cross-attention call.

Every core takes an AttentionRequest (attention_request.py) and the layer's CoreSettings, and returns
an AttentionResult. A variant whose weights are not a softmax (stick-breaking) hands a WeightsRule, which
the explicit core applies to the logits and the blockwise core runs in its own blocks; the fused cores
(xla, cudnn, pallas) compute a softmax and refuse it.

  explicit   softmax(Q K^T scale + term) V with the weights formed (scaled_dot_product_attention): runs
             everywhere and serves everything (a values term, attention dropout, collected weights).
  blockwise  blocks of queries (and of keys), an online softmax (blockwise.py): memory bounded by the
             blocks, position terms per block (Shaw's values term too); needs model.attention_block_size
             > 0, and hands no weights back. Keys before a local layer's window or chunk are skipped; a local
             layer without position terms runs all its blocks at once (local_attention.py), a full causal
             layer without them a rolled loop of small tiles (tiled_attention.py).
  xla        jax.nn.dot_product_attention(implementation='xla'): one fused XLA computation; masks and
             position terms broadcast to B x H x Lq x Lk; never forms weights.
  cudnn      jax.nn.dot_product_attention(implementation='cudnn'): cuDNN's fused flash attention, on GPUs,
             in bfloat16 or float16, for variants that add no logits term (none, the rotary ones, the
             embedding ones), never forming weights.
  pallas     flash_attention.py: a Pallas flash attention kernel that computes the variant's term inside
             from positions and head (its kernel_term: ALiBi, T5, KERPLE; FoX from a number per token)
             or adds none; Triton on GPUs, Mosaic on TPUs, Pallas' interpreter elsewhere (slow: for
             tests). The mask must be the causal mask, the keys' padding, the documents and a local
             layer's window or chunk, given as such (not a cached decoding step's); the key blocks outside
             the window or chunk are never visited.

'auto' (model.attention_implementation's default) takes the first row of this table that holds for the
call (AUTO_RULES, in the same order; tests/test_attention_core.py reads this table):

  | core      | when                                                                           |
  |-----------|--------------------------------------------------------------------------------|
  | cudnn     | a GPU, half precision, no weights read, no values or logits term, a softmax    |
  | blockwise | blocks configured and paying (causal or key blocks, longer than a block), no   |
  |           | weights read by the caller                                                     |
  | xla       | a GPU, no weights read, no values term, a softmax                              |
  | explicit  | always                                                                         |

pallas runs only where asked for (docs/architecture.md says why auto leaves it). Any other choice is
taken as asked, or refused with a ValueError naming model.attention_implementation, what rules it out
and what would run.
"""

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from transformer.attention import fused_attention, scaled_dot_product_attention
from transformer.attention_request import AttentionRequest, AttentionResult, CoreSettings
from transformer.blockwise import blockwise_attention, shared_by_query_block
from transformer.flash_attention import flash_attention
from transformer.local_attention import banded_attention
from transformer.positions.relative import contiguous_offset
from transformer.tiled_attention import TILE, tiled_causal_attention

IMPLEMENTATIONS = ('auto', 'explicit', 'blockwise', 'xla', 'cudnn', 'pallas')
HALF_PRECISION = ('bfloat16', 'float16')


@dataclasses.dataclass(frozen=True)
class CallNeeds:
  """What one attention call needs from its core."""
  backend: str                 # jax.default_backend(): 'cpu', 'gpu', 'tpu'
  dtype: str                   # the queries' dtype name
  caller_weights: bool         # attention dropout or collected weights ('intermediates') read the weights
  values_term: bool            # the variant's values term reads the weights (Shaw; blocks serve it)
  position_term: bool          # the variant adds a logits term (a bias, or one that reads q and k)
  blocks_configured: bool      # model.attention_block_size > 0
  blocks_pay: bool             # blocks would skip work or bound memory here (causal or key blocks, long)
  kernel_serves: bool = False  # the variant adds no term, or one a kernel computes inside (kernel_term)
  mask_in_parts: bool = False  # the mask is None, or the causal mask, the keys' padding and documents given as such
  softmax: bool = True         # the weights are a softmax of the logits (not the variant's WeightsRule)
  softcap: bool = False        # the logits are soft-capped (model.attention_softcap)
  sinks: bool = False          # a sink logit per head joins the softmax (model.attention_sinks)


def _refusal(requested: str, reason: str, needs: CallNeeds) -> ValueError:
  return ValueError(f'model.attention_implementation: got {requested!r}, but {reason}; valid here: '
                    f'{", ".join(choice for choice in IMPLEMENTATIONS if _runs(choice, needs) is None)}')


def _runs(choice: str, needs: CallNeeds) -> Optional[str]:
  """None if the core can serve the call, else why not."""
  if choice in ('auto', 'explicit'):
    return None
  if choice == 'blockwise':
    if not needs.blocks_configured:
      return 'model.attention_block_size is 0 (blocks need a size)'
    if needs.caller_weights:
      return 'this call needs the attention weights (attention dropout or collected weights), which blocks never form'
    return None
  if not needs.softmax:
    return f'the positional variant\'s weights are not a softmax (its WeightsRule), which {choice} computes'
  if needs.caller_weights or needs.values_term:
    return f'this call needs the attention weights (a values term such as Shaw\'s, attention dropout or ' \
           f'collected weights), which {choice} never forms'
  if choice == 'pallas':
    if not needs.kernel_serves:
      return 'the positional variant\'s term is not one the kernel computes from positions and head (kernel_term)'
    if not needs.mask_in_parts:
      return ('the mask is not the causal mask, padding and documents given as such (a cached decoding step\'s, or '
              'another)')
    return None
  if choice in ('xla', 'cudnn') and needs.softcap:
    return 'the logits are soft-capped (model.attention_softcap), which jax.nn.dot_product_attention does not do'
  if choice == 'cudnn':
    if needs.sinks:
      return 'a sink logit (model.attention_sinks) would reach cuDNN as a materialised B x H x L x L bias'
    if needs.backend != 'gpu':
      return f'cuDNN runs on GPUs and this backend is {needs.backend}'
    if needs.dtype not in HALF_PRECISION:
      return f'cuDNN\'s fused attention takes bfloat16 or float16 and the compute dtype is {needs.dtype}'
    if needs.position_term:
      return 'the positional variant adds a logits term, which cuDNN would read as a materialised B x H x L x L bias'
  return None


# The rows of the module docstring's table, in its order: the first that holds is auto's choice.
AUTO_RULES: tuple[tuple[str, Callable[[CallNeeds], bool]], ...] = (
    ('cudnn', lambda needs: needs.backend == 'gpu' and _runs('cudnn', needs) is None),
    ('blockwise', lambda needs: needs.blocks_configured and needs.blocks_pay and not needs.caller_weights),
    ('xla', lambda needs: needs.backend == 'gpu' and _runs('xla', needs) is None),
    ('explicit', lambda needs: True),
)


def may_use_cudnn(needs: CallNeeds) -> bool:
  """Whether cuDNN could serve the call but for a position term (which the caller then computes to decide)."""
  return (needs.backend == 'gpu' and needs.dtype in HALF_PRECISION and not needs.caller_weights
          and not needs.values_term and needs.softmax)


def choose(requested: str, needs: CallNeeds) -> str:
  """The core for one call: 'explicit', 'blockwise', 'xla', 'cudnn' or 'pallas'."""
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f'model.attention_implementation: got {requested!r}; valid: {", ".join(IMPLEMENTATIONS)}')
  if requested != 'auto':
    reason = _runs(requested, needs)
    if reason is not None:
      raise _refusal(requested, reason, needs)
    return requested
  return next(core for core, holds in AUTO_RULES if holds(needs))


def call_needs(request: AttentionRequest, settings: CoreSettings) -> CallNeeds:
  """What this call needs, before anyone has computed its logits term (position_term False)."""
  query, key, positions = request.query_BxLqxHxK, request.key_BxLkxHxK, request.positions
  return CallNeeds(
      backend=settings.backend, dtype=jnp.dtype(query.dtype).name,
      caller_weights=settings.dropout_rng is not None or settings.collect_weights,
      values_term=positions is not None and positions.hooks.needs_weights(), position_term=False,
      blocks_configured=settings.block_size > 0,
      # Blocks pay where they skip work (causal: the keys after a block) or bound memory (key blocks);
      # bidirectional attention in query blocks alone only recomputes.
      blocks_pay=(request.mask.causal or settings.key_block_size > 0)
      and max(query.shape[1], key.shape[1]) > settings.block_size,
      kernel_serves=positions is None or positions.hooks.kernel_serves(),
      mask_in_parts=request.mask.given_as_parts, softmax=request.weights_rule is None,
      softcap=request.softcap > 0, sinks=request.sink_H is not None)


def explicit(request: AttentionRequest, settings: CoreSettings) -> AttentionResult:
  """softmax (or the variant's WeightsRule) with the weights formed: attention dropout, the values term,
  weights handed back."""
  rule, positions = request.weights_rule, request.positions
  weights_function = None if rule is None else (
      lambda logits, mask: rule.dense(logits, mask, positions.q_positions_BxLq, positions.k_positions_BxLk))
  output, weights = scaled_dot_product_attention(
      request.query_BxLqxHxK, request.key_BxLkxHxK, request.value_BxLkxHxV, mask=request.mask.mask,
      bias=request.logits_term, scale=request.scale, return_weights=True, dropout_rate=settings.dropout_rate,
      dropout_rng=settings.dropout_rng, deterministic=settings.dropout_rng is None, weights_function=weights_function,
      softcap=request.softcap, sink_H=request.sink_H)
  values_term = request.values_term(weights)
  if values_term is not None:
    output = output + values_term.astype(output.dtype)
  return AttentionResult(output, weights)


def _fused(implementation: str):
  def core(request: AttentionRequest, settings: CoreSettings) -> AttentionResult:
    del settings
    mask = request.mask
    return AttentionResult(fused_attention(
        request.query_BxLqxHxK, request.key_BxLkxHxK, request.value_BxLkxHxV, mask=mask.mask, bias=request.logits_term,
        scale=request.scale, implementation=implementation, sink_H=request.sink_H,
        mask_parts=(mask.causal, mask.key_valid_BxLk, mask.window)
        if mask.in_parts and mask.segments_BxL is None and not mask.chunk else None))
  core.__doc__ = (f'jax.nn.dot_product_attention(implementation={implementation!r}), the mask as its parts (a '
                  'sliding window as its local_window_size).')
  return core


def pallas(request: AttentionRequest, settings: CoreSettings) -> AttentionResult:
  """The Pallas kernel, the variant's kernel_term computed inside it (flash_attention.py)."""
  mask, positions = request.mask, request.positions
  return AttentionResult(flash_attention(
      request.query_BxLqxHxK, request.key_BxLkxHxK, request.value_BxLkxHxV,
      causal=mask.causal and mask.in_parts, key_valid_BxLk=mask.key_valid_BxLk if mask.in_parts else None,
      q_segments_BxLq=mask.segments_BxL if mask.in_parts else None,
      k_segments_BxLk=mask.segments_BxL if mask.in_parts else None,
      q_positions_BxLq=None if positions is None else positions.q_positions_BxLq,
      k_positions_BxLk=None if positions is None else positions.k_positions_BxLk,
      term=None if positions is None else positions.hooks.kernel_term(positions.kernel_shared, positions.shared),
      scale=request.scale, block_q=settings.block_size or 128,
      block_k=settings.key_block_size or settings.block_size or 128,
      platform=kernel_platform(settings.backend), window=mask.window if mask.in_parts else 0,
      chunk=mask.chunk if mask.in_parts else 0, softcap=request.softcap, sink_H=request.sink_H))


def _same_known_consecutive_positions(q_positions_BxLq, k_positions_BxLk) -> bool:
  """Whether queries and keys are the same run of positions, known while tracing."""
  consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
  return consecutive is True and offset == 0


def _banded(request: AttentionRequest, settings: CoreSettings) -> Optional[AttentionResult]:
  """A local layer's full pass (a window or chunk over causal attention) without position terms, every block at
  once (local_attention.py: its backward is O(L W) too); None where it does not apply."""
  mask, positions = request.mask, request.positions
  if not (mask.window or mask.chunk) or request.weights_rule is not None:
    return None
  if positions is not None and (positions.hooks.needs_weights() or positions.hooks.needs_all_keys()
                                or request.logits_term is not None):
    return None
  return AttentionResult(banded_attention(
      request.query_BxLqxHxK, request.key_BxLkxHxK, request.value_BxLkxHxV, scale=request.scale,
      window=mask.window, chunk=mask.chunk, block_size=settings.key_block_size or settings.block_size,
      key_valid_BxL=mask.key_valid_BxLk, segments_BxL=mask.segments_BxL, softcap=request.softcap,
      sink_H=request.sink_H))


def _tiled(request: AttentionRequest, settings: CoreSettings) -> Optional[AttentionResult]:
  """A full causal pass without position terms as a rolled loop of tiles of min(TILE, block size) queries and
  keys (tiled_attention.py; differentiated, the call is blockwise.py's); None where it does not apply."""
  mask, positions = request.mask, request.positions
  if not (mask.causal and mask.in_parts) or mask.window or mask.chunk or request.weights_rule is not None:
    return None
  # What the Pallas kernel relies on too: a layer it serves whose kernel term is None adds no term at all.
  if positions is not None and not (positions.hooks.kernel_serves() and positions.hooks.kernel_term(
      positions.kernel_shared, positions.shared) is None):
    return None
  return AttentionResult(tiled_causal_attention(
      request.query_BxLqxHxK, request.key_BxLkxHxK, request.value_BxLkxHxV, scale=request.scale,
      key_valid_BxL=mask.key_valid_BxLk, segments_BxL=mask.segments_BxL, softcap=request.softcap,
      sink_H=request.sink_H, tile=min(TILE, settings.block_size), backward_block_size=settings.block_size,
      backward_key_block_size=settings.key_block_size or None))


def blockwise(request: AttentionRequest, settings: CoreSettings) -> AttentionResult:
  """Blocks of queries (and keys), position terms per block: on the band next to each query block only
  where the variant's terms vanish beyond one (Shaw's causal band), never for the whole call. A local layer
  without position terms runs all its blocks at once (_banded), a full causal one in rolled tiles (_tiled)."""
  for plain in (_banded, _tiled):
    result = plain(request, settings)
    if result is not None:
      return result
  query, key, value, positions = request.query_BxLqxHxK, request.key_BxLkxHxK, request.value_BxLkxHxV, request.positions
  causal = request.mask.causal
  logits_term = values_term = band = value_offset = None
  if positions is not None:
    hooks, q_positions_BxLq, k_positions_BxLk = positions.hooks, positions.q_positions_BxLq, positions.k_positions_BxLk
    causal_band = hooks.causal_band() if causal else None
    if causal_band is not None and _same_known_consecutive_positions(q_positions_BxLq, k_positions_BxLk):
      # Terms on the band next to each query block only; the keys before it go in without any.
      band, value_offset = causal_band.width, causal_band.value_offset()

      def logits_term(query_block, q_slice, k_slice):
        return causal_band.logits(query_block, q_positions_BxLq[:, q_slice], k_positions_BxLk[:, k_slice],
                                  request.scale)

      def values_term(weights_block, q_slice, k_slice):
        return causal_band.values(weights_block, q_positions_BxLq[:, q_slice], k_positions_BxLk[:, k_slice])
    else:
      shared_block = shared_by_query_block(positions.shared, query.shape[1], settings.block_size)

      def logits_term(query_block, q_slice, k_slice):
        return hooks.logits(query_block, key[:, k_slice], q_positions_BxLq[:, q_slice], k_positions_BxLk[:, k_slice],
                            shared_block(q_slice, k_slice), request.scale)

      def values_term(weights_block, q_slice, k_slice):
        return hooks.values(weights_block, q_positions_BxLq[:, q_slice], k_positions_BxLk[:, k_slice])
  all_keys_at_once = positions is not None and positions.hooks.needs_all_keys()
  if request.weights_rule is not None:
    return _blockwise_rule(request, settings, logits_term, all_keys_at_once)
  local = request.mask.window or request.mask.chunk  # a full pass: each block's mask from its parts
  return AttentionResult(blockwise_attention(
      query, key, value, block_size=settings.block_size, mask=request.mask.block if local else request.mask.mask,
      scale=request.scale,
      skip_future_blocks=causal, logits_term=logits_term, values_term=values_term,
      key_block_size=None if all_keys_at_once else settings.key_block_size or None, band=band,
      value_offset_HxV=value_offset, first_key=None if all_keys_at_once else request.mask.first_key,
      softcap=request.softcap, sink_H=request.sink_H))


def _blockwise_rule(request: AttentionRequest, settings: CoreSettings, logits_term, all_keys_at_once: bool):
  """The variant's WeightsRule in blocks (its own blockwise form), the terms per block as for the softmax."""
  positions = request.positions
  if positions.hooks.needs_weights():
    raise ValueError(f'position.kind: a values term with the weights of {request.weights_rule.name}; valid: one '
                     'or the other')
  query_BxHxLqxK = jnp.transpose(request.query_BxLqxHxK, (0, 2, 1, 3)).astype(jnp.float32) * request.scale
  key_BxGxLkxK = jnp.transpose(request.key_BxLkxHxK, (0, 2, 1, 3)).astype(jnp.float32)
  value_BxGxLkxV = jnp.transpose(request.value_BxLkxHxV, (0, 2, 1, 3))
  query = request.query_BxLqxHxK
  output_BxHxLqxV = request.weights_rule.blockwise(
      query_BxHxLqxK, key_BxGxLkxK, value_BxGxLkxV,
      jnp.ones((1, 1, 1, 1), bool) if request.mask.mask is None else request.mask.mask,
      positions.q_positions_BxLq, positions.k_positions_BxLk,
      lambda q_slice, k_slice: None if logits_term is None else logits_term(query[:, q_slice], q_slice, k_slice),
      settings.block_size, None if all_keys_at_once else settings.key_block_size or None, request.mask.causal)
  return AttentionResult(jnp.transpose(output_BxHxLqxV, (0, 2, 1, 3)).astype(request.value_BxLkxHxV.dtype))


# One signature: core(request, settings) -> AttentionResult.
CORES = {'explicit': explicit, 'blockwise': blockwise, 'xla': _fused('xla'), 'cudnn': _fused('cudnn'),
         'pallas': pallas}


def attend(requested: str, request: AttentionRequest, settings: CoreSettings) -> AttentionResult:
  """The call through the core `choose` picks for it. The whole-call logits term is computed only
  where a core adds it, or where it alone decides between cuDNN and another core."""
  needs = call_needs(request, settings)
  if may_use_cudnn(needs) and requested != 'pallas':
    needs = dataclasses.replace(needs, position_term=request.logits_term is not None)
  return CORES[choose(requested, needs)](request, settings)


def current_backend() -> str:
  """jax.default_backend(): the backend choose reads ('cpu', 'gpu', 'tpu')."""
  return jax.default_backend()


def kernel_platform(backend: str) -> str:
  """flash_attention's platform on a backend: compiled on GPUs and TPUs, interpreted elsewhere."""
  return backend if backend in ('gpu', 'tpu') else 'interpret'
