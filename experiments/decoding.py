"""Greedy decoding of algorithmic tasks: the model writes the whole answer itself, no teacher forcing.
The command line is experiments/exact_match.py."""


import jax
import numpy as np

import transformer
from experiments.tasks.algorithmic import AlgorithmicTask
from experiments.tasks.base import BOS



def greedy_answers(task: AlgorithmicTask, model, params, batch: dict, length: int) -> np.ndarray:
  """The model's answers y (then EOS) for a fixed-size batch, as a B x (output_size + 1) token array."""
  answer_length = task.output_size(length) + 1
  if task.settings.model_kind == 'encoder_decoder':
    decoded = jax.jit(lambda p, s, v: transformer.greedy_decode(model, p, s, bos_id=BOS, max_length=answer_length,
                                                                source_valid_BxLs=v))(
        {'params': params}, batch['source'], batch['source_valid'])
    return np.asarray(decoded)
  prompt = batch['inputs'][:, :task.input_size(length) + 2]  # BOS x SEP
  generated = jax.jit(lambda p, x: transformer.decoder_only_generate(model, p, x, answer_length))(
      {'params': params}, prompt)
  return np.asarray(generated[:, prompt.shape[1]:])


def exact_match(task: AlgorithmicTask, model, params, batch: dict, length: int) -> float:
  """Fraction of examples whose greedy answer, EOS included, equals the reference exactly."""
  answers = greedy_answers(task, model, params, batch, length)
  reference = batch['targets'][:, task.input_size(length) + 1:][:, :answers.shape[1]] \
      if task.settings.model_kind == 'decoder_only' else batch['targets']
  return float(np.mean(np.all(answers == reference, axis=1)))


def parse_lengths(text: str) -> list[int]:
  """'1-16' or '4,8,16' -> sizes; a ValueError names the flag and what would be valid."""
  try:
    if '-' in text:
      first, last = (int(part) for part in text.split('-'))
      lengths = list(range(first, last + 1))
    else:
      lengths = [int(part) for part in text.split(',')]
  except ValueError:
    lengths = []
  if not lengths or min(lengths) < 1:
    raise ValueError(f"--lengths: got {text!r}; valid: a range such as '1-16' or a list such as '4,8,16' of "
                     'positive sizes')
  return lengths
