"""What a sliding window saves: one causal attention's forward and backward through the blockwise core (as a
model's layer runs it), full against a sliding window of W keys, at each length: time per token (median of the
repeats, the two alternating) and XLA's temporary memory for the compiled step. Full attention visits its key
blocks one after another; the sliding window runs every block against its own keys and the window's before it at
once (transformer/local_attention.py), so its time and memory per token stay flat while full attention's grow.

  python -m experiments.benchmark attention --window=256 --lengths=1024,4096,16384 [--block_size=512]
"""

import statistics
import time

import jax
import jax.numpy as jnp

from transformer import attention_core, masks
from transformer.attention_request import AttentionMask, AttentionRequest, CoreSettings


def _step(length: int, window: int, block_size: int):
  """The jitted value and gradient of sum(attention^2) over (query, key, value) through the blockwise core, as a
  model's layer calls it; window 0: full causal attention."""
  mask = AttentionMask(masks.causal_mask(length), causal=True, window=window)
  settings = CoreSettings('cpu', block_size, block_size)

  def loss(arguments):
    request = AttentionRequest(*arguments, arguments[0].shape[-1] ** -0.5, mask)
    output = attention_core.attend('blockwise', request, settings).output_BxLqxHxV
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
