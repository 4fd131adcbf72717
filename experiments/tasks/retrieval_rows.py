"""Retrieval examples mixed into a language model's training rows, so that retrieval can be learned at
the training length and probed beyond it (experiments/evaluation/probes.py): each row, with probability
task.passkey_fraction a passkey prompt with its answer (experiments/tasks/passkey.py), with probability
task.needle_fraction a prompt of task.needles needles with the asked number (experiments/tasks/needles.py),
otherwise the text it was. One draw per (seed, step, row) decides, so a run's batches stay a function of
its step.
"""

import numpy as np

from experiments.tasks import needles, passkey


def mix_into(batch: dict, settings, codec: passkey.Codec, stream: np.ndarray, seed: int, step: int,
             row_indices=None) -> dict:
  """The batch with rows replaced as the task's settings ask, each by a row of the same length: inputs
  BOS + row[:-1], targets row (weights and masks kept). row_indices: each row's index in the whole batch
  (a process's part of it, Task.batch_rows); by default 0, 1, ..."""
  inputs, targets = batch['inputs'].copy(), batch['targets'].copy()
  length = targets.shape[1]
  row_indices = range(len(targets)) if row_indices is None else row_indices
  for index, row in enumerate(row_indices):
    draw = np.random.default_rng([seed, step, row, 4]).uniform()
    if draw < settings.passkey_fraction:
      tokens = passkey.training_row(codec, stream, length, seed, step, row)
    elif draw < settings.passkey_fraction + settings.needle_fraction:
      tokens = needles.training_row(codec, stream, length, settings.needles, seed, step, row)
    else:
      continue
    inputs[index], targets[index] = tokens[:-1], tokens[1:]
  return dict(batch, inputs=inputs, targets=targets)


def check(task) -> str | None:
  """Why the task's settings cannot mix these rows in (None: they can)."""
  settings = task.settings
  fractions = [(name, getattr(settings, name)) for name in ('passkey_fraction', 'needle_fraction')
               if getattr(settings, name)]
  if not fractions:
    return None
  name, fraction = fractions[0]
  if settings.packing == 'documents':
    return (f"task.{name}: got {fraction} with task.packing='documents'; valid: 0, or packing 'stream' (a retrieval "
            'row is one document)')
  codec = passkey.codec_for(task)
  for name, fraction in fractions:
    if name == 'passkey_fraction':
      shortest, what = passkey.shortest_row(codec), "a passkey row's needle"
    else:
      shortest, what = needles.shortest_row(codec, settings.needles), f"a row's {settings.needles} needles"
    if settings.max_length < shortest:
      return (f'task.max_length: got {settings.max_length} with task.{name}={fraction}; valid: at least '
              f'{shortest}, {what}, question and answer')
  return None
