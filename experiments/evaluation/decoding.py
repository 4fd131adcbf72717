"""Decoding without teacher forcing: greedy answers of algorithmic tasks (the command line is
experiments/exact_match.py) and greedy or beam-search translations (experiments/translate.py)."""

import jax
import numpy as np

import transformer
from experiments.tasks.algorithmic import AlgorithmicTask
from experiments.tasks.base import BOS, EOS



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


def translations(task, model, params, split: str, length: int, beam_size: int, length_penalty: float,
                 batch_size: int = 32, use_cache: bool = True) -> list[tuple[str, str, str]]:
  """(source, reference, hypothesis) texts for every verse of one evaluation bucket of a
  translation task, decoded greedily (beam_size 1) or by beam search, through the decoder's cache
  unless use_cache is False."""
  members = task.bucket(split, length)
  pairs = {index: task.verse(split, index) for index in members}
  max_length = task.sequence_length(length)
  if beam_size == 1:
    decode = jax.jit(lambda p, s, v: transformer.greedy_decode(model, p, s, bos_id=BOS, max_length=max_length,
                                                               source_valid_BxLs=v, use_cache=use_cache))
  else:
    decode = jax.jit(lambda p, s, v: transformer.beam_search(
        model, p, s, bos_id=BOS, eos_id=EOS, max_length=max_length, beam_size=beam_size,
        length_penalty=length_penalty, source_valid_BxLs=v, use_cache=use_cache))
  results = []
  for start in range(0, len(members), batch_size):
    chunk = members[start:start + batch_size]
    source = np.zeros((batch_size, length + 1), np.int32)  # one shape per bucket: one compilation
    for row, index in enumerate(chunk):
      source[row, :len(pairs[index][0]) + 1] = np.append(pairs[index][0], EOS)
    decoded = np.asarray(decode({'params': params}, source, source != 0))
    for row, index in enumerate(chunk):
      results.append((task.text(pairs[index][0]), task.text(pairs[index][1]), task.text(decoded[row])))
  return results
