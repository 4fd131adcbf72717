"""A run is its configuration.

WORKDIR/config.json is the resolved configuration, written once (atomically, fsynced) when the run
is created and never rewritten. A restart compares the configuration it was given with the run's,
field by field, before it writes anything, and refuses any difference except the few in
`RESUMABLE_FIELDS`, which change how a run continues but not what it has computed so far. An
accepted change is appended to WORKDIR/config_changes.jsonl with the step it took effect at; the
run's configuration is config.json with those changes applied in order (`stored_config`).

A finished run (summary.json) takes no change but a longer `train.steps`, which continues it.
"""

import dataclasses
import json
import os
from typing import Optional

from experiments.shared.files import append_line_durably, write_json_atomically
from transformer.positions.base import Settings
from transformer.positions.extension import ExtensionSettings

CONFIG_FILE = 'config.json'
CHANGES_FILE = 'config_changes.jsonl'
SUMMARY_FILE = 'summary.json'
INIT_FROM_FILE = 'init_from.json'  # a fine-tune's source and the step it started from (checkpoints.initial_params)

# Fields added after records were written, with the value every run had before the field existed: a
# record without one ran with that value, so it is read as having it.
ADDED_FIELDS = {'parallel.fsdp': 1, 'parallel.tensor': 1, 'parallel.rules.embed': 'fsdp',
                'parallel.rules.heads': 'tensor', 'parallel.rules.mlp': 'tensor', 'parallel.rules.vocab': '',
                'train.gradient_accumulation': 1, 'train.eval_microbatches': 1, 'task.path': '', 'task.packing': 'stream',
                'task.passkey_fraction': 0.0, 'task.needle_fraction': 0.0, 'task.needles': 4,
                'model.randomized_max_length': 0, 'train.init_from': '', 'model.attention_implementation': 'auto',
                'model.position.interpolation_factor': 1.0, 'model.position.temperature_scale': 0.0,
                'model.position.temperature_floor': 8192, 'model.norm_type': 'layernorm', 'model.layer_norm_eps': 1e-6,
                'model.use_bias': True, 'model.qkv_bias': False, 'model.attention_output_bias': False,
                'model.feed_forward_bias': False, 'model.layer_types': 'full', 'model.sliding_window': 0,
                'model.attention_chunk_size': 0, 'model.qk_norm': 'none', 'model.final_logit_softcap': 0.0,
                'model.parallel_residual': False, 'model.attention_softcap': 0.0, 'model.attention_sinks': False,
                'model.query_scale': 0.0, 'model.sandwich_norm': False, 'model.local_position': None,
                'model.head_width': 0, 'model.logit_scale': 1.0,
                'model.num_kv_heads': 0, 'parallel.rules.kv_heads': 'tensor',
                **{f'model.position.{field.name}': field.default for field in dataclasses.fields(Settings)},
                **{f'model.position.{field.name}': field.default for field in dataclasses.fields(ExtensionSettings)}}

# Fields a restart may change, and why each leaves what the run has computed so far valid.
RESUMABLE_FIELDS = {
    'train.steps': 'a longer run continues the same trajectory (only larger values; not with warmup_cosine, '
                   'whose learning rate at every step depends on it)',
    'train.gradient_accumulation': 'how many microbatches one step\'s gradient is added up from (the same update, '
                                   'up to float summation order)',
    'train.eval_microbatches': 'how many microbatches an evaluation batch\'s sums are added up from (the same sums, up '
                               'to float summation order)',
    'model.remat': 'what a layer keeps for its backward pass and what it recomputes (the same gradients)',
    'train.log_every': 'how often training metrics are written',
    'train.eval_every': 'how often the evaluation runs',
    'train.checkpoint_every': 'how often checkpoints are written',
    'train.keep_checkpoints': 'how many checkpoints are kept',
    **{f'parallel.{name}': 'how the same global batch and state are placed on devices (every placement gives the '
                           'same numbers, up to float summation order)'
       for name in ('mode', 'fsdp', 'tensor', 'rules.embed', 'rules.heads', 'rules.mlp', 'rules.vocab')},
    'task.eval_lengths': 'which lengths later evaluations measure',
    'task.eval_batches': 'how many batches later evaluations average',
}


class RunMismatch(ValueError):
  """The workdir holds a run of another configuration. `lines` says each differing field."""

  def __init__(self, lines: list[str]):
    super().__init__('\n'.join(lines))
    self.lines = lines


# Fields that moved, by their old name: a record that has one is read with its value at the new name.
RENAMED_FIELDS = {'parallel': 'parallel.mode'}


def canonical(resolved: dict) -> dict:
  """The configuration as it reads back from JSON (tuples become lists), so equal means equal on disk; a
  record from before a field moved (RENAMED_FIELDS) reads with the field at its new place."""
  resolved = json.loads(json.dumps(resolved, sort_keys=True))
  for old, new in RENAMED_FIELDS.items():
    *parents, leaf = old.split('.')
    section = resolved
    for parent in parents:
      section = section.get(parent, {})
    if leaf in section and not isinstance(section[leaf], dict):  # the old leaf, not a section of that name
      _set(resolved, new, section.pop(leaf))
  model = resolved.get('model')
  if isinstance(model, dict) and isinstance(model.get('remat'), bool):  # before remat named its policy
    model['remat'] = 'block' if model['remat'] else 'none'
  return resolved


def flatten(tree: dict, prefix: str = '') -> dict:
  """{'train': {'steps': 5}} -> {'train.steps': 5}."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat


def differences(stored: dict, requested: dict) -> dict:
  """{field: (stored value, requested value)} for every field that differs; absent fields are None, but
  a field of ADDED_FIELDS absent from a configuration reads as the value runs had before it existed."""
  old, new = flatten(canonical(stored)), flatten(canonical(requested))
  for flat in (old, new):
    for name, value in ADDED_FIELDS.items():
      flat.setdefault(name, value)
  return {name: (old.get(name), new.get(name)) for name in sorted(set(old) | set(new))
          if old.get(name) != new.get(name) or (name in old) != (name in new)}


def _set(tree: dict, dotted: str, value) -> None:
  *parents, leaf = RENAMED_FIELDS.get(dotted, dotted).split('.')
  for parent in parents:
    tree = tree.setdefault(parent, {})
  tree[leaf] = value


def stored_config(workdir: str) -> Optional[dict]:
  """The run's configuration: config.json with every recorded change applied; None if there is no run."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as file:
    config = canonical(json.load(file))
  changes_path = os.path.join(workdir, CHANGES_FILE)
  if os.path.exists(changes_path):
    with open(changes_path) as file:
      for line in file:
        if line.strip():
          for name, (_, new) in json.loads(line)['changes'].items():
            _set(config, name, new)
  return _own_position_settings(config)


def _own_position_settings(config: dict) -> dict:
  """Records written before each variant had its own settings list every variant's fields under
  model.position; a run's configuration is its kind and that variant's settings only."""
  position = config.get('model', {}).get('position')
  if not isinstance(position, dict) or 'kind' not in position:
    return config
  import transformer  # pylint: disable=g-import-not-at-top
  variant = transformer.VARIANTS.get(position['kind'])
  if variant is not None:
    config['model']['position'] = {'kind': position['kind'], **variant.own_settings(position)}
  return config


def finished_step(workdir: str) -> Optional[int]:
  """The step summary.json records, when the run finished; None otherwise."""
  path = os.path.join(workdir, SUMMARY_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as file:
    return json.load(file)['step']


def refusals(workdir: str, stored: dict, requested: dict) -> list[str]:
  """One line per field that the requested configuration may not change in this run; [] if none."""
  changed = differences(stored, requested)
  done = finished_step(workdir)
  lines = []
  for name, (old, new) in changed.items():
    why = None
    if name not in RESUMABLE_FIELDS:
      why = 'this field may not change in a run'
    elif name == 'train.steps' and not (isinstance(old, int) and isinstance(new, int) and new > old):
      why = 'a run is continued to more steps, never shortened'
    elif name == 'train.steps' and flatten(canonical(requested)).get('train.schedule') == 'warmup_cosine':
      why = "warmup_cosine's learning rate at every step depends on train.steps"
    elif done is not None and 'train.steps' not in changed:
      why = f'the run finished at step {done}; only a longer train.steps continues it'
    if why:
      lines.append(f'{name}: the run in {workdir} has {old!r}, this command asks for {new!r} ({why}); use a new '
                   f'--workdir, or the run\'s own configuration ({CONFIG_FILE} there)')
  return lines


def open_runs(workdirs: list[str], requested: list[dict], primary: bool = True) -> list[dict]:
  """Before anything else is written to the workdirs: create each run (config.json, once) or check that
  its requested configuration may continue it. Returns each run's accepted changes {field: (old, new)},
  which `record_changes` appends once the run knows the step it resumes from.
  Raises RunMismatch, with the lines of every run, before writing anything to any of them, when a
  configuration differs from its run's in a field it may not."""
  lines, changes = [], []
  for workdir, wanted in zip(workdirs, requested):
    stored = stored_config(workdir)
    if stored is None:
      leftovers = [name for name in ('checkpoints', 'metrics.jsonl', SUMMARY_FILE)
                   if os.path.exists(os.path.join(workdir, name))]
      if leftovers:
        lines.append(f'workdir: {workdir} holds {", ".join(leftovers)} but no {CONFIG_FILE}, so what wrote '
                     f'them cannot be checked; use a new --workdir')
      changes.append(None)
    else:
      lines += refusals(workdir, stored, wanted)
      changes.append(differences(stored, wanted))
  if lines:
    raise RunMismatch(lines)
  for workdir, wanted, changed in zip(workdirs, requested, changes):
    if changed is None and primary:
      write_json_atomically(os.path.join(workdir, CONFIG_FILE), canonical(wanted))
  return [changed or {} for changed in changes]


def open_run(workdir: str, requested: dict, primary: bool = True) -> dict:
  """open_runs for one run."""
  return open_runs([workdir], [requested], primary)[0]


def record_changes(workdir: str, changes: dict, step: int) -> None:
  """Appends the accepted changes (fsynced), and un-finishes a run that a longer train.steps continues."""
  if not changes:
    return
  append_line_durably(os.path.join(workdir, CHANGES_FILE), json.dumps(
      {'step': step, 'changes': {name: list(values) for name, values in changes.items()}}, sort_keys=True))
  if 'train.steps' in changes and os.path.exists(os.path.join(workdir, SUMMARY_FILE)):
    os.remove(os.path.join(workdir, SUMMARY_FILE))


def is_finished(workdir: str, requested: Optional[dict] = None) -> bool:
  """summary.json is there and records the run's own train.steps (and, given `requested`, the run's
  configuration is exactly that)."""
  stored = stored_config(workdir)
  done = finished_step(workdir)
  if stored is None or done is None or done != stored['train']['steps']:
    return False
  return requested is None or not differences(stored, requested)
