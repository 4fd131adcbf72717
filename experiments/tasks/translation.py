"""Translation, Spanish to English, on the verse-aligned Bible (Reina-Valera 1909 -> King James).

Data: experiments/data/bible/, one joint byte-pair vocabulary of 4,000 pieces trained offline on the
training books; held-out books for 'eval' (Ruth, Jonah, James, 1 Peter) and 'test' (Esther, Micah,
Philippians, 1 John). A problem of length n is a verse whose Spanish side has at most n pieces:
source x EOS, target input BOS y, targets y EOS. Training draws verses of up to task.max_length
pieces (train on short); evaluation at length n scores the held-out verses whose source has more
pieces than the next shorter evaluation length and at most n, so the longer buckets measure length
generalisation on real text. Teacher-forced metrics here (cross-entropy, token accuracy); BLEU and
chrF of greedy and beam-search translations per bucket come from `python -m experiments.translate`.
Verses whose English side is longer than twice the Spanish plus 8 pieces (10 of 31,000; alignment
slips) are left out, so that sequence_length bounds every target.

Ids: the vocabulary's pieces keep their ids from 4 on; 0 pads, 1 begins a target, 3 ends a
sequence (the task specials), and 2 stands for the vocabulary's unknown piece.
"""

import functools

import numpy as np

from experiments.data import bible
from experiments.data.manifest import DataError
from experiments.tasks.base import BOS, EOS, PAD, Task, batch_rng, evaluation_rows

UNKNOWN = 2
PIECE_UNKNOWN = 3  # the id of <unk> in the vocabulary file


def to_task_ids(piece_ids: np.ndarray) -> np.ndarray:
  return np.where(piece_ids == PIECE_UNKNOWN, UNKNOWN, piece_ids).astype(np.int32)


def longest_target(length: int) -> int:
  return 2 * length + 8


class Translation(Task):
  model_kinds = ('encoder_decoder',)

  @property
  def vocab_size(self) -> int:
    return len(self.pieces)

  @functools.cached_property
  def pieces(self) -> list[str]:
    return bible.load()[1]

  def validate(self):
    if self.settings.dataset not in ('', 'bible_es_en'):
      return f'task.dataset: got {self.settings.dataset!r}; valid for translation: bible_es_en'
    try:
      self._verses  # pylint: disable=pointless-statement
    except DataError as error:
      return str(error)
    lengths = sorted(self.settings.eval_lengths)
    if lengths[0] < 1 or len(set(lengths)) != len(lengths):
      return f'task.eval_lengths: got {self.settings.eval_lengths}; valid: distinct positive source lengths'
    return None

  @functools.cached_property
  def _verses(self) -> dict:
    """split -> (spanish id arrays, english id arrays, source lengths, target lengths), alignment
    slips removed."""
    verses, _ = bible.load()
    kept = {}
    for split, rows in verses.items():
      pairs = [(to_task_ids(es), to_task_ids(en)) for _, _, _, es, en in rows
               if len(en) <= longest_target(len(es))]
      kept[split] = ([es for es, _ in pairs], [en for _, en in pairs], np.asarray([len(es) for es, _ in pairs]),
                     np.asarray([len(en) for _, en in pairs]))
    return kept

  def bucket(self, split: str, length: int) -> np.ndarray:
    """Indices of the verses of evaluation length `length`: source longer than the next shorter
    evaluation length (0 for the shortest) and at most `length` pieces."""
    shorter = [n for n in self.settings.eval_lengths if n < length]
    lower = max(shorter) if shorter else 0
    source_lengths = self._verses[split][2]
    return np.flatnonzero((source_lengths > lower) & (source_lengths <= length))

  def verse(self, split: str, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(Spanish ids, English ids) of one verse."""
    spanish, english = self._verses[split][:2]
    return spanish[index], english[index]

  def sequence_length(self, length: int) -> int:
    return longest_target(length) + 1

  def members(self, split: str, length: int | None) -> np.ndarray:
    """The verses a batch draws from: training sizes (length None) or one evaluation bucket."""
    if length is not None:
      return self.bucket(split, length)
    source_lengths = self._verses[split][2]
    return np.flatnonzero((source_lengths >= self.settings.min_length) & (source_lengths <= self.settings.max_length))

  @functools.lru_cache(maxsize=None)
  def _target_width(self, split: str, length: int | None) -> int:
    """1 + the longest target among the verses a batch draws from: fixed per bucket, so one compilation."""
    return 1 + int(self._verses[split][3][self.members(split, length)].max(initial=0))

  def rows(self, seed, step, split, batch_size, length=None):
    """(verse indices, row weights) of a batch."""
    members = self.members(split, length)
    if length is None:
      rng = batch_rng(seed, split, step)
      return members[rng.integers(0, len(members), size=batch_size)], np.ones(batch_size, np.float32)
    if not len(members):
      return np.zeros(batch_size, int), np.zeros(batch_size, np.float32)
    rows, weights = evaluation_rows(len(members), self.settings.eval_batches, batch_size, step)
    return members[rows], weights

  def batch(self, seed, step, split, batch_size, length=None):
    indices, weights = self.rows(seed, step, split, batch_size, length)
    spanish, english = self._verses[split][:2]
    width = length or self.settings.max_length
    source = np.full((batch_size, width + 1), PAD, np.int32)
    inputs = np.full((batch_size, self._target_width(split, length)), PAD, np.int32)
    targets = np.full_like(inputs, PAD)
    for row, index in enumerate(indices):
      x, y = spanish[index], english[index]
      source[row, :len(x) + 1] = np.append(x, EOS)
      inputs[row, :len(y) + 1] = np.append(BOS, y)
      targets[row, :len(y) + 1] = np.append(y, EOS)
    valid = inputs != PAD
    return dict(source=source, source_valid=source != PAD, inputs=inputs, valid=valid, targets=targets,
                weights=valid * weights[:, None].astype(np.float32))

  def text(self, ids) -> str:
    """Task ids -> English text, up to the first EOS."""
    ids = list(ids)
    ids = ids[:ids.index(EOS)] if EOS in ids else ids
    return bible.detokenize([PIECE_UNKNOWN if i == UNKNOWN else i for i in ids if i not in (PAD, BOS)], self.pieces)
