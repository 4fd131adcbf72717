"""Checkpoints with orbax's CheckpointManager under WORKDIR/checkpoints: atomic saves (written to a
temporary directory, renamed when complete), the last K kept, the newest restorable one resumed.

Each finished checkpoint gets a digest, WORKDIR/checkpoints.digests/<step>.json: the SHA-256 of every
file orbax wrote, and what the checkpoint covers (the metrics records written up to it, see
experiments/runs/metrics.py). A restore checks the digest first. A checkpoint that cannot be used (its
bytes changed, a kill during a copy, a damaged disk, or metrics that no longer hold what it covers)
is moved, never deleted, to WORKDIR/checkpoints.unreadable/ with a warning, and the next older one
is tried. A checkpoint whose shapes differ from the config's is an error that leaves it untouched.
"""

import json
import os
import shutil
import sys
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

import transformer
from experiments.data.manifest import DataError
from experiments.runs.run_record import INIT_FROM_FILE
from experiments.shared import files as shared_files
from experiments.shared.files import sha256_of_file, write_json_atomically
from experiments.tasks import TASKS
from experiments.tasks.base import TaskSettings


class CheckpointMismatch(ValueError):
  """The checkpoint on disk was written by a config with other shapes. `difference` names the first
  parameter that differs and its shape there and here."""

  def __init__(self, message: str, difference: str = ''):
    super().__init__(message)
    self.difference = difference


def _ignore_closed_event_loop() -> None:
  """When orbax's restore fails part-way, tensorstore reads still in flight complete into the asyncio
  loop orbax has already closed, and each callback's RuntimeError('Event loop is closed') reaches
  sys.unraisablehook, which prints it as a bare traceback: dozens for one damaged checkpoint. They
  carry nothing (the restore's own exception does): this hook drops exactly those, passes on the rest."""
  previous = sys.unraisablehook
  if getattr(previous, 'drops_closed_event_loop', False):
    return

  def hook(unraisable):
    if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == 'Event loop is closed':
      return
    previous(unraisable)

  hook.drops_closed_event_loop = True
  sys.unraisablehook = hook


def file_digests(directory: str) -> dict:
  """{path relative to directory: SHA-256} of every file under it."""
  found = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      found[os.path.relpath(path, directory)] = sha256_of_file(path)
  return found


def read_digest(checkpoints_directory: str, step: int) -> Optional[dict]:
  """The digest of the checkpoint at `step` (None: it has none); an unreadable digest file reads as a
  digest that no file matches."""
  path = os.path.join(checkpoints_directory + '.digests', f'{step}.json')
  if not os.path.exists(path):
    return None
  try:
    with open(path) as file:
      return json.load(file)
  except (OSError, ValueError):
    return {'files': {}, 'unreadable': True}


def changed_files(checkpoints_directory: str, step: int, digest: dict) -> list[str]:
  """The files of the checkpoint whose bytes differ from its digest, or that are missing or new."""
  if digest.get('unreadable'):
    return ['the digest file itself']
  found = file_digests(os.path.join(checkpoints_directory, str(step)))
  return sorted(n for n in set(found) | set(digest['files']) if found.get(n) != digest['files'].get(n))


class Checkpoints:

  def __init__(self, workdir: str, keep: int, primary: bool = True):
    self.directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    self.unreadable = self.directory + '.unreadable'
    self.digests = self.directory + '.digests'
    self.keep, self.primary = keep, primary
    self.manager = self._open()

  def _open(self):
    options = ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=True, enable_async_checkpointing=False)
    return ocp.CheckpointManager(self.directory, options=options)

  def _digest_path(self, step: int) -> str:
    return os.path.join(self.digests, f'{step}.json')

  def save(self, step: int, state, covers: Optional[dict] = None) -> None:
    """state: the placement's checkpoint_state: numpy arrays, or jax.Arrays split over a mesh, of which each
    process writes the shards it holds (with their shardings in the checkpoint's metadata). covers: what the
    checkpoint covers (the metrics' coverage), already on disk; stored in its digest."""
    if step in self.manager.all_steps():
      return
    self.manager.save(step, args=ocp.args.StandardSave(_as_tree(state)), force=True)
    self.manager.wait_until_finished()
    if self.primary:
      os.makedirs(self.digests, exist_ok=True)
      write_json_atomically(self._digest_path(step), dict(
          step=step, files=file_digests(os.path.join(self.directory, str(step))), covers=covers))
      for name in os.listdir(self.digests):  # digests of the checkpoints orbax no longer keeps
        if name.endswith('.json') and name[:-5].isdigit() and int(name[:-5]) not in self.manager.all_steps():
          os.remove(os.path.join(self.digests, name))

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def restore_latest(self, template_state, still_valid: Callable[[dict], Optional[str]] = lambda covers: None,
                     shardings=None) -> tuple[Optional[int], object, Optional[dict]]:
    """(step, state, covers) of the newest checkpoint that restores and is intact; (None, template,
    None) when there is none. still_valid(covers) says why a checkpoint can no longer be resumed
    (None: it can). With `shardings` (a tree of the state's jax.sharding.Sharding), each device reads
    its own part of every array from the checkpoint, whatever mesh wrote it; without, numpy arrays."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      digest = read_digest(self.directory, step)
      if digest is None:
        logging.warning('checkpoint at step %d has no digest (written before digests, or cut before its digest '
                        'was); restoring it unverified', step)
      else:
        changed = changed_files(self.directory, step, digest)
        if changed:
          self._set_aside(step, f'its bytes changed since it was written: {", ".join(changed[:3])}')
          continue
        reason = still_valid(digest['covers']) if still_valid and digest.get('covers') is not None else None
        if reason:
          self._set_aside(step, reason)
          continue
      _ignore_closed_event_loop()
      try:
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(_restore_target(template_state,
                                                                                           shardings)))
      except Exception as error:  # pylint: disable=broad-except
        self._set_aside(step, ' '.join(str(error).split())[:200] or type(error).__name__)
        continue
      check_shapes(restored, _as_tree(template_state), step, self.directory)
      return step, template_state.replace(**restored), (digest or {}).get('covers')
    return None, template_state, None

  def set_aside_after(self, step: int, reason: str) -> None:
    """Moves every checkpoint newer than `step` aside (checkpoints.unreadable/), as an unusable one is."""
    for newer in sorted(s for s in self.manager.all_steps() if s > step):
      self._set_aside(newer, reason)

  def _set_aside(self, step: int, reason: str) -> None:
    destination = os.path.join(self.unreadable, f'{step}-{int(time.time())}')
    if self.primary:
      os.makedirs(self.unreadable, exist_ok=True)
      shutil.move(os.path.join(self.directory, str(step)), destination)
      if os.path.exists(self._digest_path(step)):
        shutil.move(self._digest_path(step), destination + '.digest.json')
    self.manager.close()
    self.manager = self._open()
    logging.warning('checkpoint at step %d cannot be used (%s); moved to %s, trying an older one',
                    step, reason, destination)

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _as_tree(state) -> dict:
  return {'step': state.step, 'params': state.params, 'opt_state': state.opt_state}


def _restore_target(template_state, shardings):
  """What a restore reads into: numpy arrays like the template's, or each leaf's shape and dtype with its
  sharding on this run's mesh."""
  if shardings is None:
    return _as_tree(template_state)
  return jax.tree_util.tree_map(
      lambda leaf, where: jax.ShapeDtypeStruct(np.shape(leaf), jax.dtypes.canonicalize_dtype(np.asarray(leaf).dtype),
                                               sharding=where), _as_tree(template_state), _as_tree(shardings))


def check_shapes(restored, template, step: int, directory: str) -> None:
  found = {jax.tree_util.keystr(path): np.shape(leaf)
           for path, leaf in jax.tree_util.tree_flatten_with_path(restored)[0]}
  wanted = {jax.tree_util.keystr(path): np.shape(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]}
  for name in sorted(set(found) | set(wanted), key=lambda n: (not n.startswith("['params']"), n)):
    if found.get(name) != wanted.get(name):
      difference = f'{name} has shape {found.get(name, "(absent)")} there and {wanted.get(name, "(absent)")} here'
      raise CheckpointMismatch(
          f'checkpoint at step {step} in {directory} does not match this config: {difference}; use a new --workdir '
          f'or the config that wrote it (the checkpoint was left untouched)', difference)


def load_run(workdir: str):
  """(model config, task, params) of the newest checkpoint, under the run's configuration (config.json
  with its recorded changes). A checkpoint whose bytes no longer match its digest is a ValueError."""
  model_config, task, params, _ = load_run_with_step(workdir)
  return model_config, task, params


def load_run_with_step(workdir: str):
  """load_run's (model config, task, params) and the step of the checkpoint they come from."""
  model_config, task = run_model(workdir)
  step = newest_intact_step(workdir)
  return model_config, task, restore_params(workdir, step), step


def load_params_with_step(workdir: str):
  """(model config, params, step) of the run's newest checkpoint, reading no data: what a fine-tune starts from,
  whether or not the run has a corpus of its own."""
  _, model_config = _recorded_model(workdir)
  step = newest_intact_step(workdir)
  return model_config, restore_params(workdir, step), step


def _recorded_model(workdir: str) -> tuple[dict, transformer.ModelConfig]:
  """(the run's configuration, its model config); a ValueError when an imported run's source has changed since."""
  from experiments.runs import run_record  # pylint: disable=g-import-not-at-top
  resolved = run_record.stored_config(workdir)
  if resolved is None:
    raise FileNotFoundError(f'{workdir}/{run_record.CONFIG_FILE}: missing; valid: the --workdir of a training run')
  imported = resolved.get('source')
  if imported:
    folder = imported['path'] if imported['format'] != 'gguf' else os.path.dirname(imported['path'])
    changed = shared_files.changed_files(folder, imported['files'])
    if changed:
      raise ValueError(f'{workdir}: its source {imported["path"]} has changed since it was imported '
                       f'({", ".join(changed[:3])} differ from their recorded SHA-256); valid: the files it was '
                       f'imported from, or a new import of them into a new --workdir')
  model_fields = dict(resolved['model'])
  local = model_fields.pop('local_position', None)
  model_config = transformer.ModelConfig(position=transformer.PositionConfig(**model_fields.pop('position')),
                                         local_position=None if local is None else transformer.PositionConfig(**local),
                                         **model_fields)
  return resolved, model_config


def load_model(workdir: str):
  """(model, variables, tokenizer) of a run, trained here or imported (experiments/import_checkpoint.py): the Flax
  module, {'params': ...} of its newest checkpoint, so that model.apply(variables, tokens_BxL) gives the logits,
  and its Hugging Face tokenizers.Tokenizer (the run's tokenizer.json, else its corpus's; None for a run of
  characters, bytes or symbols). Reads no training data."""
  resolved, config = _recorded_model(workdir)
  params = restore_params(workdir, newest_intact_step(workdir))
  tokenizer = None
  for folder in (workdir, resolved['task'].get('path') or ''):
    path = os.path.join(folder, 'tokenizer.json')
    if folder and os.path.isfile(path):
      from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
      tokenizer = Tokenizer.from_file(path)
      break
  return transformer.build_model(config, resolved['task']['model_kind']), {'params': params}, tokenizer


NO_CORPUS = ''  # task.path of a run imported without a corpus (experiments/import_checkpoint.py)


def run_model(workdir: str, corpus: str = ''):
  """(model config, task) under the run's configuration (config.json with its recorded changes),
  attention implementation and pattern included: what the run trained. corpus: a corpus directory to
  evaluate on instead of the run's own (corpus_choice.py checks it was prepared with the run's tokenizer);
  a run imported without a corpus needs one."""
  from experiments.runs import corpus_choice  # pylint: disable=g-import-not-at-top
  resolved, model_config = _recorded_model(workdir)
  task_fields = dict(resolved['task'], eval_lengths=tuple(resolved['task']['eval_lengths']))
  if corpus:
    task_fields['path'] = corpus_choice.checked_corpus(workdir, resolved, model_config, corpus)
  elif task_fields['name'] == 'corpus' and task_fields['path'] == NO_CORPUS:
    raise ValueError(f'--corpus: missing; {workdir} was imported without a corpus; valid: --corpus=DIR, a corpus '
                     f'prepared with its tokenizer ({corpus_choice.how_to_prepare(os.path.join(workdir, "tokenizer.json"))})')
  task = TASKS[task_fields['name']](TaskSettings(**task_fields))
  recorded = resolved.get('data', {}).get('identity')
  try:
    identity = task.data_identity()
  except DataError as error:
    raise ValueError(f'{workdir}: its task\'s data cannot be read: {error}') from None
  if not corpus and recorded is not None and identity != recorded:
    raise ValueError(f'{workdir}: the run trained on data {recorded[:12]}... and {task_fields.get("path")} now holds '
                     f'{identity[:12]}... (prepared again or changed); valid: the data the run trained on')
  return model_config, task


def core_for(config: transformer.ModelConfig, *, weights: bool = False, decoding: bool = False):
  """(config, note): the run's model with an attention core that serves what a command does with it, and a
  line saying so when that is not the run's own. Weights (analyze's maps) are formed by the explicit core
  only; a cached decoding step is not one the Pallas kernel serves (auto then picks, as in training). Every
  core computes the same attention, up to float rounding."""
  own = config.attention_implementation
  if weights and own not in ('auto', 'explicit'):
    core, why = 'explicit', 'reads the attention weights, which only the explicit core forms'
  elif decoding and own == 'pallas':
    core, why = 'auto', 'decodes step by step through a cache, which the Pallas kernel does not serve'
  else:
    return config, None
  return (config.replace(attention_implementation=core),
          f'this command {why}: model.attention_implementation={core} instead of the run\'s {own} (the same '
          f'attention, up to float rounding)')


def newest_intact_step(workdir: str) -> int:
  """The step of the run's newest checkpoint; a FileNotFoundError when it has none, a ValueError when
  its bytes no longer match its digest."""
  directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
  steps = sorted(int(name) for name in os.listdir(directory) if name.isdigit()) if os.path.isdir(directory) else []
  if not steps:
    raise FileNotFoundError(f'{workdir}/checkpoints: no checkpoint to read; train the run first')
  step = steps[-1]
  digest = read_digest(directory, step)
  if digest is not None:
    changed = changed_files(directory, step, digest)
    if changed:
      raise ValueError(f'{directory}/{step}: its bytes changed since it was written ({", ".join(changed[:3])}); '
                       f'restart the training command on {workdir}, which sets it aside and resumes from an '
                       f'older one')
  return step


def restore_params(workdir: str, step: int):
  """The parameters of the checkpoint at `step`, as jax arrays on this process's first device, whatever mesh
  wrote them (the checkpoint's own metadata gives each array's shape and dtype)."""
  manager = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, 'checkpoints')),
                                  item_handlers=ocp.StandardCheckpointHandler())
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree_util.tree_map(lambda array: jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=device),
                                  manager.item_metadata(step))
  params = manager.restore(step, args=ocp.args.StandardRestore(target))['params']
  manager.close()
  return jax.tree_util.tree_map(jnp.asarray, params)


def initial_params(workdir: str, template_params, init_from: str):
  """The parameters of the run at init_from (its newest checkpoint), shape-checked against this run's;
  the source and its step go to WORKDIR/init_from.json the first time, and a later start refuses a source
  that has moved on since (its newest checkpoint at another step)."""
  from experiments.runs import run_record  # pylint: disable=g-import-not-at-top
  _, params, step = load_params_with_step(init_from)
  check_shapes({'params': params}, {'params': template_params}, step, os.path.join(init_from, 'checkpoints'))
  record_path = os.path.join(workdir, INIT_FROM_FILE)
  source = dict(workdir=os.path.abspath(init_from), step=int(step), finished_step=run_record.finished_step(init_from))
  if os.path.exists(record_path):
    with open(record_path) as file:
      recorded = json.load(file)
    if recorded['workdir'] != source['workdir'] or recorded['step'] != source['step']:
      raise ValueError(f'train.init_from: {init_from} is now at step {step}, but this run started from step '
                       f'{recorded["step"]} of {recorded["workdir"]} ({record_path}); use a new --workdir')
  else:
    write_json_atomically(record_path, source)
  return jax.tree_util.tree_map(lambda p, t: jnp.asarray(p, t.dtype), params, template_params)
