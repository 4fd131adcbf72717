"""Language modelling on a prepared corpus (experiments/prepare_corpus.py), scored in bits per byte.

Training windows come from train.bin and evaluation windows from heldout.bin only, each of task.max_length
(or an evaluation length) tokens, read through a memory map from starts drawn from (seed, split, step,
length). As in the Shakespeare task, a window's inputs are EOD then its first L - 1 tokens, so every window
starts with the token that begins a document, and the first target goes unscored. Two packings:

  stream     a window runs across document boundaries as one sequence, positions 0 .. L-1.
  documents  the same windows, but each EOD among the inputs begins a new document: attention stays within
             a document (segment ids) and positions restart at 0 at each EOD, so a token's position is its
             distance from its document's start or from the window's start, whichever is nearer.

bits_per_byte = sum of -log2 p(target) / sum of the targets' UTF-8 bytes (EOD: one), a score that
compares tokenizers; bits_per_token beside it; and on evaluation the unigram model of the training tokens
(add-one smoothing) on the same targets, the baseline a Transformer must beat.
"""

import functools
import math

import jax.numpy as jnp
import numpy as np

from experiments.data.corpus import open_corpus
from experiments.data.manifest import DataError
from experiments.tasks import passkey, retrieval_rows
from experiments.tasks.base import Task, batch_rng, summarize, token_loss_and_metrics

PACKINGS = ('stream', 'documents')
SPLIT_FILES = {'train': 'train', 'eval': 'heldout', 'test': 'heldout'}
REBUILD = 'python -m experiments.prepare_corpus --input=... --output=DIR'


@functools.lru_cache(maxsize=2)
def _unigram_bits(directory: str) -> np.ndarray:
  """-log2 p(token) under the training tokens' unigram model, add-one smoothed: [V]."""
  corpus = open_corpus(directory)
  tokens = corpus.tokens('train')
  counts = np.ones(corpus.vocab_size, np.float64)
  for start in range(0, len(tokens), 1 << 24):
    counts += np.bincount(tokens[start:start + (1 << 24)], minlength=corpus.vocab_size)
  return -np.log2(counts / counts.sum())


class Corpus(Task):
  model_kinds = ('decoder_only',)
  headline_metric = 'bits_per_byte'

  @property
  def corpus(self):
    return open_corpus(self.settings.path)

  @property
  def vocab_size(self) -> int:
    return self.corpus.vocab_size

  @property
  def bos(self) -> int:
    """The token in front of every window (and of every probe's prompt): the tokenizer's BOS where its sequences
    start with one (Gemma's, which the corpus also writes before every document), else EOD, which precedes every
    document but the first."""
    corpus = self.corpus
    return corpus.eod if corpus.tokenizer.bos is None else corpus.tokenizer.bos

  @property
  def token_bytes(self) -> np.ndarray:
    """Each token's UTF-8 bytes (EOD: one): the denominator of bits per byte."""
    return self.corpus.token_bytes

  def data_identity(self) -> str | None:
    """The corpus's identity; None for a run with no corpus (a model imported without one)."""
    return self.corpus.identity if self.settings.path else None

  def validate(self):
    settings = self.settings
    if not settings.path:
      return f'task.path: empty; valid: a folder that {REBUILD} wrote'
    if settings.packing not in PACKINGS:
      return f'task.packing: got {settings.packing!r}; valid: {", ".join(PACKINGS)}'
    try:
      corpus = self.corpus
    except DataError as error:
      return f'task.path: {error}'
    if settings.packing == 'documents':
      longest = int(np.diff(np.append(corpus.document_starts('train'), len(corpus.tokens('train')))).max())
      if settings.max_length > longest:
        return (f'task.max_length: got {settings.max_length} with task.packing=\'documents\'; valid: at most {longest}, '
                f'the longest training document of {settings.path} (positions restart in each document, so a longer '
                f'window would train positions no document reaches)')
    for split, lengths, field in (('train', (settings.max_length,), 'task.max_length'),
                                  ('heldout', settings.eval_lengths, 'task.eval_lengths')):
      available = len(corpus.tokens(split))
      if max(lengths) >= available:
        return (f'{field}: got {max(lengths)}; valid: lengths below the {available} tokens of {settings.path}\'s '
                f'{split} split')
    return retrieval_rows.check(self)

  def sequence_length(self, length: int) -> int:
    return length

  def stream(self, split: str) -> np.ndarray:
    """The split's tokens, documents one after another (EOD between them), as a memory map."""
    return self.corpus.tokens(SPLIT_FILES[split])

  def batch(self, seed, step, split, batch_size, length=None):
    return self.batch_rows(seed, step, split, batch_size, slice(0, batch_size), length)

  def batch_rows(self, seed, step, split, batch_size, rows, length=None):
    """Reads the windows of `rows` only: every row's start is drawn, as for the whole batch, then sliced."""
    tokens = self.stream(split)
    length = length or self.settings.max_length
    starts = batch_rng(seed, split, step, length).integers(0, len(tokens) - length + 1, size=batch_size)
    row_indices = range(batch_size)[rows]
    targets = np.stack([tokens[start:start + length] for start in starts[rows]]).astype(np.int32)
    count = len(row_indices)
    inputs = np.concatenate([np.full((count, 1), self.bos, np.int32), targets[:, :-1]], axis=1)
    weights = np.ones((count, length), np.float32)
    weights[:, 0] = 0.0  # the first target has bos alone before it, which every window starts with
    batch = dict(inputs=inputs, targets=targets, weights=weights, valid=np.ones((count, length), bool))
    if split == 'train' and (self.settings.passkey_fraction or self.settings.needle_fraction):
      batch = retrieval_rows.mix_into(batch, self.settings, passkey.codec_for(self), tokens, seed, step, row_indices)
    return dict(batch, **self.packed_rows(batch['inputs']))

  def packed_rows(self, inputs_BxL: np.ndarray) -> dict:
    """With packing 'documents': positions (B x L) restarting at 0 at each document's first input (EOD, or BOS where
    the corpus writes BOS before every document: self.bos), and segments (B x L) counting those so far; {} with
    'stream'."""
    if self.settings.packing != 'documents':
      return {}
    is_start = inputs_BxL == self.bos
    is_start[:, 0] = True
    index = np.arange(inputs_BxL.shape[1])[None]
    last_start = np.maximum.accumulate(np.where(is_start, index, 0), axis=1)
    return dict(positions=(index - last_start).astype(np.int32),
                segments=(np.cumsum(is_start, axis=1) - 1).astype(np.int32))

  def model_inputs(self, batch):
    packed = {f'{name}_BxL': batch[name] for name in ('positions', 'segments') if name in batch}
    return (batch['inputs'],), dict(valid_BxL=batch['valid'], **packed)

  def loss_and_metrics(self, logits_BxLtxC, batch, label_smoothing: float = 0.0) -> dict:
    metrics = token_loss_and_metrics(logits_BxLtxC, batch['targets'], batch['weights'], label_smoothing)
    token_bytes = jnp.asarray(self.token_bytes, jnp.float32)
    metrics['byte_sum'] = jnp.sum(token_bytes[batch['targets']] * batch['weights'].astype(jnp.float32))
    return metrics

  def host_metrics(self, batch):
    unigram = _unigram_bits(self.corpus.directory)
    return dict(unigram_bits_sum=float((unigram[batch['targets']] * batch['weights']).sum()))

  def summarize(self, sums):
    summary = summarize(sums)
    summary['bits_per_token'] = summary['cross_entropy'] / math.log(2)
    byte_sum = max(float(sums['byte_sum']), 1.0)
    summary['bits_per_byte'] = float(sums['cross_entropy_sum']) / math.log(2) / byte_sum
    if 'unigram_bits_sum' in sums:
      summary['unigram_bits_per_byte'] = float(sums['unigram_bits_sum']) / byte_sum
    return summary
