"""A program's runs around the step loop (one run per seed, each in its workdir): locks, run records,
resuming every run from one step, metrics files, checkpoints with their digests, divergence, and the
summary that marks a finished run. The loop (trainer.py) calls it at named moments: resume, begin,
record_step, save, finish."""

import contextlib
import functools
import json
import os
import time
from typing import Callable, Optional

import jax
import numpy as np
from absl import logging

from experiments.runs import checkpoints as checkpoints_module
from experiments.runs import metrics as metrics_file
from experiments.runs import parallel
from experiments.runs import run_record
from experiments.runs.checkpoints import Checkpoints
from experiments.runs.run_record import SUMMARY_FILE
from experiments.runs.settings import Experiment, to_dict
from experiments.shared import files
from experiments.shared.files import append_line_durably, write_json_atomically

PLACEMENTS_FILE = 'placements.jsonl'  # a line per start of training: its step, devices, CPU cores, mesh, bytes per device


class NonFiniteLoss(RuntimeError):
  pass


class WorkdirBusy(RuntimeError):
  """Another live run holds this workdir."""


class WorkdirUnusable(RuntimeError):
  """The workdir cannot be created or written."""


class ReplicasOutOfStep(RuntimeError):
  """The runs of one program would resume from different steps."""


class _WorkdirLock(files.exclusive_lock):
  """An exclusive flock on WORKDIR/.lock, released by the kernel when the holder dies (even kill -9),
  so a second run on the same workdir refuses instead of interleaving checkpoints and metrics."""

  def __init__(self, workdir: str):
    super().__init__(os.path.join(workdir, '.lock'), f'workdir {workdir}')

  def __enter__(self):
    try:
      return super().__enter__()
    except files.Busy as error:
      raise WorkdirBusy(f'{error}, or use another --workdir') from None


def _read_summary(path: str) -> dict:
  with open(path) as file:
    return {int(length): record for length, record in json.load(file)['evaluation'].items()}


class Runs:
  """The runs of one program, one per experiment (seed) and workdir, as a context manager: entering
  locks every workdir and opens its run record (refusing one that holds another configuration before
  anything is written); leaving closes metrics files and checkpoints.

  After resume(): start_step, states (each run's restored state), all_finished; then the loop's
  begin, record_step, save and finish."""

  def __init__(self, experiments: list[Experiment], workdirs: list[str], stop):
    if len(set(map(os.path.abspath, workdirs))) < len(workdirs):
      raise WorkdirUnusable(f'workdirs: got {workdirs}; valid: one distinct workdir per seed')
    self.experiments, self.workdirs, self.stop = experiments, workdirs, stop
    self.primary = jax.process_index() == 0
    self.checkpoints: list[Checkpoints] = []
    self.writers: list[Optional[metrics_file.MetricsWriter]] = []
    self.active: list[bool] = []  # runs still training: not finished earlier, not diverged
    self.diverged: list[str] = []
    self.summaries = [os.path.join(workdir, SUMMARY_FILE) for workdir in workdirs]
    self._exit = contextlib.ExitStack()

  def __enter__(self):
    with self._exit as stack:
      for workdir in self.workdirs:
        try:
          os.makedirs(workdir, exist_ok=True)
          lock = _WorkdirLock(workdir) if self.primary else contextlib.nullcontext()
        except OSError as error:
          raise WorkdirUnusable(f'workdir: got {workdir!r}; cannot create or write it: {error.strerror or error}'
                                ) from None
        stack.enter_context(lock)
      self.changes = run_record.open_runs(self.workdirs, [to_dict(e) for e in self.experiments], self.primary)
      self.stop.check()
      stack.callback(self._close)
      self._exit = stack.pop_all()
    return self

  def __exit__(self, *exc):
    return self._exit.__exit__(*exc)

  def _close(self):
    for writer in self.writers:
      if writer is not None:
        writer.close()
    for checkpoints in self.checkpoints:
      checkpoints.close()

  def resume(self, initial_state: Callable[[Experiment], object], shardings=None) -> None:
    """Each run's state at the newest step every run saved (initial_state(experiment), or train.init_from's
    parameters, where none saved one), read straight into `shardings` when given (Checkpoints.restore_latest);
    records the configuration's changes; opens the metrics files."""
    templates = []
    for experiment, workdir in zip(self.experiments, self.workdirs):
      checkpoints = Checkpoints(workdir, experiment.train.keep_checkpoints, self.primary)
      self.checkpoints.append(checkpoints)
      host_state = jax.device_get(initial_state(experiment))
      if experiment.train.init_from and checkpoints.latest_step() is None:
        host_state = host_state.replace(params=jax.device_get(checkpoints_module.initial_params(
            workdir, host_state.params, experiment.train.init_from)))
        logging.info('%s: starting from the parameters of %s', workdir, experiment.train.init_from)
      templates.append(host_state)
      self.stop.check()
    restored = self._restore_together(templates, shardings)
    self.start_step = restored[0][0] or 0
    self.states = [state for _, state, _ in restored]
    if self.primary:
      for workdir, changes in zip(self.workdirs, self.changes):
        run_record.record_changes(workdir, changes, self.start_step)
        for name, (old, new) in changes.items():
          logging.warning('%s: resuming with %s changed from %r to %r (recorded in %s)', workdir, name, old, new,
                          run_record.CHANGES_FILE)
    steps = self.experiments[0].train.steps
    self.finished = [self.start_step >= steps and os.path.exists(path) for path in self.summaries]
    self.all_finished = all(self.finished)
    # The checkpoint at an evaluation step is written before that evaluation (so a failed evaluation costs no
    # training), and says so in what it covers: the resume evaluates that step first. So does a run killed
    # between its final checkpoint and summary.json (from before that order, its covered records may hold the
    # final evaluation: dropped, then redone).
    final = self.start_step >= steps
    self.evaluation_pending = bool(self.start_step) and (final or any(
        (covered or {}).get('evaluation_follows', False) for _, _, covered in restored))
    if self.all_finished:
      logging.info('the run%s finished earlier (step %d); nothing to do', 's' if len(self.workdirs) > 1 else '',
                   self.start_step)
      return
    if self.start_step:
      logging.info('resuming from the checkpoint%s at step %d', 's' if len(self.workdirs) > 1 else '',
                   self.start_step)
    for workdir, (_, _, covered), done in zip(self.workdirs, restored, self.finished):
      if done:  # finished earlier, beside a replica that did not: left as it is
        self.writers.append(None)
        continue
      if self.primary:
        metrics_file.restore(workdir, self.start_step, covered, drop_evaluation_at_step=self.evaluation_pending)
      self.writers.append(metrics_file.MetricsWriter(workdir, self.primary))
    self.active = [writer is not None for writer in self.writers]

  def record_placement(self, placement: dict) -> None:
    """Appends where this start of training runs (devices, processes, mesh, bytes per device) to every
    active run's PLACEMENTS_FILE, with the step it starts from: a run resumed on another mesh says so."""
    if not self.primary:
      return
    line = json.dumps(dict(step=self.start_step, **placement), sort_keys=True)
    for workdir, writer in zip(self.workdirs, self.writers):
      if writer is not None:
        append_line_durably(os.path.join(workdir, PLACEMENTS_FILE), line)

  def begin(self) -> None:
    """The loop starts: wall_time and throughput count from here."""
    self._started = self._window_start = time.time()
    self._window_tokens = [0.0] * len(self.workdirs)

  def _restore_together(self, templates, shardings=None) -> list:
    """Each run's (step, state, covers) from the newest step that every run saved and can restore: a
    program killed while saving leaves some runs' newest step on disk and not others', and the newer ones
    are set aside (moved, never deleted) to resume from the step they share. Runs that share no saved
    step (one trained further alone) are refused: ReplicasOutOfStep."""
    while True:
      restored = [checkpoints.restore_latest(
          template, still_valid=functools.partial(metrics_file.missing_records, workdir) if self.primary else None,
          shardings=shardings)
                  for checkpoints, template, workdir in zip(self.checkpoints, templates, self.workdirs)]
      steps_found = [step or 0 for step, _, _ in restored]
      shared = min(steps_found)
      if len(set(steps_found)) == 1:
        return restored
      if shared == 0 or any(shared not in checkpoints.manager.all_steps() for checkpoints in self.checkpoints):
        raise ReplicasOutOfStep(
            'the runs of one program resume together, from one step, but their checkpoints are at ' +
            ', '.join(f'step {step} in {workdir}' for step, workdir in zip(steps_found, self.workdirs)) +
            ' with no step saved by all; train them one at a time (--seeds=1), or with experiments.compare, which '
            'groups runs by their step')
      for checkpoints in self.checkpoints:
        checkpoints.set_aside_after(shared, f'newer than step {shared}, the newest step every seed of this program '
                                            f'saved: a save cut short')

  @property
  def any_active(self) -> bool:
    return any(self.active)

  @property
  def started(self) -> float:
    """When this process began training (wall_time in the metrics counts from here)."""
    return self._started

  def active_writers(self) -> list:
    """Each run's metrics writer, None for a run that writes nothing now (finished earlier, or diverged)."""
    return [writer if active else None for writer, active in zip(self.writers, self.active)]

  def record_step(self, step: int, summaries: list[dict], host_metrics: list[dict], batches: list[dict],
                  log_now: bool) -> Optional[dict]:
    """One training step's summaries (task.summarize) for each run: a non-finite loss stops its run (the last
    good checkpoint kept); on log_now, a metrics record per active run. Returns the first record written."""
    elapsed = max(time.time() - self._window_start, 1e-9)
    shown = None
    for i, batch in enumerate(batches):  # this process's rows of each run's batch
      if self.active[i]:
        self._window_tokens[i] += float(np.sum(batch['valid']))
    if log_now:  # every process logs at the same steps
      window_tokens = parallel.sum_over_processes({'tokens': np.asarray(self._window_tokens)})['tokens']
    for i, summary in enumerate(summaries):
      if not self.active[i]:
        continue
      if not np.isfinite(summary['loss']):
        self._diverge(i, summary['loss'], step)
        continue
      if log_now:
        record = dict(step=step, split='train', **summary, learning_rate=float(host_metrics[i]['learning_rate']),
                      gradient_norm=float(host_metrics[i]['gradient_norm']),
                      tokens_per_second=float(window_tokens[i]) / elapsed, wall_time=time.time() - self._started)
        self.writers[i].write(record)
        shown = shown or record
    if log_now:
      self._window_start, self._window_tokens = time.time(), [0.0] * len(self.workdirs)
    return shown

  def _diverge(self, i: int, loss: float, step: int) -> None:
    self.active[i] = False
    message = (f'non-finite loss {loss} at step {step}; stopping. The last good checkpoint '
               f'(step {self.checkpoints[i].latest_step()}) is kept in {self.checkpoints[i].directory}')
    if len(self.workdirs) > 1:
      message = f'seed {self.experiments[i].seed} ({self.workdirs[i]}): {message}'
      logging.error('%s; the other seeds train on', message)
    self.diverged.append(message)

  def save(self, step: int, states: list, evaluation_follows: bool = False) -> None:
    """A checkpoint of every active run at step, with the metrics lines it covers and whether the evaluation at
    this step comes after it (not among those lines: a resume from it runs that evaluation first)."""
    for i, checkpoints in enumerate(self.checkpoints):
      if self.active[i]:
        covers = self.writers[i].sync()
        if covers is not None and evaluation_follows:
          covers = dict(covers, evaluation_follows=True)
        checkpoints.save(step, states[i], covers=covers)

  def finish(self, step: int, last_evaluation: list[dict]) -> None:
    """At the last step, each active run's summary.json, the marker of a finished run, written last;
    NonFiniteLoss naming every run that diverged."""
    if step == self.experiments[0].train.steps and self.primary:
      for i, workdir in enumerate(self.workdirs):
        if self.active[i]:
          write_json_atomically(os.path.join(workdir, SUMMARY_FILE), dict(step=step, evaluation={  # by length
              str(length): dict(sorted(last_evaluation[i][length].items()))
              for length in sorted(last_evaluation[i])}), sort_keys=False, allow_nan=True)
    if self.diverged:
      raise NonFiniteLoss('\n'.join(self.diverged))

  def results(self, evaluations: Optional[list[dict]] = None) -> list[dict]:
    """Each run's last evaluation: its summary where it finished earlier."""
    evaluations = evaluations or [None] * len(self.workdirs)
    return [_read_summary(path) if done else evaluation
            for path, done, evaluation in zip(self.summaries, self.finished, evaluations)]
