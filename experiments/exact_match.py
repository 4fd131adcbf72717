"""Greedy exact match of a trained algorithmic run, per problem size.

  python -m experiments.exact_match --workdir=runs/copy [--lengths=1-16] [--examples=100]

prints, per size, the fraction of held-out ('test' split) examples whose greedy answer, EOS
included, is exactly the reference (the model writes every token itself), and writes
WORKDIR/greedy_exact_match.json (or --output): the examples per size, the checkpoint's step and the rate per
size. A rerun adds the sizes it lacks; one that measures otherwise (other examples, a newer checkpoint) is
refused, and the file kept, unless --output names another file.
"""

import json
import os

import numpy as np
from absl import flags

import transformer
from experiments.runs import checkpoints
from experiments.evaluation import decoding
from experiments.shared import cli
from experiments.shared.files import write_json_atomically
from experiments.tasks.algorithmic import AlgorithmicTask

_WORKDIR = flags.DEFINE_string('workdir', None, 'A training run of an algorithmic task.')
_LENGTHS = flags.DEFINE_string('lengths', None, "Sizes, '1-16' or '4,8,16' (default: 1 to the training size).")
_EXAMPLES = flags.DEFINE_integer('examples', 100, 'Examples per size.', lower_bound=1)
_OUTPUT = flags.DEFINE_string('output', None, 'The results file (default: WORKDIR/greedy_exact_match.json).')
RESULTS_FILE = 'greedy_exact_match.json'


def previous_results(path: str, examples: int, step: int) -> dict:
  """The rates already in `path` by size, when it records the same examples per size and checkpoint; a
  ValueError when it records another measurement (it is kept: the command writes elsewhere or not at all)."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as file:
      recorded = json.load(file)
    rates = {int(size): float(rate) for size, rate in recorded['exact_match'].items()}
    measured = (recorded['examples'], recorded.get('checkpoint_step'))
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
    raise ValueError(f'--output: {path} exists and is not a results file of this command ({type(error).__name__}); '
                     f'valid: --output=<another file>') from None
  if measured != (examples, step):
    raise ValueError(f'--output: {path} holds {measured[0]} examples per size from the checkpoint at step '
                     f'{measured[1]}, and this is {examples} from step {step}; valid: --output=<another file>')
  return rates


def main(argv):
  del argv
  try:
    if not _WORKDIR.value:
      raise ValueError('--workdir: missing; valid: a training run directory of an algorithmic task')
    config, task = checkpoints.run_model(_WORKDIR.value)
    if not isinstance(task, AlgorithmicTask) or not all(task.scored(1)):
      raise ValueError(f'--workdir: task {task.settings.name!r} cannot be decoded greedily; valid: an algorithmic '
                       'task whose every output is scored (copy, reverse, sort, addition, parity)')
    lengths = decoding.parse_lengths(_LENGTHS.value or f'1-{task.settings.max_length}')
    rows = config.position.settings.longest_sequence()
    longest = task.sequence_length(max(lengths))
    if rows is not None and longest > rows:
      raise ValueError(f'--lengths: size {max(lengths)} makes sequences of {longest}, beyond the {rows} positions of '
                       f'the {config.position.kind} table; valid: sizes whose sequences fit in {rows}')
    step = checkpoints.newest_intact_step(_WORKDIR.value)
    path = _OUTPUT.value or os.path.join(_WORKDIR.value, RESULTS_FILE)
    cli.check_output_path('--output', path)
    rates = previous_results(path, _EXAMPLES.value, step)
    config, note = checkpoints.core_for(config, decoding=True)
    params = checkpoints.restore_params(_WORKDIR.value, step)
  except (OSError, KeyError, ValueError, cli.CommandError) as error:
    cli.fail(str(error))
  if note:
    print(note)
  model = transformer.build_model(config, task.settings.model_kind)
  print(f'{"size":>6} {"greedy exact match":>20}')
  for length in lengths:
    if length not in rates:
      batch = task.batch(0, 0, 'test', _EXAMPLES.value, length=length)
      rates[length] = decoding.exact_match(task, model, params, batch, length)
    print(f'{length:>6} {rates[length]:>20.3f}', flush=True)
  print(f'{"mean":>6} {np.mean([rates[length] for length in lengths]):>20.3f}')
  write_json_atomically(path, dict(examples=_EXAMPLES.value, checkpoint_step=int(step),
                                   exact_match={str(k): v for k, v in sorted(rates.items())}))
  print(f'wrote {path}')


if __name__ == '__main__':
  cli.run(main)
