"""Checkpoints with orbax's CheckpointManager under WORKDIR/checkpoints: atomic saves (written to a
temporary directory, renamed when complete), the last K kept, the newest restorable one resumed."""

import os
from typing import Optional

import orbax.checkpoint as ocp
from absl import logging


class Checkpoints:

  def __init__(self, workdir: str, keep: int):
    self.directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def save(self, step: int, host_state) -> None:
    """host_state: a pytree of numpy arrays (one copy, from Placement.host_state)."""
    if step in self.manager.all_steps():
      return
    self.manager.save(step, args=ocp.args.StandardSave(_as_tree(host_state)), force=True)
    self.manager.wait_until_finished()

  def restore_latest(self, template_state) -> tuple[Optional[int], object]:
    """(step, state) of the newest checkpoint that restores; (None, template) when there is none."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(_as_tree(template_state)))
      except Exception as error:  # pylint: disable=broad-except
        if _shape_mismatch(error):
          raise ValueError(f'checkpoint at step {step} in {self.directory} does not match this config '
                           f'(the model shapes differ): {str(error).splitlines()[0]}; use a new --workdir or '
                           f'the config that wrote it. The checkpoint was left untouched.') from None
        logging.warning('checkpoint at step %d in %s cannot be restored (%s); trying an older one',
                        step, self.directory, str(error).splitlines()[0] if str(error) else type(error).__name__)
        continue
      return step, template_state.replace(**restored)
    return None, template_state

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _as_tree(state) -> dict:
  return {'step': state.step, 'params': state.params, 'opt_state': state.opt_state}


def _shape_mismatch(error: Exception) -> bool:
  text = str(error).lower()
  return 'shape' in text and ('mismatch' in text or 'does not match' in text or 'expected' in text)
