"""Metrics to WORKDIR/metrics.jsonl (the source of truth for comparisons, one JSON object per line)
and to TensorBoard event files written by tensorboardX, without TensorFlow.

Durability: `MetricsWriter.sync()` fsyncs the file and returns what it holds (records and their
SHA-256); the trainer calls it before each checkpoint and stores the answer with the checkpoint, so a
checkpoint is final only once the records it covers are on disk. On a restart the file is cut back
to exactly what the restored checkpoint covers; a torn last line (a kill or a power loss in the
middle of a write) is dropped with a warning.
"""

import hashlib
import json
import math
import os
import sys
from typing import Optional

from absl import logging

from experiments.shared.files import write_text_atomically

METRICS_FILE = 'metrics.jsonl'
WALL_CLOCK_FIELDS = ('wall_time', 'tokens_per_second', 'steps_per_second')


class MetricsDamaged(ValueError):
  """metrics.jsonl has a line that is not JSON before its last line: not a torn write, damage."""


def whole_lines(path: str) -> list[str]:
  """The file's lines that are whole JSON records, each ending in a newline. A torn last line is left
  out with a warning; a broken line anywhere else raises MetricsDamaged."""
  if not os.path.exists(path):
    return []
  with open(path, newline='') as file:
    lines = file.read().split('\n')
  tail = lines.pop()  # the text after the last newline: '' when the file ends with one
  kept = []
  for number, line in enumerate(lines, 1):
    try:
      json.loads(line)
    except json.JSONDecodeError:
      if number == len(lines) and not tail:
        logging.warning('%s: dropped a torn last line (%d): %.60r', path, number, line)
        return kept
      raise MetricsDamaged(f'{path}: line {number} is not a JSON record ({line[:60]!r}); the file is damaged '
                           f'before its end, which no interrupted write explains; move the run aside and '
                           f'run it again') from None
    kept.append(line + '\n')
  if tail:
    logging.warning('%s: dropped a torn last line (%d, no newline): %.60r', path, len(lines) + 1, tail)
  return kept


def coverage(lines: list[str]) -> dict:
  return {'records': len(lines), 'sha256': hashlib.sha256(''.join(lines).encode('utf-8')).hexdigest()}


def missing_records(workdir: str, covered: dict) -> Optional[str]:
  """Why metrics.jsonl no longer holds the records a checkpoint covers; None when it holds them."""
  lines = whole_lines(os.path.join(workdir, METRICS_FILE))
  if len(lines) < covered['records']:
    return f'{METRICS_FILE} holds {len(lines)} whole records, fewer than the {covered["records"]} it covers'
  if coverage(lines[:covered['records']]) != {name: covered[name] for name in ('records', 'sha256')}:
    return f'the first {covered["records"]} records of {METRICS_FILE} are not the ones it covers'
  return None


def restore(workdir: str, step: int, covered: Optional[dict], drop_evaluation_at_step: bool) -> None:
  """Cuts metrics.jsonl back to what an uninterrupted run has written at the end of `step`: the
  records the checkpoint covers (or, for a checkpoint written before coverage was recorded, those
  up to its step), less that step's evaluation when it is to run again."""
  path = os.path.join(workdir, METRICS_FILE)
  lines = whole_lines(path)
  if covered is not None:
    lines = lines[:covered['records']]
  else:
    lines = [l for l in lines if json.loads(l)['step'] <= step]
  if drop_evaluation_at_step:
    lines = [l for l in lines if not (json.loads(l)['step'] == step and json.loads(l)['split'] == 'eval')]
  if os.path.exists(path) or lines:
    write_text_atomically(path, ''.join(lines))


def tensorboard_writer(directory: str):
  """tensorboardX's SummaryWriter for `directory`, imported without PyTorch: its writer module imports torch
  whenever torch is installed (to accept its tensors), a second or more of start-up and some hundreds of MB for
  a run that only writes floats. Where torch is already imported, it is left as it is."""
  blocked = 'torch' not in sys.modules
  if blocked:
    sys.modules['torch'] = None  # `import torch` raises ImportError, which tensorboardX takes as "not installed"
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    if blocked and sys.modules.get('torch', 0) is None:
      del sys.modules['torch']
  return SummaryWriter(directory, flush_secs=30)


class MetricsWriter:
  """Appends records (only the primary process writes), flushed at once and fsynced by sync()."""

  def __init__(self, workdir: str, primary: bool):
    self.primary = primary
    self.path = os.path.join(workdir, METRICS_FILE)
    self.file = self.summary = None
    if primary:
      existing = whole_lines(self.path)  # read once; coverage is then kept up to date as records are written
      self.records, self.digest = len(existing), hashlib.sha256(''.join(existing).encode('utf-8'))
      self.file = open(self.path, 'a')
      self.summary = tensorboard_writer(os.path.join(workdir, 'tensorboard'))

  def write(self, record: dict) -> None:
    if not self.primary:
      return
    line = json.dumps(record, sort_keys=True) + '\n'
    self.file.write(line)
    self.file.flush()
    self.records += 1
    self.digest.update(line.encode('utf-8'))
    prefix = record['split'] + (f'/length_{record["length"]}' if 'length' in record else '')
    for name, value in record.items():
      if isinstance(value, (int, float)) and name not in ('step', 'length') and math.isfinite(value):
        self.summary.add_scalar(f'{prefix}/{name}', value, record['step'])

  def sync(self) -> Optional[dict]:
    """Everything written is on disk when this returns; the coverage of the file (None off primary)."""
    if not self.primary:
      return None
    self.file.flush()
    os.fsync(self.file.fileno())
    return {'records': self.records, 'sha256': self.digest.hexdigest()}

  def close(self) -> None:
    if self.file is not None:
      self.file.close()
    if self.summary is not None:
      self.summary.close()


def read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, METRICS_FILE)) as file:
    return [json.loads(line) for line in file]


def without_wall_clock(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS} for r in records]
