"""Every matmul of one training step of the benchmark's reference model, timed alone, on all cores
and on one: where the step's time goes, and the model FLOPs utilisation its matmuls alone allow.

  python -m experiments.benchmark matmul [--length=256] [--batch_size=16] [--block_size=128]

The reference model of experiments.benchmarks.step (decoder-only, d_model 256, 4 layers, 4 heads, d_ff
1024, vocabulary 256, float32). Dense layers: the forward x W (N x I times I x O), the input
gradient dY W^T and the weight gradient X^T dY, once per layer. Causal attention as the models run
it (transformer/blockwise.py): per block of queries, against the keys it may see, batched over
batch x heads: the logits Q K^T and the output P V; in the backward pass the logits again (the
block is recomputed), dP = dO V^T, dV = P^T dO, dQ = dS K and dK = dS^T Q. Each kernel is one
jit-compiled einsum, median of --repeats calls; the same kernels then run in a process pinned to
one core, so the last column says which kernels use the second core. The summary adds each kernel's
time times its count in a step: a step made of nothing but these matmuls, one after another at these
rates, takes that long, and its model FLOPs (experiments.benchmarks.step's count, N the weight matrices
only) over that time and the matmul peak give the MFU such a step would reach. An estimate, not a
bound: each call alone also pays a dispatch, and in the real step independent thunks may overlap.
"""

import json
import os
import subprocess
import sys

from absl import flags

from experiments.shared import cli
from experiments.benchmarks.flops import matmul_peak, median_seconds, model_flops_per_step, step_kernels

_LENGTH = flags.DEFINE_integer('length', 256, 'Sequence length.', lower_bound=2)
_BATCH = flags.DEFINE_integer('batch_size', 16, 'Sequences per step.', lower_bound=1)
_BLOCK = flags.DEFINE_integer('block_size', 128, 'Queries per causal attention block (0: one L x L block).',
                              lower_bound=0)
_MODEL_DIM = flags.DEFINE_integer('model_dim', 256, 'd_model.', lower_bound=1)
_LAYERS = flags.DEFINE_integer('num_layers', 4, 'Decoder layers.', lower_bound=1)
_HEADS = flags.DEFINE_integer('num_heads', 4, 'Heads.', lower_bound=1)
_FF = flags.DEFINE_integer('feed_forward_dim', 1024, 'd_ff.', lower_bound=1)
_VOCAB = flags.DEFINE_integer('vocab_size', 256, 'Vocabulary.', lower_bound=1)
_REPEATS = flags.DEFINE_integer('repeats', 20, 'Timed calls per kernel.', lower_bound=1)
_ONE_CORE = flags.DEFINE_boolean('one_core', False, 'Internal: pin this process to one core, time, print JSON.')


def time_kernels(kernels: list[dict], repeats: int) -> dict:
  """Median seconds of each kernel (a jit-compiled einsum) and the float32 matmul peak, this process."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  seconds = []
  for index, kernel in enumerate(kernels):
    keys = jax.random.split(jax.random.PRNGKey(index))
    lhs, rhs = (jax.random.normal(key, shape, jnp.float32) for key, shape in zip(keys, (kernel['lhs'], kernel['rhs'])))
    einsum = jax.jit(lambda a, b, equation=kernel['equation']: jnp.einsum(equation, a, b))
    seconds.append(median_seconds(einsum, (lhs, rhs), repeats))
  return dict(seconds=seconds, peak=matmul_peak(), cores=len(os.sched_getaffinity(0)))


def main(argv):
  del argv
  config = dict(batch=_BATCH.value, length=_LENGTH.value, model_dim=_MODEL_DIM.value, num_layers=_LAYERS.value,
                num_heads=_HEADS.value, feed_forward_dim=_FF.value, vocab_size=_VOCAB.value,
                block_size=_BLOCK.value)
  for name, value in config.items():
    if value < 0 or value == 0 and name != 'block_size':
      valid = '0 (one L x L block) or a positive number of queries' if name == 'block_size' else 'a positive number'
      cli.fail(f'--{name}: got {value}; valid: {valid}')
  if _MODEL_DIM.value % _HEADS.value:
    cli.fail(f'--model_dim: got {_MODEL_DIM.value}, not a multiple of --num_heads={_HEADS.value}')
  kernels = step_kernels(**config)
  if _ONE_CORE.value:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before JAX starts its thread pools
    print(json.dumps(time_kernels(kernels, _REPEATS.value)))
    return
  every_core = time_kernels(kernels, _REPEATS.value)
  result = subprocess.run([sys.executable, '-m', 'experiments.benchmark', 'matmul', '--one_core',
                           *[a for a in sys.argv[1:] if not a.startswith('--one_core')]],
                          capture_output=True, text=True, check=False)
  if result.returncode != 0:
    cli.fail(f'the one-core run failed: {(result.stderr.strip().splitlines() or ["no output"])[-1]}')
  one_core = json.loads(result.stdout.strip().splitlines()[-1])
  peak = every_core['peak']
  print(f'matmuls of one training step, batch {_BATCH.value} x length {_LENGTH.value}, attention blocks of '
        f'{_BLOCK.value or _LENGTH.value}; median of {_REPEATS.value}; matmul peak {peak / 1e9:.1f} GFLOP/s on '
        f'{every_core["cores"]} cores, {one_core["peak"] / 1e9:.1f} on one')
  print(f'{"kernel":<36} {"lhs x rhs":<24} {"count":>5} {"ms each":>8} {"GFLOP/s":>8} {"of peak":>7} '
        f'{"ms per step":>11} {"1-core GFLOP/s":>14} {"speed-up":>8}')
  totals = {'dense': 0.0, 'attention': 0.0}
  for kernel, seconds, one in zip(kernels, every_core['seconds'], one_core['seconds']):
    rate = kernel['flops'] / seconds
    per_step = kernel['count'] * seconds
    totals[kernel['kind']] += per_step
    shapes = 'x'.join(map(str, kernel['lhs'])) + ' . ' + 'x'.join(map(str, kernel['rhs']))
    print(f'{kernel["name"]:<36} {shapes:<24} {kernel["count"]:>5} {1e3 * seconds:>8.2f} {rate / 1e9:>8.1f} '
          f'{100 * rate / peak:>6.0f}% {1e3 * per_step:>11.1f} {kernel["flops"] / one / 1e9:>14.1f} '
          f'{one / seconds:>7.2f}x')
  total = sum(totals.values())
  dense_parameters = _LAYERS.value * (4 * _MODEL_DIM.value ** 2 + 2 * _MODEL_DIM.value * _FF.value) \
      + _MODEL_DIM.value * _VOCAB.value
  model_flops = model_flops_per_step(dense_parameters, _LAYERS.value, _MODEL_DIM.value, _LENGTH.value, _BATCH.value)
  print(f'per step: dense matmuls {1e3 * totals["dense"]:.1f} ms, attention matmuls {1e3 * totals["attention"]:.1f} '
        f'ms, together {1e3 * total:.1f} ms: a step of only these matmuls, one after another at these rates, would '
        f'reach {model_flops / total / peak:.0%} MFU')


if __name__ == '__main__':
  cli.run(main)
