"""Training-step speed and memory of every positional variant, against the machine's own matmul peak.

  python -m experiments.benchmark [--positions=all] [--lengths=128,256,512,1024] [--batch_size=16]
                                  [--num_kv_heads=1,2,0] [--cache_length=2048] [--steps=10]
                                  [--compute_dtype=bfloat16] [--remat=block] [--attention_block_size=0]
                                  [--attention_key_block_size=512] [--attention_implementation=pallas]
                                  [--peak_flops=989e12] [--peer] [--json=benchmark.json]

Reference config (decoder-only LM, float32, one AdamW step): vocabulary 256, d_model 256, 4 layers,
4 heads, d_ff 1024. Each (variant, length) runs in its own subprocess, so compile caches and peak
memory do not leak between rows; --num_kv_heads gives each (variant, length) a row per count of key and
value heads (grouped-query attention; 0: num_heads, multi-head). Reported: compile time; step time (median,
min, max over --steps timed steps after --warmup); tokens/s; model FLOPs utilisation against a float32 matmul peak
measured in each row's own process right after its timed steps (so a busy machine lowers both,
and MFU never divides by a peak measured at another moment), or against --peak_flops, the device's stated
dense peak for the dtype; peak memory (device memory on an accelerator, resident memory on a CPU); the
decoding cache's bytes for one sequence of --cache_length tokens (from its shapes, nothing allocated): its keys
and values in the table, the whole cache (with the variant's own entries) in the JSON.
--attention_implementation is model.attention_implementation (the attention core: attention_core.py).
With --peer, each variant x-transformers has (none, learned, sinusoidal, rope, alibi, t5) is also run
on x-transformers right after ours, with and without its fused attention (experiments/benchmarks/peer.py), and a
second table gives ours / theirs at their fastest setting.
"""

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import flags

from experiments.shared import cli
from experiments.benchmarks.flops import matmul_peak, model_flops_per_step
from transformer.attention_core import IMPLEMENTATIONS

_POSITIONS = flags.DEFINE_string('positions', 'all', "'all' or a comma-separated list of variants; KIND+ssmax is "
                                  'the variant with scalable softmax (model.position.ssmax).')
_LENGTHS = flags.DEFINE_string('lengths', '256,1024', 'Comma-separated sequence lengths.')
_BATCH = flags.DEFINE_integer('batch_size', 16, 'Sequences per step.', lower_bound=1)
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps per row.', lower_bound=1)
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed steps after compilation.', lower_bound=0)
_MODEL_DIM = flags.DEFINE_integer('model_dim', 256, 'd_model.', lower_bound=1)
_LAYERS = flags.DEFINE_integer('num_layers', 4, 'Decoder layers.', lower_bound=1)
_HEADS = flags.DEFINE_integer('num_heads', 4, 'Heads.', lower_bound=1)
_KV_HEADS = flags.DEFINE_string('num_kv_heads', '0', 'Comma-separated counts of key and value heads, a row each '
                                '(grouped-query attention; each a divisor of --num_heads; 0: num_heads).')
_CACHE_LENGTH = flags.DEFINE_integer('cache_length', 2048, "The decoding cache's bytes reported for one sequence "
                                     'of this many tokens.', lower_bound=1)
_FF = flags.DEFINE_integer('feed_forward_dim', 1024, 'd_ff.', lower_bound=1)
_VOCAB = flags.DEFINE_integer('vocab_size', 256, 'Vocabulary.', lower_bound=1)
_DTYPE = flags.DEFINE_enum('compute_dtype', 'float32', ['float32', 'bfloat16'],
                           'Activations and matmuls (parameters stay float32); MFU is against the peak of this dtype.')
_REMAT = flags.DEFINE_enum('remat', 'none', ['none', 'block', 'matmuls'],
                           'Recompute layer activations in the backward pass (model.remat).')
_BLOCK = flags.DEFINE_integer('attention_block_size', 128,
                              'Causal attention this many queries at a time beyond it, as the experiments do by '
                              'default (configs/base.py); 0: one L x L softmax.', lower_bound=0)
_KEY_BLOCK = flags.DEFINE_integer('attention_key_block_size', 0,
                                  'With blocks: keys per online-softmax block (0: all keys a block may see).', lower_bound=0)
_IMPLEMENTATION = flags.DEFINE_enum('attention_implementation', 'auto', list(IMPLEMENTATIONS),
                                    'The attention core (model.attention_implementation).')
_PEAK = flags.DEFINE_float('peak_flops', 0.0, "MFU against this FLOP/s (a device's stated dense peak for "
                           '--compute_dtype, e.g. 989e12 for an H100 or H200 in bfloat16); 0: the matmul peak '
                           'measured beside each row.')
_PEER = flags.DEFINE_boolean('peer', False,
                             'Also time x-transformers (PyTorch) on the same config and variants, alternating with '
                             "ours, with and without its fused attention; needs pip install -e '.[peer]'.")
_JSON = flags.DEFINE_string('json', None, 'Also write the rows to this JSON file.')
_ROW = flags.DEFINE_string('row', None, 'Internal: run one row, "variant:length", and print its JSON.')
_PEER_ROW = flags.DEFINE_enum('peer_row', None, ['fused', 'unfused'], 'Internal: run --row on x-transformers.')


def _position(variant: str, length: int):
  """The variant at its defaults (with scalable softmax for KIND+ssmax), a learned table long enough for `length`."""
  import transformer  # pylint: disable=g-import-not-at-top
  kind, _, ssmax = variant.partition('+')
  long_enough = transformer.VARIANTS[kind].own_settings({'max_length': max(length, 512)})
  return transformer.PositionConfig(kind, ssmax=ssmax == 'ssmax', **long_enough)


def _cache_bytes(config) -> tuple:
  """(the decoding cache's bytes at --cache_length, those of its keys and values alone), from shapes only."""
  import jax  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top
  model = transformer.DecoderOnly(config)
  cache = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jax.numpy.zeros((1, _CACHE_LENGTH.value), 'int32'),
                                            use_cache=True))
  leaves = jax.tree_util.tree_flatten_with_path(cache.get('cache', {}))[0]
  key_value = sum(leaf.size * leaf.dtype.itemsize for path, leaf in leaves
                  if jax.tree_util.keystr(path).endswith(("'cached_key']", "'cached_value']")))
  return sum(leaf.size * leaf.dtype.itemsize for _, leaf in leaves), key_value


def run_row(variant: str, length: int, kv_heads: int = 0) -> dict:
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top
  config = transformer.ModelConfig(
      vocab_size=_VOCAB.value, model_dim=_MODEL_DIM.value, num_heads=_HEADS.value, num_kv_heads=kv_heads,
      feed_forward_dim=_FF.value, num_decoder_layers=_LAYERS.value, num_encoder_layers=0, dropout_rate=0.0,
      norm='pre', position=_position(variant, length),
      compute_dtype=_DTYPE.value, remat=_REMAT.value, attention_block_size=_BLOCK.value,
      attention_key_block_size=_KEY_BLOCK.value, attention_implementation=_IMPLEMENTATION.value)
  model = transformer.DecoderOnly(config)
  batch = _BATCH.value
  tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, length + 1), 0, _VOCAB.value)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens[:, :-1])['params'])
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
  cache_bytes, key_value_bytes = _cache_bytes(config.replace(position=_position(variant, _CACHE_LENGTH.value)))
  flops = model_flops_per_step(count, _LAYERS.value, _MODEL_DIM.value, length, batch)
  return dict(variant=variant, length=length, kv_heads=config.key_value_heads, batch=batch, parameters=count,
              cache_bytes=cache_bytes, key_value_cache_bytes=key_value_bytes, cache_length=_CACHE_LENGTH.value,
              compile_seconds=compile_seconds,
              step_seconds_median=median, step_seconds_min=min(times), step_seconds_max=max(times),
              tokens_per_second=batch * length / median, model_flops_per_second=flops / median,
              peak_memory_bytes=peak_bytes, memory_kind='device' if stats else 'resident (CPU)',
              device=device.device_kind, loss=float(value))


def main(argv):
  del argv
  if _ROW.value:
    print(json.dumps(_child_row()))
    return
  variants, lengths, kv_counts = _checked_flags()
  rows, peer_rows = [], []
  for length in lengths:
    for variant in variants:
      for kv_heads in kv_counts:
        rows.append(_measure(variant, length, kv_heads=kv_heads))
      if _PEER.value and variant in _peer().PEER_VARIANTS:  # alternating: ours, then theirs, per row
        for setting in ('unfused',) if variant in _peer().PEER_UNFUSABLE else ('unfused', 'fused'):
          peer_rows.append(_measure(variant, length, setting))
  _print_table(rows, peer_rows)
  if peer_rows:
    print_peer_table(rows, peer_rows)
  if _JSON.value:
    from experiments.shared.files import write_json_atomically  # pylint: disable=g-import-not-at-top
    write_json_atomically(_JSON.value, dict(compute_dtype=_DTYPE.value, remat=_REMAT.value,
                                            attention_implementation=_IMPLEMENTATION.value, peak_flops=_PEAK.value,
                                            attention_block_size=_BLOCK.value,
                                            attention_key_block_size=_KEY_BLOCK.value, rows=rows,
                                            peer_rows=peer_rows), allow_nan=True)  # NaN: no baseline row


def _peer():
  from experiments.benchmarks import peer  # pylint: disable=g-import-not-at-top  (needs torch)
  return peer


def _child_row() -> dict:
  """--row=VARIANT:LENGTH: one row measured in this process (ours, or x-transformers' with --peer_row)."""
  variant, length, *kv_heads = _ROW.value.split(':')
  if _PEER_ROW.value:
    row = _peer().run_peer_row(variant, int(length), _BATCH.value, _STEPS.value, _WARMUP.value,
                               fused=_PEER_ROW.value == 'fused', vocab_size=_VOCAB.value,
                               model_dim=_MODEL_DIM.value, num_layers=_LAYERS.value, num_heads=_HEADS.value,
                               feed_forward_dim=_FF.value, compute_dtype=_DTYPE.value)
    row['model_flops_per_second'] = model_flops_per_step(
        row['parameters'], _LAYERS.value, _MODEL_DIM.value, int(length), _BATCH.value) / row['step_seconds_median']
  else:
    row = run_row(variant, int(length), int(kv_heads[0]) if kv_heads else 0)
  # the yardstick: stated, or measured beside the row's steps
  row['matmul_peak_flops'] = _PEAK.value or matmul_peak(dtype=_DTYPE.value)
  return row


def _checked_flags() -> tuple[list, list]:
  """The variants and lengths of the sweep, after every refusal of the flags."""
  import transformer  # pylint: disable=g-import-not-at-top
  variants = list(transformer.VARIANTS) if _POSITIONS.value == 'all' else _POSITIONS.value.split(',')
  unknown = [v for v in variants if v.partition('+')[0] not in transformer.VARIANTS or v.partition('+')[2] not in (
      '', 'ssmax')]
  if unknown:
    cli.fail(f'--positions: got {unknown}; valid: all, or some of {", ".join(transformer.VARIANTS)}, each alone or '
             'as KIND+ssmax')
  try:
    lengths = [int(n) for n in _LENGTHS.value.split(',')]
  except ValueError:
    lengths = []
  if not lengths or min(lengths) < 2:
    cli.fail(f'--lengths: got {_LENGTHS.value!r}; valid: comma-separated sequence lengths of at least 2, e.g. 256,1024')
  if not (_PEAK.value >= 0 and math.isfinite(_PEAK.value)):
    cli.fail(f'--peak_flops: got {_PEAK.value}; valid: a FLOP/s figure > 0, or 0 to measure one')
  if _MODEL_DIM.value % _HEADS.value:
    cli.fail(f'--num_heads: got {_HEADS.value}; valid: a divisor of --model_dim={_MODEL_DIM.value}')
  try:
    kv_counts = [int(n) for n in _KV_HEADS.value.split(',')]
  except ValueError:
    kv_counts = [-1]
  if any(n < 0 or (n and _HEADS.value % n) for n in kv_counts):
    cli.fail(f'--num_kv_heads: got {_KV_HEADS.value!r}; valid: comma-separated divisors of --num_heads={_HEADS.value} '
             '(0: num_heads)')
  if _PEER.value:
    if not _peer().peer_available():
      cli.fail(_peer().INSTALL_HINT)
    if _REMAT.value != 'none':
      cli.fail('--peer compares the step without rematerialisation; drop --remat')
  return variants, lengths, kv_counts


def _measure(variant: str, length: int, peer_setting: str | None = None, kv_heads: int = 0) -> dict:
  """One row, measured in a fresh process with this command's flags."""
  passthrough = [a for a in sys.argv[1:]
                 if not a.startswith(('--positions', '--lengths', '--json', '--peer', '--num_kv_heads'))]
  command = [sys.executable, '-m', 'experiments.benchmark', 'step', f'--row={variant}:{length}:{kv_heads}',
             *passthrough]
  implementation = 'ours'
  if peer_setting:
    command.append(f'--peer_row={peer_setting}')
    implementation = 'x-transformers' + (' attn_flash' if peer_setting == 'fused' else '')
  result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
  if result.returncode != 0:
    return dict(variant=variant, length=length, implementation=implementation,
                error=(result.stderr.strip().splitlines() or ['no output'])[-1])
  row = json.loads(result.stdout.strip().splitlines()[-1])
  row.setdefault('implementation', implementation)
  row['model_flops_utilisation'] = row['model_flops_per_second'] / row['matmul_peak_flops']
  return row


def _print_table(rows: list, peer_rows: list) -> None:
  """The table of our rows, each step time also as a ratio to none's at that length."""
  header = (f'{"variant":<16} {"length":>6} {"compile s":>9} {"step ms (min-max)":>22} {"tokens/s":>9} '
            f'{"MFU":>6} {"of GFLOP/s":>10} {"vs none":>7} {"peak MiB":>9} {"kv":>3} {"K,V cache MiB":>13}')
  peaks = [r['matmul_peak_flops'] for r in rows + peer_rows if 'error' not in r]
  measured = 'stated (--peak_flops)' if _PEAK.value else 'measured in each row\'s process after its steps'
  print(f'matmul peak ({_DTYPE.value}, {measured}): '
        f'{min(peaks, default=0) / 1e9:.1f}-{max(peaks, default=0) / 1e9:.1f} GFLOP/s'
        f'; attention core: {_IMPLEMENTATION.value}'
        f'{"; layers rematerialised (" + _REMAT.value + ")" if _REMAT.value != "none" else ""}'
        f'{f"; attention in blocks of {_BLOCK.value} queries" if _BLOCK.value else ""}'
        f'{f" and {_KEY_BLOCK.value} keys" if _BLOCK.value and _KEY_BLOCK.value else ""}')
  print(header)
  baseline = {(r['length'], r['kv_heads']): r['step_seconds_median'] for r in rows
              if r.get('variant') == 'none' and 'error' not in r}
  for row in rows:
    if 'error' in row:
      print(f'{row["variant"]:<16} {row["length"]:>6} failed: {row["error"]}')
      continue
    key = (row['length'], row['kv_heads'])
    ratio = row['step_seconds_median'] / baseline[key] if key in baseline else float('nan')
    print(f'{row["variant"]:<16} {row["length"]:>6} {row["compile_seconds"]:>9.1f} '
          f'{1e3 * row["step_seconds_median"]:>8.1f} ({1e3 * row["step_seconds_min"]:.0f}-'
          f'{1e3 * row["step_seconds_max"]:.0f}) {row["tokens_per_second"]:>9.0f} '
          f'{100 * row["model_flops_utilisation"]:>5.1f}% {row["matmul_peak_flops"] / 1e9:>10.1f} {ratio:>6.2f}x '
          f'{row["peak_memory_bytes"] / 2**20:>9.0f} {row["kv_heads"]:>3} {row["key_value_cache_bytes"] / 2**20:>13.2f}')


def print_peer_table(rows: list, peer_rows: list) -> None:
  """Ours against x-transformers at its fastest setting for the same variant and length."""
  print('\nagainst x-transformers (same config, same run; each MFU against the peak measured beside its row)')
  print(f'{"variant":<16} {"length":>6} {"ours tok/s":>10} {"theirs tok/s":>12} {"fused tok/s":>11} '
        f'{"their MFU":>9} {"ours / best":>11}')
  for row in rows:
    theirs = [r for r in peer_rows if (r['variant'], r['length']) == (row['variant'], row['length'])]
    if not theirs:
      continue
    timed = {r['implementation']: r for r in theirs if 'error' not in r}
    unfused = next((r for name, r in timed.items() if not name.endswith('attn_flash')), None)
    fused = next((r for name, r in timed.items() if name.endswith('attn_flash')), None)
    best = max(timed.values(), key=lambda r: r['tokens_per_second'], default=None)
    ours = row.get('tokens_per_second')

    def cell(r, width):
      return f'{r["tokens_per_second"]:>{width}.0f}' if r else f'{"-":>{width}}'

    ratio = f'{ours / best["tokens_per_second"]:>10.2f}x' if ours and best else f'{"-":>11}'
    their_mfu = f'{100 * best["model_flops_utilisation"]:>8.1f}%' if best else f'{"-":>9}'
    print(f'{row["variant"]:<16} {row["length"]:>6} {cell(row if ours else None, 10)} {cell(unfused, 12)} '
          f'{cell(fused, 11)} {their_mfu} {ratio}')
  for r in peer_rows:
    if 'error' in r:
      print(f'{r["variant"]:<16} {r["length"]:>6} {r["implementation"]} failed: {r["error"]}')
  from experiments.benchmarks import peer  # pylint: disable=g-import-not-at-top
  print('still different: ' + '; '.join(peer.DIFFERENCES))


if __name__ == '__main__':
  cli.run(main)
