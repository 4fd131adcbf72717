"""A pretrained model's forward pass and greedy decoding here beside transformers' on the same checkpoint, each row
in its own process (one side, one measurement), so that each peak resident memory is that side's own.

  python -m experiments.benchmark pretrained --source=runs/smollm2 [--lengths=2048,8192 --prompt_length=4096]
                                             [--new_tokens=256 --repeats=3 --sides=ours,transformers]

--source is a run imported by experiments.import_checkpoint: ours is the run, and transformers loads the GGUF file or
Hugging Face folder its config.json records under source. Forward: random tokens of each
length, batch 1, float32 both sides; ours is what `evaluate` runs (the hidden states, then the logits and each
target's bits in chunks of positions: long_context.bits_function), transformers' the logits of one call and their
loss. Decoding: --new_tokens greedy tokens after a prompt of --prompt_length through each side's cache (ours:
transformer.models.decoder_only_generate jitted whole; transformers: generate), the rate counting the new tokens over
the whole call, the prompt's pass included. Each time is the best of --repeats after one untimed warm-up; ours also
gives the first call's excess over the best, its compilation. Ours runs under evaluate's XLA schedule
(experiments/shared/xla_cpu.py, unless XLA_FLAGS set it). Sides alternate row by row.
"""

import json
import os
import resource
import subprocess
import sys
import time

from absl import flags

from experiments.evaluation import decoding
from experiments.shared import cli, xla_cpu

_SOURCE = flags.DEFINE_string('source', None, 'A run imported by experiments.import_checkpoint.')
_LENGTHS = flags.DEFINE_string('lengths', '2048,8192', 'Comma-separated forward lengths in tokens.')
_PROMPT = flags.DEFINE_integer('prompt_length', 4096, 'Decoding: the prompt\'s tokens.', lower_bound=1)
_NEW_TOKENS = flags.DEFINE_integer('new_tokens', 256, 'Decoding: greedy tokens generated (0: no decoding row).',
                                   lower_bound=0)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed runs of each row after the warm-up (the best is shown).',
                                lower_bound=1)
_SIDES = flags.DEFINE_string('sides', 'ours,transformers', 'Comma-separated: ours, transformers.')
_ROW = flags.DEFINE_string('row', None, 'Internal: run one row, "side|kind|length", and print its JSON.')
SIDES = ('ours', 'transformers')


def checkpoint_of(source: str) -> tuple:
  """(path, format) of the checkpoint an imported run was read from (its config.json's source)."""
  record = os.path.join(source, 'config.json')
  recorded = None
  if os.path.isfile(record):
    with open(record, encoding='utf-8') as file:
      recorded = json.load(file).get('source')
  if not recorded:
    raise cli.CommandError(f'--source: got {source!r}, which is no run imported from a checkpoint; valid: a run made '
                           'by experiments.import_checkpoint (import the GGUF file or Hugging Face folder first)')
  return recorded['path'], recorded['format']


def _best(function, repeats: int) -> tuple:
  """(best seconds of repeats, seconds of the untimed first call)."""
  start = time.perf_counter()
  function()
  first = time.perf_counter() - start
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    function()
    seconds.append(time.perf_counter() - start)
  return min(seconds), first


def _ours(kind: str, length: int) -> dict:
  # pylint: disable=g-import-not-at-top
  import functools
  import jax
  import jax.numpy as jnp
  import numpy as np
  import transformer
  from experiments.evaluation import long_context
  from experiments.runs import checkpoints
  xla_cpu.schedule_for_memory()  # as evaluate runs it; before the first computation starts JAX's backend
  model, variables, _ = checkpoints.load_model(_SOURCE.value)
  params = jax.tree_util.tree_map(jnp.asarray, variables['params'])
  rng = np.random.default_rng(0)
  if kind == 'forward':
    tokens = jnp.asarray(rng.integers(0, model.config.vocab_size, (1, length + 1)), jnp.int32)
    bits = long_context.bits_function(model)
    run = lambda: jax.block_until_ready(bits(params, tokens[:, :-1], tokens[:, 1:], {}))
  else:
    prompt = jnp.asarray(rng.integers(0, model.config.vocab_size, (1, length)), jnp.int32)
    generate = jax.jit(functools.partial(transformer.models.decoder_only_generate, model,
                                         num_new_tokens=_NEW_TOKENS.value))
    run = lambda: jax.block_until_ready(generate({'params': params}, prompt))
  best, first = _best(run, _REPEATS.value)
  scheduled = f'{xla_cpu.SCHEDULER_FLAG}=false' in os.environ.get('XLA_FLAGS', '')
  return dict(seconds=best, compile_seconds=max(0.0, first - best),
              device=jax.devices()[0].device_kind + (', XLA scheduled for memory as evaluate' if scheduled else ''))


def _transformers(kind: str, length: int) -> dict:
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import torch
  import transformers
  path, source_format = checkpoint_of(_SOURCE.value)
  if source_format == 'gguf':
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                                              gguf_file=os.path.basename(path), dtype=torch.float32)
  else:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  model.eval()
  rng = np.random.default_rng(0)
  vocab = model.config.vocab_size
  if kind == 'forward':
    tokens = torch.tensor(rng.integers(0, vocab, (1, length + 1)))

    def run():
      with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits[0].float(), tokens[0, 1:])
  else:
    prompt = torch.tensor(rng.integers(0, vocab, (1, length)))

    def run():
      with torch.no_grad():
        return model.generate(prompt, max_new_tokens=_NEW_TOKENS.value, min_new_tokens=_NEW_TOKENS.value,
                              do_sample=False)
  best, first = _best(run, _REPEATS.value)
  return dict(seconds=best, compile_seconds=0.0, device=f'PyTorch {torch.__version__}, {torch.get_num_threads()} '
                                                        'threads')


def _row(side: str, kind: str, length: int) -> dict:
  measured = (_ours if side == 'ours' else _transformers)(kind, length)
  return dict(measured, side=side, kind=kind, length=length,
              peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _rows_to_run(sides: list, lengths: list) -> list:
  rows = [(side, 'forward', length) for length in lengths for side in sides]
  if _NEW_TOKENS.value:
    rows += [(side, 'decode', _PROMPT.value) for side in sides]
  return rows


def _print_table(rows: list) -> None:
  print(f'--source={_SOURCE.value}; float32, batch 1, random tokens; best of {_REPEATS.value} after a warm-up; each '
        f'row its own process; ours on {rows[0]["device"]}')
  print(f'{"side":>13} {"what":>22} {"seconds":>8} {"tokens/s":>9} {"compile s":>10} {"peak RSS MB":>12}')
  for row in rows:
    what = (f'forward {row["length"]}' if row['kind'] == 'forward'
            else f'{_NEW_TOKENS.value} after {row["length"]}')
    tokens = row['length'] if row['kind'] == 'forward' else _NEW_TOKENS.value
    print(f'{row["side"]:>13} {what:>22} {row["seconds"]:>8.3f} {tokens / row["seconds"]:>9.1f} '
          f'{row["compile_seconds"]:>10.1f} {row["peak_rss_mb"]:>12.0f}')


def main(argv):
  del argv
  if _ROW.value:
    side, kind, length = _ROW.value.split('|')
    print(json.dumps(_row(side, kind, int(length))))
    return
  if not _SOURCE.value:
    raise cli.CommandError('--source: missing; valid: a run made by experiments.import_checkpoint')
  checkpoint_of(_SOURCE.value)
  sides = [side.strip() for side in _SIDES.value.split(',') if side.strip()]
  if not sides or set(sides) - set(SIDES):
    raise cli.CommandError(f'--sides: got {_SIDES.value!r}; valid: a comma-separated list of {", ".join(SIDES)}')
  try:
    lengths = decoding.parse_lengths(_LENGTHS.value)
  except ValueError as error:
    raise cli.CommandError(str(error)) from None
  rows = []
  for side, kind, length in _rows_to_run(sides, lengths):
    command = [sys.executable, '-m', 'experiments.benchmark', 'pretrained', f'--row={side}|{kind}|{length}',
               *[argument for argument in sys.argv[1:] if not argument.startswith('--row')]]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
      raise cli.CommandError(f'the {side} {kind} row at {length} failed: {done.stderr.strip()[-600:]}')
    rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
  _print_table(rows)
