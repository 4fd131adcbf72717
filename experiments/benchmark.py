"""Training-step speed and memory of every positional variant, against the machine's own matmul peak.

  python -m experiments.benchmark [--positions=all] [--lengths=128,256,512,1024] [--batch_size=16]
                                  [--steps=10] [--compute_dtype=bfloat16] [--remat] [--attention_block_size=128]
                                  [--attention_key_block_size=512] [--json=benchmark.json]

Reference config (decoder-only LM, float32, one AdamW step): vocabulary 256, d_model 256, 4 layers,
4 heads, d_ff 1024. Each (variant, length) runs in its own subprocess, so compile caches and peak
memory do not leak between rows. Reported: compile time; step time (median, min, max over --steps
timed steps after --warmup); tokens/s; model FLOPs utilisation against a float32 matmul peak
measured in the same run; peak memory (device memory on an accelerator, resident memory on a CPU).
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

_POSITIONS = flags.DEFINE_string('positions', 'all', "'all' or a comma-separated list of variants.")
_LENGTHS = flags.DEFINE_string('lengths', '256,1024', 'Comma-separated sequence lengths.')
_BATCH = flags.DEFINE_integer('batch_size', 16, 'Sequences per step.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps per row.')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed steps after compilation.')
_MODEL_DIM = flags.DEFINE_integer('model_dim', 256, 'd_model.')
_LAYERS = flags.DEFINE_integer('num_layers', 4, 'Decoder layers.')
_HEADS = flags.DEFINE_integer('num_heads', 4, 'Heads.')
_FF = flags.DEFINE_integer('feed_forward_dim', 1024, 'd_ff.')
_VOCAB = flags.DEFINE_integer('vocab_size', 256, 'Vocabulary.')
_DTYPE = flags.DEFINE_enum('compute_dtype', 'float32', ['float32', 'bfloat16'],
                           'Activations and matmuls (parameters stay float32); MFU is against the peak of this dtype.')
_REMAT = flags.DEFINE_boolean('remat', False, 'Recompute layer activations in the backward pass.')
_BLOCK = flags.DEFINE_integer('attention_block_size', 0,
                              'Attention this many queries at a time beyond it (0: one L x L softmax).')
_KEY_BLOCK = flags.DEFINE_integer('attention_key_block_size', 0,
                                  'With blocks: keys per online-softmax block (0: all keys a block may see).')
_JSON = flags.DEFINE_string('json', None, 'Also write the rows to this JSON file.')
_ROW = flags.DEFINE_string('row', None, 'Internal: run one row, "variant:length", and print its JSON.')


def model_flops_per_step(params: int, layers: int, model_dim: int, length: int, batch: int) -> float:
  """6N per token for the dense weights (forward and backward) plus the attention matmuls,
  12 * layers * d_model * L per token (PaLM, Chowdhery et al. 2022, appendix B)."""
  return batch * length * (6 * params + 12 * layers * model_dim * length)


def matmul_peak(size: int = 2048, repeats: int = 10, dtype: str = 'float32') -> float:
  """FLOP/s of a jit-compiled matmul of this dtype on the default device: the yardstick for MFU."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32).astype(dtype)
  matmul = jax.jit(lambda x, y: x @ y)
  matmul(a, a).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, a).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * size ** 3 / statistics.median(times)


def run_row(variant: str, length: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top
  config = transformer.ModelConfig(
      vocab_size=_VOCAB.value, model_dim=_MODEL_DIM.value, num_heads=_HEADS.value,
      feed_forward_dim=_FF.value, num_decoder_layers=_LAYERS.value, num_encoder_layers=0, dropout_rate=0.0,
      norm='pre', position=transformer.PositionConfig(kind=variant, max_length=max(length, 512)),
      compute_dtype=_DTYPE.value, remat=_REMAT.value, attention_block_size=_BLOCK.value,
      attention_key_block_size=_KEY_BLOCK.value)
  model = transformer.DecoderOnly(config)
  batch = _BATCH.value
  tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, length + 1), 0, _VOCAB.value)
  params = model.init(jax.random.PRNGKey(0), tokens[:, :-1])['params']
  optimizer = optax.adamw(1e-4)
  state = (params, optimizer.init(params))

  def step(state, tokens):
    params, opt_state = state

    def loss(p):
      logits = model.apply({'params': p}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), value

  start = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=0).lower(state, tokens).compile()
  compile_seconds = time.perf_counter() - start
  for _ in range(_WARMUP.value):
    state, value = compiled(state, tokens)
  value.block_until_ready()
  times = []
  for _ in range(_STEPS.value):
    start = time.perf_counter()
    state, value = compiled(state, tokens)
    value.block_until_ready()
    times.append(time.perf_counter() - start)
  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != 'cpu' else None
  peak_bytes = stats['peak_bytes_in_use'] if stats else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  count = sum(int(p.size) for p in jax.tree_util.tree_leaves(params))
  median = statistics.median(times)
  flops = model_flops_per_step(count, _LAYERS.value, _MODEL_DIM.value, length, batch)
  return dict(variant=variant, length=length, batch=batch, parameters=count, compile_seconds=compile_seconds,
              step_seconds_median=median, step_seconds_min=min(times), step_seconds_max=max(times),
              tokens_per_second=batch * length / median, model_flops_per_second=flops / median,
              peak_memory_bytes=peak_bytes, memory_kind='device' if stats else 'resident (CPU)',
              device=device.device_kind, loss=float(value))


def main(argv):
  del argv
  if _ROW.value:
    variant, length = _ROW.value.split(':')
    print(json.dumps(run_row(variant, int(length))))
    return
  import transformer  # pylint: disable=g-import-not-at-top
  variants = list(transformer.VARIANTS) if _POSITIONS.value == 'all' else _POSITIONS.value.split(',')
  unknown = [v for v in variants if v not in transformer.VARIANTS]
  if unknown:
    sys.exit(f'error: --positions: got {unknown}; valid: all, or some of {", ".join(transformer.VARIANTS)}')
  lengths = [int(n) for n in _LENGTHS.value.split(',')]
  peak = matmul_peak(dtype=_DTYPE.value)
  passthrough = [a for a in sys.argv[1:] if not a.startswith(('--positions', '--lengths', '--json'))]
  rows = []
  for length in lengths:
    for variant in variants:
      result = subprocess.run([sys.executable, '-m', 'experiments.benchmark', f'--row={variant}:{length}',
                               *passthrough], capture_output=True, text=True, env=dict(os.environ))
      if result.returncode != 0:
        rows.append(dict(variant=variant, length=length, error=result.stderr.strip().splitlines()[-1]))
        continue
      row = json.loads(result.stdout.strip().splitlines()[-1])
      row['model_flops_utilisation'] = row['model_flops_per_second'] / peak
      rows.append(row)
  header = (f'{"variant":<11} {"length":>6} {"compile s":>9} {"step ms (min-max)":>22} {"tokens/s":>9} '
            f'{"MFU":>6} {"vs none":>7} {"peak MiB":>9}')
  print(f'matmul peak ({_DTYPE.value}, measured now): {peak / 1e9:.1f} GFLOP/s'
        f'{"; layers rematerialised" if _REMAT.value else ""}'
        f'{f"; attention in blocks of {_BLOCK.value} queries" if _BLOCK.value else ""}'
        f'{f" and {_KEY_BLOCK.value} keys" if _BLOCK.value and _KEY_BLOCK.value else ""}')
  print(header)
  baseline = {r['length']: r['step_seconds_median'] for r in rows if r.get('variant') == 'none' and 'error' not in r}
  for row in rows:
    if 'error' in row:
      print(f'{row["variant"]:<11} {row["length"]:>6} failed: {row["error"]}')
      continue
    ratio = row['step_seconds_median'] / baseline[row['length']] if row['length'] in baseline else float('nan')
    print(f'{row["variant"]:<11} {row["length"]:>6} {row["compile_seconds"]:>9.1f} '
          f'{1e3 * row["step_seconds_median"]:>8.1f} ({1e3 * row["step_seconds_min"]:.0f}-'
          f'{1e3 * row["step_seconds_max"]:.0f}) {row["tokens_per_second"]:>9.0f} '
          f'{100 * row["model_flops_utilisation"]:>5.1f}% {ratio:>6.2f}x {row["peak_memory_bytes"] / 2**20:>9.0f}')
  if _JSON.value:
    from experiments.files import write_json_atomically  # pylint: disable=g-import-not-at-top
    write_json_atomically(_JSON.value, dict(matmul_peak_flops=peak, compute_dtype=_DTYPE.value, remat=_REMAT.value,
                                            attention_block_size=_BLOCK.value,
                                            attention_key_block_size=_KEY_BLOCK.value, rows=rows))


if __name__ == '__main__':
  app.run(main)
