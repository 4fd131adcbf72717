"""Checkpoints with orbax's CheckpointManager under WORKDIR/checkpoints: atomic saves (written to a
temporary directory, renamed when complete), the last K kept, the newest restorable one resumed.

A checkpoint that cannot be restored (a kill during a copy, a damaged disk) is moved, never deleted,
to WORKDIR/checkpoints.unreadable/ with a warning, and the next older one is tried. A checkpoint
whose shapes differ from the config's is an error that leaves the checkpoint untouched.
"""

import json
import os
import shutil
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

import transformer
from experiments.tasks import TASKS
from experiments.tasks.base import TaskSettings


class CheckpointMismatch(ValueError):
  """The checkpoint on disk was written by a config with other shapes."""


class Checkpoints:

  def __init__(self, workdir: str, keep: int):
    self.directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    self.unreadable = self.directory + '.unreadable'
    self.keep = keep
    self.manager = self._open()

  def _open(self):
    options = ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=True, enable_async_checkpointing=False)
    return ocp.CheckpointManager(self.directory, options=options)

  def save(self, step: int, host_state) -> None:
    """host_state: a pytree of numpy arrays (one copy, from Placement.host_state)."""
    if step in self.manager.all_steps():
      return
    self.manager.save(step, args=ocp.args.StandardSave(_as_tree(host_state)), force=True)
    self.manager.wait_until_finished()

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def restore_latest(self, template_state) -> tuple[Optional[int], object]:
    """(step, state) of the newest checkpoint that restores; (None, template) when there is none."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(_as_tree(template_state)))
      except Exception as error:  # pylint: disable=broad-except
        self._set_aside(step, error)
        continue
      _check_shapes(restored, _as_tree(template_state), step, self.directory)
      return step, template_state.replace(**restored)
    return None, template_state

  def _set_aside(self, step: int, error: Exception) -> None:
    os.makedirs(self.unreadable, exist_ok=True)
    destination = os.path.join(self.unreadable, f'{step}-{int(time.time())}')
    shutil.move(os.path.join(self.directory, str(step)), destination)
    self.manager.close()
    self.manager = self._open()
    reason = ' '.join(str(error).split())[:200] or type(error).__name__
    logging.warning('checkpoint at step %d cannot be restored (%s); moved to %s, trying an older one',
                    step, reason, destination)

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _as_tree(state) -> dict:
  return {'step': state.step, 'params': state.params, 'opt_state': state.opt_state}


def _check_shapes(restored, template, step: int, directory: str) -> None:
  found = {jax.tree_util.keystr(path): np.shape(leaf)
           for path, leaf in jax.tree_util.tree_flatten_with_path(restored)[0]}
  wanted = {jax.tree_util.keystr(path): np.shape(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]}
  for name in sorted(set(found) | set(wanted), key=lambda n: (not n.startswith("['params']"), n)):
    if found.get(name) != wanted.get(name):
      raise CheckpointMismatch(
          f'checkpoint at step {step} in {directory} does not match this config: {name} has shape '
          f'{found.get(name, "(absent)")} there and {wanted.get(name, "(absent)")} here; use a new --workdir '
          f'or the config that wrote it (the checkpoint was left untouched)')


def load_run(workdir: str):
  """(model config, task, params) of the newest checkpoint."""
  with open(os.path.join(workdir, 'config.json')) as file:
    resolved = json.load(file)
  model_fields = dict(resolved['model'])
  model_config = transformer.ModelConfig(position=transformer.PositionConfig(**model_fields.pop('position')),
                                         **model_fields)
  task_fields = dict(resolved['task'], eval_lengths=tuple(resolved['task']['eval_lengths']))
  task = TASKS[task_fields['name']](TaskSettings(**task_fields))
  manager = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, 'checkpoints')))
  step = manager.latest_step()
  if step is None:
    raise FileNotFoundError(f'{workdir}/checkpoints: no checkpoint to analyse; train the run first')
  params = manager.restore(step, args=ocp.args.StandardRestore())['params']
  return model_config, task, jax.tree_util.tree_map(jnp.asarray, params)
