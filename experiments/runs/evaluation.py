"""Evaluation across lengths. Each length's batch is padded (with masks) to a bucket, the next power
of two, so evaluating many lengths compiles once per bucket, not once per length."""

import time
from typing import Optional

import jax
import numpy as np

from experiments.tasks.base import Task

MIN_BUCKET = 8


def bucket_length(length: int, cap: Optional[int] = None) -> int:
  """The next power of two >= length (at least MIN_BUCKET), never beyond cap when length fits it."""
  bucket = max(MIN_BUCKET, 1 << (max(length, 1) - 1).bit_length())
  return min(bucket, cap) if cap is not None and length <= cap else bucket


def pad_batch(batch: dict, cap: Optional[int] = None, fixed_width_keys: tuple = ()) -> dict:
  """Pads every array but fixed_width_keys along its time axis (axis 1) to its bucket with zeros,
  i.e. PAD tokens, weight 0 and valid False, so the padded positions change neither the loss nor
  the real outputs."""
  padded = {}
  for name, array in batch.items():
    if name in fixed_width_keys:
      padded[name] = array
      continue
    target = bucket_length(array.shape[1], cap)
    widths = [(0, 0)] * array.ndim
    widths[1] = (0, target - array.shape[1])
    padded[name] = np.pad(array, widths)
  return padded


def evaluate(task: Task, experiment, placement, eval_step, params, step: int, metrics_writer,
             started: float, position_cap: Optional[int]) -> dict:
  """Every evaluation length, task.eval_batches batches each; one metrics record per length."""
  records = {}
  for length in experiment.task.eval_lengths:
    totals = None
    for index in range(experiment.task.eval_batches):
      batch = task.batch(experiment.seed, index, 'eval', experiment.train.batch_size, length=length)
      sums = dict(placement.to_host(eval_step(params, placement.put_batch(pad_batch(batch, position_cap, task.fixed_width_keys)))))
      sums.update(task.host_metrics(batch))
      totals = sums if totals is None else jax.tree_util.tree_map(np.add, totals, sums)
    record = dict(step=step, split='eval', length=length, **task.summarize(totals), wall_time=time.time() - started)
    metrics_writer.write(record)
    records[length] = record
  return records
