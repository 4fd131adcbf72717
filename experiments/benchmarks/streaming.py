"""A stream scored token by token: StreamingLLM's cache (experiments/evaluation/streaming.py: S sink tokens and the
most recent in N slots) against an ordinary cache that holds every position, at streams of several multiples of N.
Each row runs in its own process: time per token (the compiled scan, after one untimed run), XLA's temporary memory
for the compiled scan, and the process's peak resident memory. The model is a preset's, randomly initialised.

  python -m experiments.benchmark streaming [--config=configs/hybrid.py:rope] [--cache_size=128 --sink_tokens=4]
                                            [--multiples=8,64] [--repeats=2]
"""

import json
import resource
import subprocess
import sys
import time

from absl import flags

from experiments.shared import cli

_CONFIG = flags.DEFINE_string('config', 'configs/hybrid.py:rope', 'The model\'s config file (with :argument).')
_CACHE_SIZE = flags.DEFINE_integer('cache_size', 128, 'StreamingLLM\'s slots, sink tokens included.', lower_bound=2)
_SINK_TOKENS = flags.DEFINE_integer('sink_tokens', 4, 'The first tokens the cache keeps.', lower_bound=0)
_MULTIPLES = flags.DEFINE_string('multiples', '8,64', 'Comma-separated stream lengths, in multiples of --cache_size.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Timed runs of each row (the median is shown).', lower_bound=1)
_ROW = flags.DEFINE_string('row', None, 'Internal: run one row, "cache|length", and print its JSON.')


def _whole_cache_bits(model):
  """bits(params, inputs_1xL, targets_1xL) through an ordinary cache of L positions (created by a call on L zeros)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  @jax.jit
  def bits(params, inputs_1xL, targets_1xL):
    _, cache = model.apply({'params': params}, jnp.zeros_like(inputs_1xL), use_cache=True, mutable=['cache'])

    def step(carry, pair):
      token, target = pair
      logits, updated = model.apply({'params': params, 'cache': carry}, token[None, None], use_cache=True,
                                    mutable=['cache'])
      return updated['cache'], -jax.nn.log_softmax(logits[0, 0].astype(jnp.float32))[target]
    return jax.lax.scan(step, cache['cache'], (inputs_1xL[0], targets_1xL[0]))[1][None]
  return bits


def _row(cache: str, length: int) -> dict:
  # pylint: disable=g-import-not-at-top
  import jax
  import numpy as np
  import transformer
  from experiments.evaluation import streaming
  from experiments.runs.settings import from_config_dict
  config = from_config_dict(cli.load_config_file(_CONFIG.value), 1).model
  model = transformer.DecoderOnly(config)
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))['params']
  tokens = np.random.default_rng(0).integers(0, config.vocab_size, (1, length)).astype(np.int32)
  bits = (streaming.bits_function(model, _SINK_TOKENS.value, _CACHE_SIZE.value) if cache == 'streaming'
          else _whole_cache_bits(model))
  compiled = bits.lower(params, tokens, tokens).compile()
  temporary = compiled.memory_analysis().temp_size_in_bytes
  jax.block_until_ready(bits(params, tokens, tokens))
  seconds = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(bits(params, tokens, tokens))
    seconds.append(time.perf_counter() - start)
  return dict(cache=cache, length=length, us_per_token=1e6 * sorted(seconds)[len(seconds) // 2] / length,
              temporary_mb=temporary / 2**20, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              device=jax.devices()[0].device_kind)


def main(argv):
  del argv
  if _ROW.value:
    cache, length = _ROW.value.split('|')
    print(json.dumps(_row(cache, int(length))))
    return
  if _SINK_TOKENS.value >= _CACHE_SIZE.value:
    raise cli.CommandError(f'--sink_tokens: got {_SINK_TOKENS.value} with --cache_size={_CACHE_SIZE.value}; valid: '
                           'fewer sink tokens than slots')
  multiples = [int(part) for part in _MULTIPLES.value.split(',') if part.strip()]
  rows = []
  for multiple in multiples:
    for cache in ('streaming', 'whole'):
      row = f'--row={cache}|{multiple * _CACHE_SIZE.value}'
      command = [sys.executable, '-m', 'experiments.benchmark', 'streaming', row,
                 *[argument for argument in sys.argv[1:] if not argument.startswith('--row')]]
      done = subprocess.run(command, capture_output=True, text=True, check=True)
      rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
  print(f'{_CONFIG.value}, randomly initialised; a stream of random tokens scored one at a time; StreamingLLM: '
        f'{_SINK_TOKENS.value} sinks in {_CACHE_SIZE.value} slots; whole: an ordinary cache of the stream\'s length; '
        f'median of {_REPEATS.value}; {rows[0]["device"]}')
  print(f'{"cache":>10} {"tokens":>7} {"x slots":>8} {"us/token":>9} {"XLA temp MB":>12} {"peak RSS MB":>12}')
  for row in rows:
    print(f'{row["cache"]:>10} {row["length"]:>7} {row["length"] // _CACHE_SIZE.value:>8} {row["us_per_token"]:>9.1f} '
          f'{row["temporary_mb"]:>12.3f} {row["peak_rss_mb"]:>12.0f}')
