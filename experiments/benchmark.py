"""Benchmarks, one command with nine subcommands (each prints a table; see BENCHMARKS.md):

  python -m experiments.benchmark [step] [--positions=all --lengths=256,1024 --peer ...]
      the training step of every positional variant: time, tokens/s, MFU, peak memory
      (experiments/benchmarks/step.py; `step` is the default)
  python -m experiments.benchmark attention [--length=1024 ...]
      one attention's forward and backward with each way of adding a relative term, and each core
      (experiments/benchmarks/attention.py)
  python -m experiments.benchmark matmul [--length=256 ...]
      every matmul of the reference step alone, on both cores and on one
      (experiments/benchmarks/matmul.py)
  python -m experiments.benchmark seeds [--configs=configs/algorithmic.py:copy --seeds=1,2,4,8 ...]
      the training step of N seeds in one program (jax.vmap) against one seed alone
      (experiments/benchmarks/seeds.py)
  python -m experiments.benchmark corpus [--sizes_mb=50,200 --tokenizers=bytes,bpe ...]
      prepare_corpus's throughput and peak memory by input size, and the data loader's share of a step
      (experiments/benchmarks/corpus.py)
  python -m experiments.benchmark sharding [--config=configs/corpus.py --steps=5 ...]
      a replicated state against fsdp and tensor splits on 8 devices, and remat and gradient accumulation
      on one: step time and memory per device (experiments/benchmarks/sharding.py)
  python -m experiments.benchmark sweep [--config=configs/algorithmic.py:copy --jobs=1,2 --repeats=2 ...]
      one compare sweep's wall time with each --jobs value, and whether their tables are the same
      (experiments/benchmarks/sweep.py)
  python -m experiments.benchmark streaming [--cache_size=128 --sink_tokens=4 --multiples=8,64 ...]
      a stream scored token by token through StreamingLLM's cache against a cache of every position: time per
      token and memory by stream length (experiments/benchmarks/streaming.py)
  python -m experiments.benchmark pretrained --source=RUN [--lengths=2048,8192 --new_tokens=256 ...]
      a pretrained model's forward pass and greedy decoding beside transformers' on the same checkpoint: time,
      compilation and peak memory, each row in its own process (experiments/benchmarks/pretrained.py)
"""

from experiments.shared.signals import STOP  # first: a stop signal during the imports below exits cleanly too

STOP.install()

# pylint: disable=g-import-not-at-top,wrong-import-position
import sys


def _step():
  from experiments.benchmarks import step
  return step


def _attention():
  from experiments.benchmarks import attention
  return attention


def _matmul():
  from experiments.benchmarks import matmul
  return matmul


def _corpus():
  from experiments.benchmarks import corpus
  return corpus


def _sharding():
  from experiments.benchmarks import sharding
  return sharding


def _sweep():
  from experiments.benchmarks import sweep
  return sweep


def _streaming():
  from experiments.benchmarks import streaming
  return streaming


def _pretrained():
  from experiments.benchmarks import pretrained
  return pretrained


def _seeds():
  from experiments.benchmarks import seeds
  return seeds


SUBCOMMANDS = {'step': _step, 'attention': _attention, 'matmul': _matmul, 'seeds': _seeds, 'corpus': _corpus,
               'sharding': _sharding, 'sweep': _sweep, 'streaming': _streaming, 'pretrained': _pretrained}  # each module defines its own flags


def main():
  name = 'step'
  if len(sys.argv) > 1 and not sys.argv[1].startswith('-'):
    name = sys.argv.pop(1)
  if name not in SUBCOMMANDS:
    print(f'error: subcommand: got {name!r}; valid: {", ".join(SUBCOMMANDS)}', file=sys.stderr)
    sys.exit(2)
  from experiments.shared import cli
  cli.run(SUBCOMMANDS[name]().main)


if __name__ == '__main__':
  main()
