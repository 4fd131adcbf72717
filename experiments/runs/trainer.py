"""The training loop: resume, train, log, evaluate, checkpoint; stop cleanly on SIGTERM/SIGINT and
loudly on a non-finite loss."""

import contextlib
import dataclasses
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
from experiments.runs import checkpoints as checkpoints_module
from experiments.runs.checkpoints import Checkpoints
from experiments.runs.evaluation import evaluate
from experiments.shared.files import write_json_atomically
from experiments.runs.parallel import Placement
from experiments.runs.replicas import Replicas
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


class ReplicasOutOfStep(RuntimeError):
  """The runs of one program would resume from different steps."""


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
  return run_seeds(experiment, [workdir], wrap_train_step=wrap_train_step, devices=devices)[0]


def run_seeds(experiment: Experiment, workdirs: list[str], *, wrap_train_step: Callable = lambda f: f,
              devices: Optional[list] = None) -> list[dict]:
  """Trains the runs of seeds experiment.seed + i, in workdirs[i], side by side in one program
  (experiments/runs/replicas.py); each is the run its seed would be alone. Returns each run's last
  evaluation. They resume together, from the newest step every one of them saved (ReplicasOutOfStep
  when they share none). A replica whose loss turns non-finite is reported and stops (its last good
  checkpoint kept) while the others train on; the call then raises NonFiniteLoss naming it, after the others
  have finished or stopped."""
  if len(set(map(os.path.abspath, workdirs))) < len(workdirs):
    raise WorkdirUnusable(f'workdirs: got {workdirs}; valid: one distinct workdir per seed')
  primary = jax.process_index() == 0
  experiments = [dataclasses.replace(experiment, seed=experiment.seed + i) for i in range(len(workdirs))]
  with STOP.deferred() as stop, contextlib.ExitStack() as locks:
    for workdir in workdirs:
      try:
        os.makedirs(workdir, exist_ok=True)
        lock = _WorkdirLock(workdir) if primary else contextlib.nullcontext()
      except OSError as error:
        raise WorkdirUnusable(f'workdir: got {workdir!r}; cannot create or write it: {error.strerror or error}'
                              ) from None
      locks.enter_context(lock)
    return _run_locked(experiments, workdirs, primary, wrap_train_step, devices, stop)


def _run_locked(experiments, workdirs, primary, wrap_train_step, devices, stop) -> list[dict]:
  all_changes = run_record.open_runs(workdirs, [to_dict(e) for e in experiments], primary)
  stop.check()
  experiment = experiments[0]  # everything but the seed is the same in every replica
  replicas = Replicas([e.seed for e in experiments])
  logging.info('devices: %d (%s), parallel=%s, seeds %s in one program', len(devices or jax.devices()),
               jax.default_backend(), experiment.parallel, replicas.seeds)

  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(experiment.model, experiment.task.model_kind)
  placement = Placement(experiment.parallel, devices, batch_axis=replicas.batch_axis)
  all_checkpoints, templates = [], []
  try:
    for run_experiment, workdir in zip(experiments, workdirs):
      checkpoints = Checkpoints(workdir, experiment.train.keep_checkpoints, primary)
      all_checkpoints.append(checkpoints)
      host_state = jax.device_get(steps.create_train_state(run_experiment, model, task))
      if run_experiment.train.init_from and checkpoints.latest_step() is None:
        host_state = host_state.replace(params=jax.device_get(checkpoints_module.initial_params(
            workdir, host_state.params, run_experiment.train.init_from)))
        logging.info('%s: starting from the parameters of %s', workdir, run_experiment.train.init_from)
      templates.append(host_state)
      stop.check()
    restored = _restore_together(all_checkpoints, templates, workdirs, primary)
    start_steps = [step or 0 for step, _, _ in restored]
    start_step = start_steps[0]
    if primary:
      for workdir, changes in zip(workdirs, all_changes):
        run_record.record_changes(workdir, changes, start_step)
        for name, (old, new) in changes.items():
          logging.warning('%s: resuming with %s changed from %r to %r (recorded in %s)', workdir, name, old, new,
                          run_record.CHANGES_FILE)
  except BaseException:
    for checkpoints in all_checkpoints:
      checkpoints.close()
    raise
  summaries = [os.path.join(workdir, SUMMARY_FILE) for workdir in workdirs]
  finished = [start_step >= experiment.train.steps and os.path.exists(path) for path in summaries]
  if all(finished):
    logging.info('the run%s finished earlier (step %d); nothing to do', 's' if len(workdirs) > 1 else '', start_step)
    for checkpoints in all_checkpoints:
      checkpoints.close()
    return [_read_summary(path) for path in summaries]
  if start_step:
    logging.info('resuming from the checkpoint%s at step %d', 's' if len(workdirs) > 1 else '', start_step)
  # A run killed between its final checkpoint and summary.json evaluates again: drop that evaluation.
  final_evaluation_pending = start_step >= experiment.train.steps
  writers = []
  try:
    for workdir, (_, _, covered), done in zip(workdirs, restored, finished):
      if done:  # finished earlier, beside a replica that did not: left as it is
        writers.append(None)
        continue
      if primary:
        metrics_file.restore(workdir, start_step, covered, drop_evaluation_at_step=final_evaluation_pending)
      writers.append(metrics_file.MetricsWriter(workdir, primary))
    host_state = replicas.join([state for _, state, _ in restored])
    evaluations = _train(experiment, workdirs, primary, wrap_train_step, stop, task, model, placement, replicas,
                         all_checkpoints, writers, host_state, start_step, final_evaluation_pending)
  finally:
    for writer in writers:
      if writer is not None:
        writer.close()
    for checkpoints in all_checkpoints:
      checkpoints.close()
  return [_read_summary(path) if done else evaluation
          for path, done, evaluation in zip(summaries, finished, evaluations)]


def _restore_together(all_checkpoints, templates, workdirs, primary) -> list:
  """Each replica's (step, state, covers) from the newest step that every replica saved and can restore: a
  program killed while saving leaves some replicas' newest step on disk and not others', and the newer ones
  are set aside (moved, never deleted) to resume from the step they share. Replicas that share no saved
  step (one trained further alone) are refused: ReplicasOutOfStep."""
  while True:
    restored = [checkpoints.restore_latest(
        template, still_valid=functools.partial(metrics_file.missing_records, workdir) if primary else None)
                for checkpoints, template, workdir in zip(all_checkpoints, templates, workdirs)]
    steps_found = [step or 0 for step, _, _ in restored]
    shared = min(steps_found)
    if len(set(steps_found)) == 1:
      return restored
    if shared == 0 or any(shared not in checkpoints.manager.all_steps() for checkpoints in all_checkpoints):
      raise ReplicasOutOfStep(
          'the runs of one program resume together, from one step, but their checkpoints are at ' +
          ', '.join(f'step {step} in {workdir}' for step, workdir in zip(steps_found, workdirs)) +
          ' with no step saved by all; train them one at a time (--seeds=1), or with experiments.compare, which '
          'groups runs by their step')
    for checkpoints in all_checkpoints:
      checkpoints.set_aside_after(shared, f'newer than step {shared}, the newest step every seed of this program '
                                          f'saved: a save cut short')


def _read_summary(path: str) -> dict:
  with open(path) as file:
    return {int(length): record for length, record in json.load(file)['evaluation'].items()}


def _train(experiment, workdirs, primary, wrap_train_step, stop, task, model, placement, replicas, all_checkpoints,
           writers, host_state, start_step, final_evaluation_pending) -> list[dict]:
  state = placement.put_state(host_state)
  train_step = placement.compile_train_step(wrap_train_step(replicas.train_step(functools.partial(
      steps.train_step, model=model, task=task, experiment=experiment))))
  eval_step = placement.compile_eval_step(replicas.eval_step(functools.partial(steps.eval_step, model=model,
                                                                               task=task)))
  seed_argument = replicas.seed_argument()
  train = experiment.train
  started = time.time()
  active = [writer is not None for writer in writers]  # replicas still training: not finished, not diverged
  diverged = []

  def run_evaluation(params, step):
    return evaluate(task, experiment, placement, eval_step, params, step, replicas,
                    [w if a else None for w, a in zip(writers, active)], started=started,
                    position_cap=evaluation_width_cap(experiment))

  def save(step):
    host_states = replicas.split(placement.host_state(state))
    for i, checkpoints in enumerate(all_checkpoints):
      if active[i]:
        checkpoints.save(step, host_states[i], covers=writers[i].sync())

  last_evaluation = [{} for _ in workdirs]
  step = start_step
  stop.check()  # nothing trained yet in this process: a stop here has nothing to save
  progress = _Progress(start_step, train.steps, task.headline_metric)
  try:
    if final_evaluation_pending:
      last_evaluation = run_evaluation(state.params, step)
    window_start, window_tokens = time.time(), [0.0] * replicas.count
    while step < train.steps and any(active):
      batches = [task.batch(seed, step, 'train', train.batch_size) for seed in replicas.seeds]
      state, step_metrics = train_step(state, placement.put_batch(replicas.join(batches)), seed_argument)
      step += 1
      host_metrics = replicas.split(placement.to_host(step_metrics))
      log_now = step % train.log_every == 0 or step == train.steps
      elapsed = max(time.time() - window_start, 1e-9)
      shown = None
      for i in range(replicas.count):
        if not active[i]:
          continue
        window_tokens[i] += float(np.sum(batches[i]['valid']))
        summary = task.summarize(host_metrics[i])
        if not np.isfinite(summary['loss']):
          active[i] = False
          diverged.append(f'non-finite loss {summary["loss"]} at step {step}; stopping. The last good checkpoint '
                          f'(step {all_checkpoints[i].latest_step()}) is kept in {all_checkpoints[i].directory}')
          if replicas.vectorized:
            diverged[-1] = f'seed {replicas.seeds[i]} ({workdirs[i]}): {diverged[-1]}'
            logging.error('%s; the other seeds train on', diverged[-1])
          continue
        if log_now:
          record = dict(step=step, split='train', **summary,
                        learning_rate=float(host_metrics[i]['learning_rate']),
                        gradient_norm=float(host_metrics[i]['gradient_norm']),
                        tokens_per_second=window_tokens[i] / elapsed, wall_time=time.time() - started)
          writers[i].write(record)
          shown = shown or record
      if log_now:
        window_start, window_tokens = time.time(), [0.0] * replicas.count
      progress.update(step, shown)
      if not any(active):
        break
      if step % train.eval_every == 0 or step == train.steps:
        last_evaluation = run_evaluation(state.params, step)
      if step % train.checkpoint_every == 0 or step == train.steps:
        save(step)
      if stop.requested:
        logging.warning('%s received: saving a checkpoint at step %d and exiting', stop.requested, step)
        save(step)
        break
    if step == train.steps and primary:  # the marker of a finished run, written last
      for i, workdir in enumerate(workdirs):
        if active[i]:
          write_json_atomically(os.path.join(workdir, SUMMARY_FILE), dict(step=step, evaluation={  # by length
              str(length): dict(sorted(last_evaluation[i][length].items()))
              for length in sorted(last_evaluation[i])}), sort_keys=False, allow_nan=True)
  finally:
    progress.close()
  if diverged:
    raise NonFiniteLoss('\n'.join(diverged))
  return last_evaluation
