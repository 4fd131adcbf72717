"""Algorithmic length generalisation: copy, reverse, sort, addition, parity, associative recall.
No data; every example is sampled from (seed, step, split, length).

Each task maps a problem of size n to an input x and an output y (symbols, already offset past
the specials). The layouts are shared:
  decoder-only:     BOS x SEP y EOS PAD ..   the loss covers y and EOS (teacher forcing)
  encoder-decoder:  source x;  target BOS y -> y EOS
Training sizes are drawn uniformly from [min_length, max_length]; evaluation fixes n.
"""

import numpy as np

from experiments.tasks.base import BOS, EOS, NUM_SPECIALS, PAD, SEP, Task, batch_rng


class AlgorithmicTask(Task):
  """Subclasses give the symbol count, the input and output sizes, and one example."""

  @property
  def num_symbols(self) -> int:
    return self.settings.vocab_size

  @property
  def vocab_size(self) -> int:
    return self.num_symbols + NUM_SPECIALS

  def input_size(self, n: int) -> int:
    return n

  def output_size(self, n: int) -> int:
    return n

  def scored(self, n: int) -> np.ndarray:
    """Which of the output_size(n) output symbols the loss and the accuracies cover (EOS always)."""
    return np.ones(self.output_size(n), bool)

  def example(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) for a problem of size n, as symbol indices in [0, num_symbols)."""
    raise NotImplementedError

  def sequence_length(self, length: int) -> int:
    if self.settings.model_kind == 'encoder_decoder':
      return max(self.input_size(length), self.output_size(length) + 1)
    return self.input_size(length) + self.output_size(length) + 2

  def batch(self, seed, step, split, batch_size, length=None):
    settings = self.settings
    rng = batch_rng(seed, split, step, length or 0)
    if length is None:
      sizes = rng.integers(settings.min_length, settings.max_length + 1, size=batch_size)
      padded = settings.max_length
    else:
      sizes = np.full(batch_size, length)
      padded = length
    examples = []
    for n in sizes:
      x, y = self.example(rng, int(n))
      scored = np.append(self.scored(int(n)), True).astype(np.float32)  # the outputs, then EOS
      examples.append((np.asarray(x) + NUM_SPECIALS, np.asarray(y) + NUM_SPECIALS, scored))
    if settings.model_kind == 'encoder_decoder':
      return self._encoder_decoder_batch(examples, padded)
    return self._decoder_only_batch(examples, padded)

  def _decoder_only_batch(self, examples, padded):
    width = self.input_size(padded) + self.output_size(padded) + 3
    sequence = np.full((len(examples), width), PAD, np.int32)
    weights = np.zeros((len(examples), width - 1), np.float32)
    valid = np.zeros((len(examples), width - 1), bool)
    for b, (x, y, scored) in enumerate(examples):
      row = np.concatenate([[BOS], x, [SEP], y, [EOS]])
      sequence[b, :len(row)] = row
      weights[b, len(x) + 1:len(x) + len(y) + 2] = scored  # predictions of y_1 .. y_m, EOS
      valid[b, :len(row) - 1] = True
    return dict(inputs=sequence[:, :-1], targets=sequence[:, 1:], weights=weights, valid=valid)

  def _encoder_decoder_batch(self, examples, padded):
    source = np.full((len(examples), self.input_size(padded)), PAD, np.int32)
    target = np.full((len(examples), self.output_size(padded) + 2), PAD, np.int32)
    source_valid = np.zeros(source.shape, bool)
    valid = np.zeros((len(examples), target.shape[1] - 1), bool)
    weights = np.zeros(valid.shape, np.float32)
    for b, (x, y, scored) in enumerate(examples):
      source[b, :len(x)] = x
      source_valid[b, :len(x)] = True
      target[b, :len(y) + 2] = np.concatenate([[BOS], y, [EOS]])
      valid[b, :len(y) + 1] = True
      weights[b, :len(y) + 1] = scored
    return dict(source=source, source_valid=source_valid, inputs=target[:, :-1], targets=target[:, 1:],
                weights=weights, valid=valid)

  def _random_symbols(self, rng, n):
    return rng.integers(0, self.num_symbols, size=n)


class Copy(AlgorithmicTask):
  """y = x, the Annotated Transformer's classic."""

  def example(self, rng, n):
    x = self._random_symbols(rng, n)
    return x, x


class Reverse(AlgorithmicTask):
  """y = x reversed."""

  def example(self, rng, n):
    x = self._random_symbols(rng, n)
    return x, x[::-1]


class Sort(AlgorithmicTask):
  """y = x sorted ascending."""

  def example(self, rng, n):
    x = self._random_symbols(rng, n)
    return x, np.sort(x)


class Addition(AlgorithmicTask):
  """a + b for two n-digit numbers. Digits are least significant first, the order in which carries
  propagate, and the operands are interleaved, so that output digit i sits at a fixed offset from
  the two digits it needs: x = a_0 b_0 a_1 b_1 .. a_{n-1} b_{n-1}, y = s_0 .. s_n
  (the "aligned" format of Lee et al. 2023, Teaching Arithmetic to Small Transformers; with the
  operands one after the other our 3-layer models stayed near 0.35 token accuracy in 2,000 steps).
  Symbols: the digits 0-9; task.vocab_size is not used."""

  @property
  def num_symbols(self):
    return 10

  def input_size(self, n):
    return 2 * n

  def output_size(self, n):
    return n + 1

  def example(self, rng, n):
    a, b = rng.integers(0, 10, size=n), rng.integers(0, 10, size=n)
    total = sum(int(d) * 10 ** i for i, d in enumerate(a)) + sum(int(d) * 10 ** i for i, d in enumerate(b))
    digits = [(total // 10 ** i) % 10 for i in range(n + 1)]
    return np.stack([a, b], axis=1).reshape(-1), np.asarray(digits)


class Parity(AlgorithmicTask):
  """y = (number of ones in the bit string x) mod 2: one output symbol. task.vocab_size is not used."""

  @property
  def num_symbols(self):
    return 2

  def output_size(self, n):
    return 1

  def example(self, rng, n):
    x = rng.integers(0, 2, size=n)
    return x, np.asarray([int(x.sum()) % 2])


class Recall(AlgorithmicTask):
  """Multi-query associative recall (MQAR; Arora et al. 2023, Zoology): n distinct keys each
  followed by its value, x = k_1 v_1 .. k_n v_n; then every key once in a random order, each
  followed by its value, y = q_1 v(q_1) .. q_n v(q_n). Only the values are scored: the queries are
  random. Keys are the first task.vocab_size symbols, values 10 further symbols."""
  NUM_VALUES = 10

  @property
  def num_symbols(self):
    return self.settings.vocab_size + self.NUM_VALUES

  def input_size(self, n):
    return 2 * n

  def output_size(self, n):
    return 2 * n

  def scored(self, n):
    return np.arange(self.output_size(n)) % 2 == 1

  def validate(self):
    longest = max(self.settings.max_length, *self.settings.eval_lengths)
    if self.settings.vocab_size < longest:
      return (f'task.vocab_size: got {self.settings.vocab_size}; valid: at least {longest} for recall, whose '
              f'keys are distinct (the longest length in task.max_length and task.eval_lengths)')
    return None

  def example(self, rng, n):
    keys = rng.choice(self.settings.vocab_size, size=n, replace=False)
    values = self.settings.vocab_size + rng.integers(0, self.NUM_VALUES, size=n)
    order = rng.permutation(n)
    pairs = np.stack([keys, values], axis=1).reshape(-1)
    return pairs, np.stack([keys[order], values[order]], axis=1).reshape(-1)


ALGORITHMIC_TASKS = {'copy': Copy, 'reverse': Reverse, 'sort': Sort, 'addition': Addition, 'parity': Parity,
                     'recall': Recall}
