"""The task interface, and the token-prediction loss and metrics most tasks share."""

import abc
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

SPLITS = {'train': 0, 'eval': 1, 'test': 2}
PAD, BOS, SEP, EOS = 0, 1, 2, 3
NUM_SPECIALS = 4


def batch_rng(seed: int, split: str, step: int, length: int = 0) -> np.random.Generator:
  """The one source of randomness for data: a batch is a pure function of these four numbers."""
  if split not in SPLITS:
    raise ValueError(f'split: got {split!r}; valid: {", ".join(SPLITS)}')
  return np.random.default_rng([seed, SPLITS[split], step, length])


def evaluation_rows(count: int, eval_batches: int, batch_size: int, index: int) -> tuple[np.ndarray, np.ndarray]:
  """(item indices, weights) of evaluation batch `index` over `count` fixed items: an even spread
  of eval_batches * batch_size of them (all when there are no more), so every item is scored once;
  rows past the end repeat the last item with weight 0."""
  total = min(count, eval_batches * batch_size)
  spread = np.unique(np.round(np.linspace(0, count - 1, total)).astype(int))
  part = spread[index * batch_size:(index + 1) * batch_size]
  weights = np.zeros(batch_size, np.float32)
  weights[:len(part)] = 1.0
  part = part if len(part) else spread[-1:]
  return np.concatenate([part, np.repeat(part[-1:], batch_size - len(part))]), weights


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  name: str
  model_kind: str
  vocab_size: int
  min_length: int
  max_length: int
  eval_lengths: tuple
  eval_batches: int
  dataset: str = ''
  horizon: int = 1
  patch_length: int = 1
  path: str = ''
  packing: str = 'stream'
  passkey_fraction: float = 0.0  # shakespeare, corpus: training rows replaced by passkey prompts with answers
  needle_fraction: float = 0.0   # shakespeare, corpus: training rows replaced by needle prompts with answers
  needles: int = 4               # the needles in each of those rows, one asked for


class Task(abc.ABC):
  """A task. Batches are dicts of numpy arrays with a leading batch axis:
  decoder-only: inputs, targets, weights (loss mask), valid (padding mask), all B x Lt;
  encoder-decoder: additionally source and source_valid, B x Ls."""
  model_kinds: tuple = ('decoder_only', 'encoder_decoder')
  fixed_width_keys: tuple = ()  # batch arrays whose axis 1 is not time (evaluation pads the others)
  headline_metric: str = 'token_accuracy'  # the metric the training log line shows

  def __init__(self, settings: TaskSettings):
    self.settings = settings

  @property
  def vocab_size(self) -> int:
    """The model's vocabulary: the task's symbols plus the specials."""
    return self.settings.vocab_size + NUM_SPECIALS

  @abc.abstractmethod
  def batch(self, seed: int, step: int, split: str, batch_size: int, length: int | None = None) -> dict:
    """Training batches mix lengths up to max_length (length=None); evaluation fixes the length."""

  def batch_rows(self, seed: int, step: int, split: str, batch_size: int, rows: slice,
                 length: int | None = None) -> dict:
    """Rows `rows` of batch(seed, step, split, batch_size, length): the part of a global batch one process
    feeds its devices (experiments/runs/parallel.py, host_rows). This default makes the whole batch and
    slices it; a task that reads its data from disk overrides it to read those rows only."""
    return {name: array[rows] for name, array in self.batch(seed, step, split, batch_size, length).items()}

  @property
  def model_fields(self) -> dict:
    """ModelConfig fields the task decides (e.g. num_outputs, input_features)."""
    return {}

  def data_identity(self) -> str | None:
    """What names the task's data beyond its settings (a prepared corpus's SHA-256), recorded with a run so
    that a resume or a sweep on other data is refused; None when the settings name the data."""
    return None

  def validate(self) -> str | None:
    """A one-line message naming the field when the settings cannot work for this task."""
    return None

  def host_metrics(self, batch: dict) -> dict:
    """Extra summed metrics computed on the host in numpy (e.g. baselines on the same batch)."""
    del batch
    return {}

  def summarize(self, sums: dict) -> dict:
    return summarize(sums)

  @abc.abstractmethod
  def sequence_length(self, length: int) -> int:
    """The longest sequence the model sees for a problem of this length (for position tables)."""

  def model_inputs(self, batch: dict) -> tuple[tuple, dict]:
    if self.settings.model_kind == 'encoder_decoder':
      return ((batch['source'], batch['inputs']),
              dict(source_valid_BxLs=batch['source_valid'], target_valid_BxLt=batch['valid']))
    return (batch['inputs'],), dict(valid_BxL=batch['valid'])

  def loss_and_metrics(self, logits_BxLtxC, batch: dict, label_smoothing: float = 0.0) -> dict:
    """Sums (not means), so that devices and hosts can add them: loss, weight, correct tokens,
    correct sequences, sequences. The training objective is loss_sum / weight_sum."""
    return token_loss_and_metrics(logits_BxLtxC, batch['targets'], batch['weights'], label_smoothing)


def token_loss_and_metrics(logits_BxLtxC, targets_BxLt, weights_BxLt, label_smoothing: float) -> dict:
  """Cross-entropy with label smoothing (Szegedy et al. 2016; the paper uses 0.1), and accuracies."""
  vocab = logits_BxLtxC.shape[-1]
  logits = logits_BxLtxC.astype(jnp.float32)
  confidence = 1.0 - label_smoothing
  soft_targets = jax.nn.one_hot(targets_BxLt, vocab) * confidence + label_smoothing / vocab
  smoothed = optax.softmax_cross_entropy(logits, soft_targets)
  # Subtract the entropy of the soft targets so that a perfect prediction scores 0.
  floor = -(confidence * jnp.log(confidence) + label_smoothing * jnp.log(label_smoothing / vocab + 1e-20)) \
      if label_smoothing > 0 else 0.0
  cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits, targets_BxLt)
  weights = weights_BxLt.astype(jnp.float32)
  correct = (jnp.argmax(logits, -1) == targets_BxLt).astype(jnp.float32) * weights
  has_targets = jnp.sum(weights, axis=-1) > 0
  sequence_correct = jnp.logical_and(jnp.sum(correct, -1) == jnp.sum(weights, -1), has_targets)
  return dict(loss_sum=jnp.sum((smoothed - floor) * weights),
              cross_entropy_sum=jnp.sum(cross_entropy * weights),
              weight_sum=jnp.sum(weights),
              correct_tokens=jnp.sum(correct),
              correct_sequences=jnp.sum(sequence_correct.astype(jnp.float32)),
              sequences=jnp.sum(has_targets.astype(jnp.float32)))


def summarize(sums: dict) -> dict:
  """Means from summed metrics: loss (the objective), cross_entropy, token and sequence accuracy."""
  weight = max(float(sums['weight_sum']), 1.0)
  return dict(loss=float(sums['loss_sum']) / weight,
              cross_entropy=float(sums['cross_entropy_sum']) / weight,
              token_accuracy=float(sums['correct_tokens']) / weight,
              sequence_accuracy=float(sums['correct_sequences']) / max(float(sums['sequences']), 1.0))
