"""The corpus pipeline: prepare_corpus's throughput and peak memory by input size, and the data loader's
share of a training step.

  python -m experiments.benchmark corpus [--sizes_mb=50,200] [--tokenizers=bytes,bpe] [--vocab_size=8192]
                                         [--loader_config=configs/corpus.py] [--steps=20] [--warmup=3]

Generated text (seeded): documents of 2-40 KB of words drawn from a Zipf law over 30,000 made-up words,
in folders of 50 MB, so that the 200 MB input is the 50 MB one and three more. Each prepare runs as its own
process: wall time, MB of text per second, tokens per second, and its peak resident memory (the process's
maximum RSS, from wait4). Then the loader: the median time to build a training batch of loader_config
(memory-mapped windows; 'documents' packing also its positions and segments) and its share of the whole
step as the trainer runs it (batch, placement, step, metrics back), for both packings.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import flags

from experiments.benchmarks import seeds as seeds_benchmark
from experiments.shared import cli

_SIZES = flags.DEFINE_string('sizes_mb', '50,200', 'Comma-separated input sizes, in MB (multiples of 50).')
_TOKENIZERS = flags.DEFINE_string('tokenizers', 'bytes,bpe', 'Comma-separated tokenizers to prepare with.')
_VOCAB = flags.DEFINE_integer('vocab_size', 8192, 'The BPE vocabulary.', lower_bound=257)
_LOADER_CONFIG = flags.DEFINE_string('loader_config', 'configs/corpus.py', 'The config whose training step the '
                                     'loader is timed in; empty: skip the loader.')

FOLDER_MB = 50


def _words(rng: np.random.Generator, count: int = 30_000) -> np.ndarray:
  letters = np.array(list('etaoinshrdlucmfwypvbgkjqxz'))
  return np.array([''.join(rng.choice(letters, size=int(rng.integers(1, 11)))) for _ in range(count)])


def generate(directory: str, megabytes: int) -> None:
  """megabytes of documents, in folders part0, part1, ... of FOLDER_MB each."""
  rng = np.random.default_rng(0)
  words = _words(rng)
  for part in range(megabytes // FOLDER_MB):
    folder = os.path.join(directory, f'part{part}')
    os.makedirs(folder)
    written, index = 0, 0
    while written < FOLDER_MB * 1_000_000:
      ranks = np.minimum(rng.zipf(1.2, size=int(rng.integers(400, 8000))), len(words)) - 1
      text = ' '.join(words[ranks]) + '\n'
      with open(os.path.join(folder, f'{index:06d}.txt'), 'w', encoding='utf-8') as file:
        file.write(text)
      written, index = written + len(text), index + 1


def prepare(inputs: list[str], output: str, tokenizer: str) -> dict:
  command = [sys.executable, '-m', 'experiments.prepare_corpus', *(f'--input={path}' for path in inputs),
             f'--output={output}', f'--tokenizer={tokenizer}', f'--vocab_size={_VOCAB.value}']
  started = time.perf_counter()
  process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=os.getcwd()))
  _, status, usage = os.wait4(process.pid, 0)
  seconds = time.perf_counter() - started
  errors = process.stderr.read().decode(errors='replace')
  if os.waitstatus_to_exitcode(status) != 0:
    cli.fail(f'prepare_corpus on {inputs}: {(errors.strip().splitlines() or ["no output"])[-1]}')
  with open(os.path.join(output, 'manifest.json')) as file:
    manifest = json.load(file)
  text_bytes = sum(entry['text_bytes'] for entry in manifest['splits'].values())
  tokens = sum(entry['tokens'] for entry in manifest['splits'].values())
  return dict(tokenizer=tokenizer, input_mb=text_bytes / 1e6, seconds=seconds, mb_per_second=text_bytes / 1e6 / seconds,
              tokens_per_second=tokens / seconds, peak_rss_mib=usage.ru_maxrss / 1024)


def main(argv):
  del argv
  try:
    sizes = sorted({int(size) for size in _SIZES.value.split(',') if size.strip()})
  except ValueError:
    sizes = []
  if not sizes or any(size <= 0 or size % FOLDER_MB for size in sizes):
    cli.fail(f'--sizes_mb: got {_SIZES.value!r}; valid: comma-separated multiples of {FOLDER_MB}')
  tokenizers = [name.strip() for name in _TOKENIZERS.value.split(',') if name.strip()]
  if not tokenizers or any(name not in ('bytes', 'bpe') for name in tokenizers):
    cli.fail(f'--tokenizers: got {_TOKENIZERS.value!r}; valid: bytes, bpe or both, comma-separated')
  rows = []
  with tempfile.TemporaryDirectory() as scratch:
    print(f'generating {sizes[-1]} MB of text ...', file=sys.stderr, flush=True)
    generate(os.path.join(scratch, 'text'), sizes[-1])
    for size in sizes:
      inputs = [os.path.join(scratch, 'text', f'part{part}') for part in range(size // FOLDER_MB)]
      for tokenizer in tokenizers:
        rows.append(prepare(inputs, os.path.join(scratch, f'{tokenizer}-{size}'), tokenizer))
        print(f'{size} MB {tokenizer}: {rows[-1]["seconds"]:.1f} s', file=sys.stderr, flush=True)
  print('| tokenizer | input MB | wall s | MB/s | tokens/s | peak RSS MiB |\n|---|---|---|---|---|---|')
  for row in rows:
    print(f'| {row["tokenizer"]} | {row["input_mb"]:.1f} | {row["seconds"]:.1f} | {row["mb_per_second"]:.2f} | '
          f'{row["tokens_per_second"]:,.0f} | {row["peak_rss_mib"]:.0f} |')
  if _LOADER_CONFIG.value:
    print('\n| packing | batch ms (median) | step ms (median) | loader share of the step |\n|---|---|---|---|')
    for packing in ('stream', 'documents'):
      row = seeds_benchmark.run_row(_LOADER_CONFIG.value, 1, {'task.packing': packing})
      print(f'| {packing} | {row["batch_ms"]:.2f} | {row["step_ms"]:.1f} | {100 * row["batch_share"]:.1f}% |')
