"""The training loop: resume, train, log, evaluate, checkpoint; stop cleanly on SIGTERM/SIGINT and
loudly on a non-finite loss."""

import contextlib
import functools
import json
import os
import socket
import sys
import time
from typing import Callable, Optional

import jax
import numpy as np
from absl import logging

import transformer
from experiments.runs import metrics as metrics_file
from experiments.runs import run_record, steps
from experiments.runs.checkpoints import Checkpoints
from experiments.runs.evaluation import evaluate
from experiments.shared.files import write_json_atomically
from experiments.runs.parallel import Placement
from experiments.runs.run_record import SUMMARY_FILE
from experiments.runs.settings import Experiment, evaluation_width_cap, to_dict
from experiments.shared.signals import STOP
from experiments.tasks import TASKS


class NonFiniteLoss(RuntimeError):
  pass


class WorkdirBusy(RuntimeError):
  """Another live run holds this workdir."""


class WorkdirUnusable(RuntimeError):
  """The workdir cannot be created or written."""


class _WorkdirLock:
  """An exclusive flock on WORKDIR/.lock, released by the kernel when the holder dies (even kill -9),
  so a second run on the same workdir refuses instead of interleaving checkpoints and metrics."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, '.lock')
    self.file = None

  def __enter__(self):
    import fcntl  # pylint: disable=g-import-not-at-top
    handle = open(self.path, 'a+')
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      holder = handle.read().strip() or 'another process'
      handle.close()
      raise WorkdirBusy(f'workdir {os.path.dirname(self.path)} is in use by a running job ({holder}); wait for '
                        f'it to finish or stop it, or use another --workdir') from None
    handle.truncate(0)
    handle.write(f'pid {os.getpid()} on {socket.gethostname()}')
    handle.flush()
    self.file = handle
    return self

  def __exit__(self, *exc):
    self.file.close()


class _Progress:
  """A tqdm bar on a terminal; plain log lines elsewhere."""

  def __init__(self, start: int, total: int, metric: str):
    self.bar, self.metric = None, metric
    if sys.stderr.isatty():
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm(total=total, initial=start, unit='step', dynamic_ncols=True)

  def update(self, step: int, record: Optional[dict]):
    if self.bar is not None:
      self.bar.update(1)
      if record:
        self.bar.set_postfix(loss=f'{record["loss"]:.4f}', tokens_per_s=f'{record["tokens_per_second"]:.0f}')
    elif record:
      logging.info('step %d loss %.4f %s %.3f tokens/s %.0f', step, record['loss'], self.metric,
                   record[self.metric], record['tokens_per_second'])

  def close(self):
    if self.bar is not None:
      self.bar.close()


def run(experiment: Experiment, workdir: str, *, wrap_train_step: Callable = lambda f: f,
        devices: Optional[list] = None) -> dict:
  """Train (or resume) to experiment.train.steps. Returns the last evaluation's records by length.

  A workdir that holds a run of another configuration is refused (run_record.RunMismatch) before
  anything is written. SIGTERM/SIGINT: a checkpoint at the current step, then return; before the first
  step, experiments.shared.signals.Interrupted. devices: every device by default; tests pass a subset to
  compare device counts in one process.
  """
  primary = jax.process_index() == 0
  with STOP.deferred() as stop:
    try:
      os.makedirs(workdir, exist_ok=True)
      lock = _WorkdirLock(workdir) if primary else contextlib.nullcontext()
    except OSError as error:
      raise WorkdirUnusable(f'workdir: got {workdir!r}; cannot create or write it: {error.strerror or error}') from None
    with lock:
      return _run_locked(experiment, workdir, primary, wrap_train_step, devices, stop)


def _run_locked(experiment, workdir, primary, wrap_train_step, devices, stop) -> dict:
  changes = run_record.open_run(workdir, to_dict(experiment), primary)
  stop.check()
  logging.info('devices: %d (%s), parallel=%s', len(devices or jax.devices()), jax.default_backend(),
               experiment.parallel)

  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(experiment.model, experiment.task.model_kind)
  placement = Placement(experiment.parallel, devices)
  checkpoints = Checkpoints(workdir, experiment.train.keep_checkpoints, primary)
  try:
    host_state = jax.device_get(steps.create_train_state(experiment, model, task))
    stop.check()
    start_step, host_state, covered = checkpoints.restore_latest(
        host_state, still_valid=functools.partial(metrics_file.missing_records, workdir) if primary else None)
    start_step = start_step or 0
    if primary:
      run_record.record_changes(workdir, changes, start_step)
      for name, (old, new) in changes.items():
        logging.warning('resuming with %s changed from %r to %r (recorded in %s)', name, old, new,
                        run_record.CHANGES_FILE)
  except BaseException:
    checkpoints.close()
    raise
  summary_path = os.path.join(workdir, SUMMARY_FILE)
  if start_step >= experiment.train.steps and os.path.exists(summary_path):
    logging.info('the run finished earlier (step %d); nothing to do', start_step)
    checkpoints.close()
    with open(summary_path) as file:
      return {int(length): record for length, record in json.load(file)['evaluation'].items()}
  if start_step:
    logging.info('resuming from the checkpoint at step %d', start_step)
  # A run killed between its final checkpoint and summary.json evaluates again: drop that evaluation.
  final_evaluation_pending = start_step >= experiment.train.steps
  if primary:
    metrics_file.restore(workdir, start_step, covered, drop_evaluation_at_step=final_evaluation_pending)
  metrics = metrics_file.MetricsWriter(workdir, primary)
  try:
    return _train(experiment, workdir, primary, wrap_train_step, stop, task, model, placement, checkpoints,
                  metrics, host_state, start_step, final_evaluation_pending)
  finally:
    metrics.close()
    checkpoints.close()


def _train(experiment, workdir, primary, wrap_train_step, stop, task, model, placement, checkpoints, metrics,
           host_state, start_step, final_evaluation_pending) -> dict:
  state = placement.put_state(host_state)
  train_step = placement.compile_train_step(wrap_train_step(functools.partial(
      steps.train_step, model=model, task=task, experiment=experiment)))
  eval_step = placement.compile_eval_step(functools.partial(steps.eval_step, model=model, task=task))

  train = experiment.train
  started = time.time()
  run_evaluation = functools.partial(evaluate, task, experiment, placement, eval_step, metrics_writer=metrics,
                                     started=started, position_cap=evaluation_width_cap(experiment))

  def save(step):
    checkpoints.save(step, placement.host_state(state), covers=metrics.sync())

  last_evaluation = {}
  step = start_step
  stop.check()  # nothing trained yet in this process: a stop here has nothing to save
  progress = _Progress(start_step, train.steps, task.headline_metric)
  try:
    if final_evaluation_pending:
      last_evaluation = run_evaluation(state.params, step)
    window_start, window_tokens = time.time(), 0.0
    while step < train.steps:
      batch = task.batch(experiment.seed, step, 'train', train.batch_size)
      state, step_metrics = train_step(state, placement.put_batch(batch))
      step += 1
      host_metrics = placement.to_host(step_metrics)
      window_tokens += float(np.sum(batch['valid']))
      summary = task.summarize(host_metrics)
      if not np.isfinite(summary['loss']):
        raise NonFiniteLoss(f'non-finite loss {summary["loss"]} at step {step}; stopping. The last good '
                            f'checkpoint (step {checkpoints.latest_step()}) is kept in '
                            f'{checkpoints.directory}')
      record = None
      if step % train.log_every == 0 or step == train.steps:
        elapsed = max(time.time() - window_start, 1e-9)
        record = dict(step=step, split='train', **summary,
                      learning_rate=float(host_metrics['learning_rate']),
                      gradient_norm=float(host_metrics['gradient_norm']),
                      tokens_per_second=window_tokens / elapsed, wall_time=time.time() - started)
        metrics.write(record)
        window_start, window_tokens = time.time(), 0.0
      progress.update(step, record)
      if step % train.eval_every == 0 or step == train.steps:
        last_evaluation = run_evaluation(state.params, step)
      if step % train.checkpoint_every == 0 or step == train.steps:
        save(step)
      if stop.requested:
        logging.warning('%s received: saving a checkpoint at step %d and exiting', stop.requested, step)
        save(step)
        break
    if step == train.steps and primary:  # the marker of a finished run, written last
      write_json_atomically(os.path.join(workdir, SUMMARY_FILE), dict(step=step, evaluation={  # by length, in order
          str(length): dict(sorted(last_evaluation[length].items())) for length in sorted(last_evaluation)}),
                            sort_keys=False)
  finally:
    progress.close()
  return last_evaluation
