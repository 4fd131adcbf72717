"""Evaluation across lengths. Each length's batch is padded (with masks) to a bucket, the next power
of two, so evaluating many lengths compiles once per bucket, not once per length."""

import time
from typing import Optional

import jax
import numpy as np

from experiments.runs.parallel import sum_over_processes
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


def evaluate(task: Task, experiment, placement, eval_step, params, step: int, replicas, metrics_writers: list,
             started: float, position_cap: Optional[int]) -> list[dict]:
  """Every evaluation length, task.eval_batches batches each, for every replica (each on the batches
  of its own seed); one metrics record per replica and length, written by that replica's writer (None:
  the replica writes nothing, e.g. one that has diverged). Returns each replica's records by length."""
  records = [{} for _ in replicas.seeds]
  batch_size = experiment.train.batch_size
  rows = placement.host_rows(batch_size)
  for length in experiment.task.eval_lengths:
    totals = [None] * replicas.count
    for index in range(experiment.task.eval_batches):
      batches = [task.batch_rows(seed, index, 'eval', batch_size, rows, length=length) for seed in replicas.seeds]
      padded = replicas.join([pad_batch(batch, position_cap, task.fixed_width_keys) for batch in batches])
      all_sums = replicas.split(placement.to_host(eval_step(params, placement.put_batch(padded, batch_size))))
      for i, (sums, batch) in enumerate(zip(all_sums, batches)):
        sums = dict(sums, **sum_over_processes(task.host_metrics(batch)))
        totals[i] = sums if totals[i] is None else jax.tree_util.tree_map(np.add, totals[i], sums)
    for i, writer in enumerate(metrics_writers):
      record = dict(step=step, split='eval', length=length, **task.summarize(totals[i]),
                    wall_time=time.time() - started)
      if writer is not None:
        writer.write(record)
      records[i][length] = record
  return records
