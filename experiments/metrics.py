"""Metrics to WORKDIR/metrics.jsonl (the source of truth for comparisons, one JSON object per line)
and to TensorBoard event files written by tensorboardX, without TensorFlow."""

import json
import math
import os
from typing import Optional

from experiments.files import write_text_atomically

WALL_CLOCK_FIELDS = ('wall_time', 'tokens_per_second', 'steps_per_second')


class MetricsWriter:
  """Only the primary process writes. On resume, records after the restored step are dropped, so
  the file is what an uninterrupted run would have written."""

  def __init__(self, workdir: str, primary: bool, resume_step: Optional[int], drop_evaluation_at_resume=False):
    self.primary = primary
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.summary = None
    if not primary:
      return
    self._truncate_after(resume_step or 0, drop_evaluation_at_resume)
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self.summary = SummaryWriter(os.path.join(workdir, 'tensorboard'), flush_secs=30)

  def _truncate_after(self, step: int, drop_evaluation_at_step: bool = False) -> None:
    if not os.path.exists(self.path):
      return
    kept = []
    with open(self.path) as file:
      for line in file:
        try:
          record = json.loads(line)
        except json.JSONDecodeError:
          break  # a line cut by a kill: everything after it is untrusted
        if record['step'] < step or (record['step'] == step and not (
            drop_evaluation_at_step and record['split'] == 'eval')):
          kept.append(line if line.endswith('\n') else line + '\n')
    write_text_atomically(self.path, ''.join(kept))

  def write(self, record: dict) -> None:
    if not self.primary:
      return
    with open(self.path, 'a') as file:
      file.write(json.dumps(record, sort_keys=True) + '\n')
    prefix = record['split'] + (f'/length_{record["length"]}' if 'length' in record else '')
    for name, value in record.items():
      if isinstance(value, (int, float)) and name not in ('step', 'length') and math.isfinite(value):
        self.summary.add_scalar(f'{prefix}/{name}', value, record['step'])

  def close(self) -> None:
    if self.summary is not None:
      self.summary.close()


def read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, 'metrics.jsonl')) as file:
    return [json.loads(line) for line in file]


def without_wall_clock(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS} for r in records]
