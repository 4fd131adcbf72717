"""Which attention core runs a self- or cross-attention call: the one place that decides.

  explicit   softmax(Q K^T scale + term) V with the weights formed (scaled_dot_product_attention): runs
             everywhere and serves everything (a values term, attention dropout, collected weights).
  blockwise  blocks of queries (and of keys), an online softmax (blockwise.py): memory bounded by the
             blocks, position terms per block (Shaw's values term too); needs model.attention_block_size
             > 0, and hands no weights back.
  xla        jax.nn.dot_product_attention(implementation='xla'): one fused XLA computation; masks and
             position terms broadcast to B x H x Lq x Lk; never forms weights.
  cudnn      jax.nn.dot_product_attention(implementation='cudnn'): cuDNN's fused flash attention, on GPUs,
             in bfloat16 or float16, for variants that add no logits term (none, the rotary ones, the
             embedding ones), never forming weights.
  pallas     flash_attention.py: a Pallas flash attention kernel that computes the variant's term inside
             from positions and head (its kernel_term: ALiBi, T5, KERPLE) or adds none; Triton on GPUs,
             Mosaic on TPUs, Pallas' interpreter elsewhere (slow: for tests). The mask must be the
             causal mask and the keys' padding, given as such (not a cached decoding step's).

'auto' (model.attention_implementation's default) picks, given what the call needs: cudnn on a GPU in
half precision where nothing rules it out; else blocks where they pay (causal attention, or key blocks,
longer than a block); else xla on a GPU where no weights are needed; else explicit. pallas runs where
asked for (docs/architecture.md says why auto leaves it). Any other choice is
taken as asked, or refused with a ValueError naming model.attention_implementation, what rules it out
and what would run.
"""

import dataclasses

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
  mask_in_parts: bool = False  # the mask is None, or the causal mask and the keys' padding given as such


def _refusal(requested: str, reason: str, needs: CallNeeds) -> ValueError:
  return ValueError(f'model.attention_implementation: got {requested!r}, but {reason}; valid here: '
                    f'{", ".join(choice for choice in IMPLEMENTATIONS if _runs(choice, needs) is None)}')


def _runs(choice: str, needs: CallNeeds):
  """None if the core can serve the call, else why not."""
  if choice in ('auto', 'explicit'):
    return None
  if choice == 'blockwise':
    if not needs.blocks_configured:
      return 'model.attention_block_size is 0 (blocks need a size)'
    if needs.caller_weights:
      return 'this call needs the attention weights (attention dropout or collected weights), which blocks never form'
    return None
  if needs.caller_weights or needs.values_term:
    return f'this call needs the attention weights (a values term such as Shaw\'s, attention dropout or ' \
           f'collected weights), which {choice} never forms'
  if choice == 'pallas':
    if not needs.kernel_serves:
      return 'the positional variant\'s term is not one the kernel computes from positions and head (kernel_term)'
    if not needs.mask_in_parts:
      return 'the mask is not the causal mask and padding given as such (a cached decoding step\'s, or another)'
    return None
  if choice == 'cudnn':
    if needs.backend != 'gpu':
      return f'cuDNN runs on GPUs and this backend is {needs.backend}'
    if needs.dtype not in HALF_PRECISION:
      return f'cuDNN\'s fused attention takes bfloat16 or float16 and the compute dtype is {needs.dtype}'
    if needs.position_term:
      return 'the positional variant adds a logits term, which cuDNN would read as a materialised B x H x L x L bias'
  return None


def may_use_cudnn(needs: CallNeeds) -> bool:
  """Whether cuDNN could serve the call but for a position term (which the caller then computes to decide)."""
  return (needs.backend == 'gpu' and needs.dtype in HALF_PRECISION and not needs.caller_weights
          and not needs.values_term)


def choose(requested: str, needs: CallNeeds) -> str:
  """The core for one call: 'explicit', 'blockwise', 'xla', 'cudnn' or 'pallas'."""
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f'model.attention_implementation: got {requested!r}; valid: {", ".join(IMPLEMENTATIONS)}')
  if requested != 'auto':
    reason = _runs(requested, needs)
    if reason is not None:
      raise _refusal(requested, reason, needs)
    return requested
  if needs.backend == 'gpu' and _runs('cudnn', needs) is None:
    return 'cudnn'
  if needs.blocks_configured and needs.blocks_pay and not needs.caller_weights:
    return 'blockwise'
  if needs.backend == 'gpu' and not (needs.caller_weights or needs.values_term):
    return 'xla'
  return 'explicit'
