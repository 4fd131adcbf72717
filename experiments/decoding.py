"""Greedy decoding of algorithmic tasks: the model writes the whole answer itself, no teacher forcing."""

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


