"""The training loop: batch, step, log, checkpoint, evaluate. Everything around it (locks, run records,
resume, checkpoints, divergence, the finished marker) is lifecycle.Runs, which the loop calls at named
moments; a SIGTERM/SIGINT saves a checkpoint and returns, a non-finite loss stops its run loudly."""

import dataclasses
import functools
import os
import sys
from typing import Callable, Optional

import jax
from absl import logging

from experiments.runs import preflight, steps
from experiments.runs.evaluation import evaluate
from experiments.runs.lifecycle import NonFiniteLoss, ReplicasOutOfStep, Runs, WorkdirBusy, WorkdirUnusable
from experiments.runs.parallel import placement_for
from experiments.runs.replicas import Replicas
from experiments.runs.settings import Experiment, evaluation_width_cap
from experiments.shared.signals import STOP

__all__ = ['run', 'run_seeds', 'NonFiniteLoss', 'ReplicasOutOfStep', 'WorkdirBusy', 'WorkdirUnusable']


class _Progress:
  """A tqdm bar on a terminal; plain log lines elsewhere. A context manager: leaving closes the bar."""

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

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    if self.bar is not None:
      self.bar.close()


def run(experiment: Experiment, workdir: str, *, wrap_train_step: Callable = lambda f: f,
        devices: Optional[list] = None) -> dict:
  """Train (or resume) to experiment.train.steps. Returns the last evaluation's records by length.

  A workdir that holds a run of another configuration is refused (run_record.RunMismatch) before
  anything is written, and so is a configuration that tracing or memory refuses (settings.ConfigError).
  SIGTERM/SIGINT: a checkpoint at the current step, then return; before the first step,
  experiments.shared.signals.Interrupted. devices: every device by default; tests pass a subset to
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
  experiments = [dataclasses.replace(experiment, seed=experiment.seed + i) for i in range(len(workdirs))]
  replicas = Replicas([e.seed for e in experiments])
  task, model, shapes, specs, memory = preflight.planned(experiment, len(devices or jax.devices()))
  placement = placement_for(experiment.parallel, devices, batch_axis=replicas.batch_axis, state_specs=specs)
  train_step = _traced_train_step(experiment, task, model, placement, replicas, shapes, wrap_train_step)
  with STOP.deferred() as stop, Runs(experiments, workdirs, stop) as runs:
    logging.info('devices: %d (%s), parallel=%s, seeds %s in one program', len(devices or jax.devices()),
                 jax.default_backend(), experiment.parallel, replicas.seeds)
    runs.resume(lambda run_experiment: steps.create_train_state(run_experiment, model, task),
                shardings=placement.checkpoint_shardings(shapes))
    if runs.all_finished:
      return runs.results()
    log_memory(memory, replicas.count)
    runs.record_placement(dict(memory, devices=len(devices or jax.devices()), processes=jax.process_count(),
                               backend=jax.default_backend(), mode=experiment.parallel.mode,
                               cpu_cores=len(os.sched_getaffinity(0))))
    return runs.results(_train(experiment, runs, task, model, placement, replicas, train_step, stop))


def _traced_train_step(experiment, task, model, placement, replicas, shapes, wrap_train_step) -> Callable:
  """The compiled training step, traced on the loop's argument types before anything is written: a
  refusal the library raises while tracing (an attention core this run cannot use) is a ConfigError
  here, and the loop's first call reuses this trace instead of tracing again."""
  state = placement.abstract_state(replicas.join_shapes(shapes))  # first: it fixes the mesh's state shardings
  train_step = placement.compile_train_step(wrap_train_step(replicas.train_step(functools.partial(
      steps.train_step, model=model, task=task, experiment=experiment))))
  batch_size = experiment.train.batch_size
  batches = [task.batch_rows(seed, 0, 'train', batch_size, placement.host_rows(batch_size)) for seed in replicas.seeds]
  with preflight.refusing():
    placement.trace_train_step(train_step, state, placement.put_batch(replicas.join(batches), batch_size),
                               replicas.seed_argument())
  return train_step


def log_memory(memory: dict, replicas: int = 1) -> None:
  """One line: the mesh and the bytes per device of parameters, optimizer state and (estimated) activations."""
  mesh = ' x '.join(f'{axis} {size}' for axis, size in memory['mesh'].items())
  logging.info('mesh %s; per device%s: parameters %.1f MiB, optimizer state %.1f MiB, activations about %.1f MiB '
               '(estimated)', mesh, f', {replicas} seeds' if replicas > 1 else '',
               *(replicas * memory[name] / 2**20 for name in ('parameters', 'optimizer_state', 'activations')))


def _train(experiment, runs: Runs, task, model, placement, replicas, train_step, stop) -> list[dict]:
  """The step loop, from runs.start_step to train.steps; each run's last evaluation."""
  state = placement.put_state(replicas.join(runs.states))
  eval_step = placement.compile_eval_step(replicas.eval_step(functools.partial(
      steps.eval_step, model=model, task=task, microbatches=experiment.train.eval_microbatches)))
  train, step = experiment.train, runs.start_step
  runs.begin()

  def evaluate_now(step):
    return evaluate(task, experiment, placement, eval_step, state.params, step, replicas, runs.active_writers(),
                    started=runs.started, position_cap=evaluation_width_cap(experiment))

  def due(every):
    return step % every == 0 or step == train.steps

  last_evaluation = evaluate_now(step) if runs.evaluation_pending else [{} for _ in replicas.seeds]
  stop.check()  # nothing trained yet in this process: a stop here has nothing to save
  rows = placement.host_rows(train.batch_size)
  with _Progress(step, train.steps, task.headline_metric) as progress:
    while step < train.steps and runs.any_active:
      batches = [task.batch_rows(seed, step, 'train', train.batch_size, rows) for seed in replicas.seeds]
      state, step_metrics = train_step(state, placement.put_batch(replicas.join(batches), train.batch_size),
                                       replicas.seed_argument())
      step += 1
      host_metrics = replicas.split(placement.to_host(step_metrics))
      progress.update(step, runs.record_step(step, [task.summarize(m) for m in host_metrics], host_metrics, batches,
                                             log_now=due(train.log_every)))
      if not runs.any_active:
        break
      # The checkpoint first: an evaluation that fails (out of memory at a long length) loses no training.
      if stop.requested or due(train.checkpoint_every):
        runs.save(step, replicas.split(placement.checkpoint_state(state)), evaluation_follows=due(train.eval_every))
      if stop.requested:  # before the save or while it ran: either way this step's checkpoint is on disk
        logging.warning('%s received: saved a checkpoint at step %d; exiting', stop.requested, step)
        break
      if due(train.eval_every):
        last_evaluation = evaluate_now(step)
  runs.finish(step, last_evaluation)
  return last_evaluation
