"""Model FLOPs of a training step and the machine's own matmul peak: the two halves of model FLOPs
utilisation (`python -m experiments.benchmark`), and the matmuls a step is made of (`... benchmark matmul`)."""

import statistics
import time


def model_flops_per_step(params: int, layers: int, model_dim: int, length: int, batch: int) -> float:
  """6N per token for the dense weights (forward and backward) plus the attention matmuls,
  12 * layers * d_model * L per token (PaLM, Chowdhery et al. 2022, appendix B)."""
  return batch * length * (6 * params + 12 * layers * model_dim * length)


def matmul_peak(size: int = 2048, repeats: int = 10, dtype: str = 'float32') -> float:
  """FLOP/s of a jit-compiled matmul of this dtype on the default device: the yardstick for MFU."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32).astype(dtype)
  return 2 * size ** 3 / median_seconds(jax.jit(lambda x, y: x @ y), (a, a), repeats)


def median_seconds(function, arguments: tuple, repeats: int) -> float:
  """Median wall time of function(*arguments) over repeats calls, after one untimed call (compilation)."""
  function(*arguments).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    function(*arguments).block_until_ready()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def step_kernels(batch: int, length: int, model_dim: int, num_layers: int, num_heads: int, feed_forward_dim: int,
                 vocab_size: int, block_size: int) -> list[dict]:
  """The matmuls of one training step of a decoder-only model: kind (dense or attention), name, einsum
  equation, operand shapes, count per step, FLOPs."""
  tokens = batch * length
  kernels = []

  def add(kind, name, equation, lhs, rhs, count):
    kernels.append(dict(kind=kind, name=name, equation=equation, lhs=lhs, rhs=rhs, count=count,
                        flops=_einsum_flops(equation, lhs, rhs)))

  dense = [('qkv', model_dim, 3 * model_dim, num_layers), ('output projection', model_dim, model_dim, num_layers),
           ('feed-forward in', model_dim, feed_forward_dim, num_layers),
           ('feed-forward out', feed_forward_dim, model_dim, num_layers), ('logits', model_dim, vocab_size, 1)]
  for name, inputs, outputs, count in dense:
    add('dense', f'{name}: x W', 'ni,io->no', (tokens, inputs), (inputs, outputs), count)
    add('dense', f'{name}: dY W^T', 'no,io->ni', (tokens, outputs), (inputs, outputs), count)
    add('dense', f'{name}: X^T dY', 'ni,no->io', (tokens, inputs), (tokens, outputs), count)
  heads, head_dim = batch * num_heads, model_dim // num_heads
  block_size = block_size or length
  blocks = {}  # (queries, keys) -> how many query blocks of that shape
  for start in range(0, length, block_size):
    shape = (min(block_size, length - start), min(start + block_size, length))
    blocks[shape] = blocks.get(shape, 0) + 1
  for (queries, keys), count in blocks.items():
    count *= num_layers
    q, k, p = (heads, queries, head_dim), (heads, keys, head_dim), (heads, queries, keys)
    tag = f'{queries}x{keys}'
    add('attention', f'attention {tag}: Q K^T (twice)', 'bqd,bkd->bqk', q, k, 2 * count)
    add('attention', f'attention {tag}: P V', 'bqk,bkd->bqd', p, k, count)
    add('attention', f'attention {tag}: dO V^T', 'bqd,bkd->bqk', q, k, count)
    add('attention', f'attention {tag}: P^T dO', 'bqk,bqd->bkd', p, q, count)
    add('attention', f'attention {tag}: dS K', 'bqk,bkd->bqd', p, k, count)
    add('attention', f'attention {tag}: dS^T Q', 'bqk,bqd->bkd', p, q, count)
  return kernels


def _einsum_flops(equation: str, lhs: tuple, rhs: tuple) -> int:
  """A multiply and an add per point of the iteration space: twice the product of every label's size."""
  sizes = {}
  for labels, shape in zip(equation.split('->')[0].split(','), (lhs, rhs)):
    if len(labels) != len(shape):
      raise ValueError(f'{equation}: operand {labels} has shape {shape}')
    sizes.update(zip(labels, shape))
  flops = 2
  for size in sizes.values():
    flops *= size
  return flops
