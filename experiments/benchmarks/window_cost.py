"""What a sliding window saves: one causal attention's forward and backward in blocks (the blockwise core, as a
model runs it), full against a sliding window of W keys, at each length: time per token (median of the repeats,
the two alternating) and XLA's temporary memory for the compiled step. A sliding layer's blocks before each query
block's window are never computed (transformer/blockwise.py first_key), so its time per token stays flat while
full attention's grows with L.

  python -m experiments.benchmark attention --window=256 --lengths=1024,4096,16384 [--block_size=512]
"""

import statistics
import time

import jax
import jax.numpy as jnp

from transformer import blockwise, masks
from transformer.attention_request import AttentionMask


def _step(length: int, window: int, block_size: int):
  """The jitted value and gradient of sum(attention^2) over (query, key, value); window 0: full causal."""
  positions = jnp.arange(length)[None]
  mask = masks.causal_mask(length)
  if window:
    mask = jnp.logical_and(mask, masks.window_mask(positions, positions, window=window))
  first_key = AttentionMask(causal=True, window=window).first_key if window else None

  def loss(arguments):
    output = blockwise.blockwise_attention(*arguments, block_size=block_size, key_block_size=block_size, mask=mask,
                                           skip_future_blocks=True, first_key=first_key)
    return jnp.sum(output.astype(jnp.float32) ** 2)
  return jax.jit(jax.value_and_grad(loss))


def table(lengths: list, window: int, block_size: int, batch: int, heads: int, head_dim: int, repeats: int) -> str:
  rows = []
  for length in lengths:
    inputs = tuple(jax.random.normal(key, (batch, length, heads, head_dim))
                   for key in jax.random.split(jax.random.PRNGKey(length), 3))
    steps = {name: _step(length, size, block_size) for name, size in (('full', 0), ('sliding', window))}
    memory = {name: step.lower(inputs).compile().memory_analysis().temp_size_in_bytes for name, step in steps.items()}
    for step in steps.values():
      jax.block_until_ready(step(inputs))
    times = {name: [] for name in steps}
    for _ in range(repeats):
      for name, step in steps.items():
        start = time.perf_counter()
        jax.block_until_ready(step(inputs))
        times[name].append(time.perf_counter() - start)
    rows.append((length, {name: statistics.median(seconds) / (batch * length) for name, seconds in times.items()},
                 memory))
  lines = [f'causal attention, forward and backward in blocks of {block_size} queries and keys: batch {batch}, '
           f'{heads} heads of {head_dim}, float32; full against a sliding window of {window}; median of {repeats}; '
           f'{jax.devices()[0].device_kind}',
           f'{"length":>7} {"full us/token":>14} {"sliding us/token":>17} {"full MB":>9} {"sliding MB":>11} '
           f'{"sliding vs its first":>21}']
  first = rows[0][1]['sliding']
  for length, per_token, memory in rows:
    lines.append(f'{length:>7} {1e6 * per_token["full"]:>14.2f} {1e6 * per_token["sliding"]:>17.2f} '
                 f'{memory["full"] / 2**20:>9.1f} {memory["sliding"] / 2**20:>11.1f} '
                 f'{per_token["sliding"] / first:>20.2f}x')
  return '\n'.join(lines)
