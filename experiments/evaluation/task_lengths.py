"""A finished run of a task that draws its own held-out examples (copy, reverse, sort, addition, ...: no
text stream) scored at any lengths: the metrics the trainer records (loss, token and sequence accuracy, or
the task's own), summed over evaluation batches of the run's seed, padded to buckets as the trainer pads
them. Batches 0 .. eval_batches - 1 are the trainer's own evaluation batches, so the run as trained gives
its metrics.jsonl numbers at its evaluation lengths; a search reads later batches (first_batch), never
those. What experiments/evaluation/long_context.py runs for such a task.
"""

import functools
import math
from typing import Optional

import jax
import numpy as np

from experiments.runs import evaluation, steps


def reads_stream(task) -> bool:
  """A language model of a held-out text stream (shakespeare, corpus), scored over windows of it instead."""
  return hasattr(task, 'stream') and task.settings.model_kind == 'decoder_only'


def sums_function(model, task):
  """(params, batch) -> the summed metrics of one batch, jitted: the trainer's evaluation step."""
  return jax.jit(functools.partial(steps.eval_step, model=model, task=task))


def evaluate_length(sums, params, task, seed: int, length: int, batch_size: int, batches: int,
                    first_batch: int = 0, width_cap: Optional[int] = None) -> dict:
  """The task's metrics over `batches` evaluation batches of `batch_size` problems of this length (batch
  indices first_batch onwards, drawn from the run's seed), with `headline` naming the one a table shows."""
  totals = None
  for index in range(first_batch, first_batch + batches):
    batch = task.batch(seed, index, 'eval', batch_size, length=length)
    found = jax.device_get(sums(params, evaluation.pad_batch(batch, width_cap, task.fixed_width_keys)))
    found = dict(found, **task.host_metrics(batch))
    totals = found if totals is None else jax.tree_util.tree_map(np.add, totals, found)
  record = task.summarize(totals)
  broken = sorted(name for name, value in record.items() if isinstance(value, float) and not math.isfinite(value))
  if broken:
    raise FloatingPointError(f'length {length}: the model gave non-finite {", ".join(broken)} (batches {first_batch} '
                             f'to {first_batch + batches - 1}); nothing was written for this length')
  return dict(length=length, **record, headline=task.headline_metric, examples=batches * batch_size)
