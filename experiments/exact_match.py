"""Greedy exact match of a trained algorithmic run, per problem size.

  python -m experiments.exact_match --workdir=runs/copy [--lengths=1-16] [--examples=100]

prints, per size, the fraction of held-out ('test' split) examples whose greedy answer, EOS
included, is exactly the reference (the model writes every token itself), and writes
WORKDIR/greedy_exact_match.json.
"""

import os

import numpy as np
from absl import flags

import transformer
from experiments.runs import checkpoints, decoding
from experiments.shared import cli
from experiments.shared.files import write_json_atomically
from experiments.tasks.algorithmic import AlgorithmicTask

_WORKDIR = flags.DEFINE_string('workdir', None, 'A training run of an algorithmic task.')
_LENGTHS = flags.DEFINE_string('lengths', None, "Sizes, '1-16' or '4,8,16' (default: 1 to the training size).")
_EXAMPLES = flags.DEFINE_integer('examples', 100, 'Examples per size.')


def main(argv):
  del argv
  try:
    if not _WORKDIR.value:
      raise ValueError('--workdir: missing; valid: a training run directory of an algorithmic task')
    config, task, params = checkpoints.load_run(_WORKDIR.value)
    if not isinstance(task, AlgorithmicTask) or not all(task.scored(1)):
      raise ValueError(f'--workdir: task {task.settings.name!r} cannot be decoded greedily; valid: an algorithmic '
                       'task whose every output is scored (copy, reverse, sort, addition, parity)')
    lengths = decoding.parse_lengths(_LENGTHS.value or f'1-{task.settings.max_length}')
  except (OSError, KeyError, ValueError) as error:
    cli.fail(str(error))
  model = transformer.build_model(config, task.settings.model_kind)
  rates = {}
  print(f'{"size":>6} {"greedy exact match":>20}')
  for length in lengths:
    batch = task.batch(0, 0, 'test', _EXAMPLES.value, length=length)
    rates[length] = decoding.exact_match(task, model, params, batch, length)
    print(f'{length:>6} {rates[length]:>20.3f}', flush=True)
  print(f'{"mean":>6} {np.mean(list(rates.values())):>20.3f}')
  path = os.path.join(_WORKDIR.value, 'greedy_exact_match.json')
  write_json_atomically(path, dict(examples=_EXAMPLES.value, exact_match={str(k): v for k, v in rates.items()}))
  print(f'wrote {path}')


if __name__ == '__main__':
  cli.run(main)
