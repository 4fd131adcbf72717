"""Forward and backward of one causal attention with each way of adding a relative term, and each
attention core the library can run, timed side by side in one process (alternating, median of
--repeats): what the distance layout of transformer/positions/relative.py buys over an Lq x Lk
gather and scatter-add, and what the layouts and blocks of transformer/attention.py buy over
jax.nn.dot_product_attention.

  python -m experiments.benchmark attention [--length=1024] [--batch_size=4] [--num_heads=4] [--head_dim=64]
                                            [--compute_dtype=bfloat16] [--pallas_rows] [--flex]
  python -m experiments.benchmark attention --window=256 --lengths=1024,4096,16384 [--block_size=512]

Rows: plain causal attention (contracting the B x L x H x K layout); Shaw's logits and values terms
by gather and scatter-add, by the distance layout, and on the causal band of blockwise attention
(--block_size queries at a time, as the models run it); T5's bias by an Lq x Lk gather, and by the
distance layout; then the plain attention as jax.nn.dot_product_attention, as
scaled_dot_product_attention (heads first) and as blockwise_attention with --block_size queries at a
time. The ratio is to plain. --pallas_rows adds the Pallas kernel (transformer/flash_attention.py) with
no term, ALiBi's and T5's computed inside (compiled on a GPU or TPU, interpreted, slowly, elsewhere);
--flex adds PyTorch's FlexAttention with the same terms as score_mod (experiments/benchmarks/flex.py, in
its own process; forward only on a CPU, where it has no backward). --window with --lengths times full causal
attention against a sliding window instead (experiments/benchmarks/window_cost.py).
"""

import json
import os
import statistics
import subprocess
import sys
import time

from absl import flags
import jax
import jax.numpy as jnp

from transformer import attention, attention_core, blockwise, masks
from transformer.flash_attention import flash_attention
from transformer.positions import alibi, relative, shaw, t5
from experiments.shared import cli

_LENGTH = flags.DEFINE_integer('length', 1024, 'Sequence length.', lower_bound=2)
_BATCH = flags.DEFINE_integer('batch_size', 4, 'Sequences.', lower_bound=1)
_HEADS = flags.DEFINE_integer('num_heads', 4, 'Heads.', lower_bound=1)
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Head width.', lower_bound=1)
_CLIP = flags.DEFINE_integer('clip_distance', 16, "Shaw's k.", lower_bound=0)
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per row.', lower_bound=1)
_BLOCK = flags.DEFINE_integer('block_size', 128, 'Queries per block in the blockwise row.', lower_bound=1)
_DTYPE = flags.DEFINE_enum('compute_dtype', 'float32', ['float32', 'bfloat16'], 'Queries, keys and values.')
_PALLAS = flags.DEFINE_boolean('pallas_rows', False, 'Add the Pallas kernel with no term, ALiBi and T5 inside.')
_FLEX = flags.DEFINE_boolean('flex', False, "Add PyTorch's FlexAttention with the same terms (the [peer] extra).")
_WINDOW = flags.DEFINE_integer('window', 0, 'With --lengths: full causal attention against a sliding window of this '
                               'many keys, in blocks of --block_size (experiments/benchmarks/window_cost.py).',
                               lower_bound=0)
_LENGTHS = flags.DEFINE_list('lengths', None, 'With --window: the sequence lengths of its table.')
_FLEX_ROW = flags.DEFINE_string('flex_row', None, 'Internal: time one FlexAttention term and print its JSON.')
CORES = ('jax.nn.dot_product_attention', 'scaled_dot_product_attention', 'blockwise_attention')
SHAW_BAND = 'shaw (causal band, blocks)'
KERNEL_ROWS = {'plain (pallas kernel)': 'none', 'alibi (pallas kernel)': 'alibi', 't5 (pallas kernel)': 't5'}


def _kernel(term: str, query, key, value, bias_table):
  """The Pallas kernel with the variant's own KernelTerm, blocks of --block_size."""
  heads = query.shape[2]
  kernel_term = None
  if term == 'alibi':
    kernel_term = alibi.alibi_kernel_term(heads, causal=True)
  elif term == 't5':
    kernel_term = t5.t5_kernel_term(bias_table, bidirectional=False, max_distance=128)
  platform = attention_core.kernel_platform(jax.default_backend())
  return flash_attention(query, key, value, causal=True, term=kernel_term, block_q=_BLOCK.value,
                         block_k=_BLOCK.value, platform=platform)


def attention_with(term: str, query, key, value, key_table, value_table, bias_table):
  length = query.shape[1]
  mask = masks.causal_mask(length)
  if term == 'jax.nn.dot_product_attention':
    return jax.nn.dot_product_attention(query, key, value, is_causal=True)
  if term == 'scaled_dot_product_attention':
    return attention.scaled_dot_product_attention(query, key, value, mask=mask)
  if term == 'blockwise_attention':
    return blockwise.blockwise_attention(query, key, value, block_size=_BLOCK.value, mask=mask,
                                         skip_future_blocks=True)
  if term in KERNEL_ROWS:
    return _kernel(KERNEL_ROWS[term], query, key, value, bias_table)
  positions = jnp.arange(length)[None]
  _, offset = relative.contiguous_offset(positions, positions)
  scale = query.shape[-1] ** -0.5
  if term == SHAW_BAND:
    return _shaw_band_blockwise(query, key, value, key_table, value_table, mask, scale)
  logits = jnp.einsum('bqhk,bshk->bhqs', query, key) * scale
  buckets = shaw.shaw_buckets(positions, positions, _CLIP.value)
  if term == 'shaw (gather)':
    logits += scale * shaw.shaw_logits(query, key_table, buckets)
  elif term == 'shaw (distance layout)':
    logits += scale * shaw.shaw_logits_consecutive(query, key_table, length, offset, _CLIP.value)
  elif term == 't5 (gather)':
    logits += t5.t5_bias_gathered(bias_table, positions, positions, bidirectional=False, max_distance=128)
  elif term == 't5 (distance layout)':
    logits += t5.t5_bias(bias_table, positions, positions, bidirectional=False, max_distance=128)
  elif term == 'alibi (bias)':
    logits += alibi.alibi_bias(positions, positions, query.shape[2], causal=True)
  logits = jnp.where(mask, logits, -1e30)
  weights = jax.nn.softmax(logits, axis=-1)
  output = jnp.einsum('bhqs,bshv->bqhv', weights, value)
  if term == 'shaw (gather)':
    output += shaw.shaw_values(weights, value_table, buckets)
  elif term == 'shaw (distance layout)':
    output += shaw.shaw_values_consecutive(weights, value_table, offset, _CLIP.value)
  return output


def _shaw_band_blockwise(query, key, value, key_table, value_table, mask, scale):
  """Shaw as the models run it in causal blocks: re-centred tables, the terms on each query block's
  band of keys only (transformer/positions/shaw.py)."""
  clip = _CLIP.value
  band_key_table, band_value_table = shaw.band_table(key_table, clip), shaw.band_table(value_table, clip)

  def logits_term(query_block, q_slice, k_slice):
    return scale * shaw.band_logits_consecutive(query_block, band_key_table, k_slice.stop - k_slice.start,
                                                k_slice.start - q_slice.start)

  def values_term(weights_block, q_slice, k_slice):
    return shaw.band_values_consecutive(weights_block, band_value_table, k_slice.start - q_slice.start)
  return blockwise.blockwise_attention(query, key, value + value_table[0], block_size=_BLOCK.value, mask=mask,
                                       scale=scale, skip_future_blocks=True, logits_term=logits_term,
                                       values_term=values_term, band=clip)


def _flex_rows() -> list:
  """FlexAttention's rows, each timed in its own process (PyTorch and JAX never share a device)."""
  from experiments.benchmarks import flex  # pylint: disable=g-import-not-at-top
  rows = []
  for term in flex.TERMS:
    command = [sys.executable, '-m', 'experiments.benchmark', 'attention', f'--flex_row={term}',
               *[a for a in sys.argv[1:] if not a.startswith(('--flex', '--pallas_rows'))]]
    result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
    if result.returncode != 0:
      rows.append(dict(term=f'{term} (FlexAttention)', error=(result.stderr.strip().splitlines() or ['?'])[-1]))
    else:
      rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
  return rows


def _window_table() -> None:
  """--window with --lengths: full causal attention against a sliding window (experiments/benchmarks/window_cost.py)."""
  if not (_WINDOW.value and _LENGTHS.value):
    raise cli.CommandError('--window and --lengths: give both (a window of W keys, and the lengths to time it at)')
  try:
    lengths = [int(length) for length in _LENGTHS.value]
  except ValueError:
    lengths = []
  if not lengths or min(lengths) <= _WINDOW.value:
    raise cli.CommandError(f'--lengths: got {",".join(_LENGTHS.value)}; valid: integers longer than --window='
                           f'{_WINDOW.value}')
  from experiments.benchmarks import window_cost  # pylint: disable=g-import-not-at-top
  print(window_cost.table(lengths, _WINDOW.value, _BLOCK.value, _BATCH.value, _HEADS.value, _HEAD_DIM.value,
                          _REPEATS.value))


def main(argv):
  del argv
  if _WINDOW.value or _LENGTHS.value:
    _window_table()
    return
  if _FLEX_ROW.value:
    from experiments.benchmarks import flex  # pylint: disable=g-import-not-at-top
    print(json.dumps(flex.run_flex_row(_FLEX_ROW.value, _BATCH.value, _LENGTH.value, _HEADS.value, _HEAD_DIM.value,
                                       _REPEATS.value, _DTYPE.value)))
    return
  shape = (_BATCH.value, _LENGTH.value, _HEADS.value, _HEAD_DIM.value)
  keys = jax.random.split(jax.random.PRNGKey(0), 6)
  table_shape = (2 * _CLIP.value + 1, _HEADS.value, _HEAD_DIM.value)
  dtype = jnp.dtype(_DTYPE.value)
  inputs = (*(jax.random.normal(k, shape).astype(dtype) for k in keys[:3]),
            *(jax.random.normal(k, table_shape) for k in keys[3:5]), jax.random.normal(keys[5], (32, _HEADS.value)))
  terms = ['plain', 'shaw (gather)', 'shaw (distance layout)', SHAW_BAND, 't5 (gather)', 't5 (distance layout)',
           'alibi (bias)', *CORES, *(KERNEL_ROWS if _PALLAS.value else ())]
  steps = {term: jax.jit(jax.value_and_grad(
      lambda args, term=term: jnp.sum(attention_with(term, *args).astype(jnp.float32) ** 2))) for term in terms}
  for step in steps.values():
    jax.block_until_ready(step(inputs))
  times = {term: [] for term in terms}
  for _ in range(_REPEATS.value):
    for term, step in steps.items():
      start = time.perf_counter()
      jax.block_until_ready(step(inputs))
      times[term].append(time.perf_counter() - start)
  plain_output = attention_with('plain', *inputs)
  checked = [*CORES, *(['plain (pallas kernel)'] if _PALLAS.value else [])]
  disagreement = max(float(jnp.max(jnp.abs(attention_with(core, *inputs).astype(jnp.float32)
                                           - plain_output.astype(jnp.float32)))) for core in checked)
  if disagreement > (1e-4 if dtype == jnp.float32 else 3e-2):
    raise SystemExit(f'error: the attention cores disagree with plain attention by {disagreement:.2g}')
  band_disagreement = float(jnp.max(jnp.abs(attention_with(SHAW_BAND, *inputs)
                                            - attention_with('shaw (distance layout)', *inputs))))
  if band_disagreement > (1e-3 if dtype == jnp.float32 else 3e-2):
    raise SystemExit(f'error: Shaw by the causal band disagrees with the whole terms by {band_disagreement:.2g}')
  print(f'causal attention, forward and backward: batch {shape[0]}, length {shape[1]}, {shape[2]} heads of '
        f'{shape[3]}, {_DTYPE.value}, Shaw k={_CLIP.value}; median of {_REPEATS.value}; {jax.devices()[0].device_kind}')
  print(f'{"term":<36} {"ms":>10} {"vs plain":>9}')
  plain = statistics.median(times['plain'])
  for term in terms:
    median = statistics.median(times[term])
    label = f'{term} ({_BLOCK.value})' if term == 'blockwise_attention' else term
    print(f'{label:<36} {1e3 * median:>10.3f} {median / plain:>8.2f}x')
  for row in _flex_rows() if _FLEX.value else []:
    if 'error' in row:
      print(f'{row["term"]:<36} failed: {row["error"]}')
    else:
      print(f'{row["term"]:<36} {1e3 * row["seconds_median"]:>10.3f} {row["seconds_median"] / plain:>8.2f}x')
  print(f'the attention cores{" and the kernel" if _PALLAS.value else ""} agree with plain attention to '
        f'{disagreement:.1g}, Shaw by the causal band with the whole terms to {band_disagreement:.1g}')


if __name__ == '__main__':
  cli.run(main)
