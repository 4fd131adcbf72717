"""The config, converted once into frozen dataclasses and validated, before anything compiles.

Every error is a ConfigError whose message is one line naming the field, the value and what would
be valid.
"""

import dataclasses
import math
import os
import typing
from typing import Optional

import ml_collections
import numpy as np

import transformer
from experiments.tasks import TASKS, needles
from experiments.tasks.base import TaskSettings

PARALLEL_MODES = ('pmap', 'mesh')
OPTIMIZERS = ('adamw', 'adam')
SCHEDULES = ('warmup_rsqrt', 'warmup_cosine', 'constant')
CAUSAL_STACKS = {'decoder_only': (True,), 'encoder_decoder': (False, True), 'encoder_only': (False,)}
MAX_SEED = 2**31 - 1  # seed and seed + 1 (the dropout stream) must both be distinct 32-bit PRNG seeds


class ConfigError(ValueError):
  """A bad configuration: one line, naming the field, the value and what is valid."""


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  steps: int
  batch_size: int
  optimizer: str
  learning_rate: float
  schedule: str
  warmup_steps: int
  beta1: float
  beta2: float
  epsilon: float
  weight_decay: float
  gradient_clip: float
  label_smoothing: float
  log_every: int
  eval_every: int
  checkpoint_every: int
  keep_checkpoints: int
  gradient_accumulation: int = 1  # microbatches per step, their gradients added before the update
  eval_microbatches: int = 1  # microbatches per evaluation batch, their sums added (less memory at long lengths)
  init_from: str = ''  # a run's workdir whose newest parameters start this run (fresh optimizer state)


@dataclasses.dataclass(frozen=True)
class ParallelSettings:
  mode: str     # 'pmap' or 'mesh'
  fsdp: int     # mesh: devices along the 'fsdp' axis, over which parameters and optimizer state are split; -1: all
  tensor: int   # mesh: devices along the 'tensor' axis, over which heads and feed-forward units are split
  rules: tuple  # (logical axis name, mesh axis or '' for none) pairs: where each named parameter axis is split

  def rule(self, logical: str) -> str:
    return dict(self.rules).get(logical, '')


@dataclasses.dataclass(frozen=True)
class Experiment:
  seed: int
  parallel: ParallelSettings
  task: TaskSettings
  model: transformer.ModelConfig
  train: TrainSettings


def _check_type(field: str, value, expected: type):
  if expected is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if expected is tuple and isinstance(value, list):
    value = tuple(value)
  ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
  if not ok:
    raise ConfigError(f'{field}: got {value!r} of type {type(value).__name__}; valid: a value of type '
                      f'{expected.__name__}')
  if expected is float and not math.isfinite(value):
    raise ConfigError(f'{field}: got {value!r}; valid: a finite number')
  return value


def _section(config: ml_collections.ConfigDict, prefix: str, cls, skip=()) -> dict:
  """The fields of dataclass `cls` read from a ConfigDict section, type-checked; unknown fields fail."""
  hints = typing.get_type_hints(cls)
  wanted = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
  present = set(config.keys())
  unknown = sorted(present - set(wanted) - set(skip))
  if unknown:
    raise ConfigError(f'{prefix}{unknown[0]}: unknown field; valid fields of {prefix.rstrip(".") or "config"}: '
                      f'{", ".join(wanted)}')
  values = {}
  for name in wanted:
    if name not in present:
      if cls is transformer.ModelConfig:
        continue  # the library's default applies
      raise ConfigError(f'{prefix}{name}: missing; add it to configs/base.py')
    values[name] = _check_type(prefix + name, config[name], hints[name])
  return values


def _position(config: ml_collections.ConfigDict, field: str = 'model.position') -> transformer.PositionConfig:
  """model.position (or model.local_position, `field`): its kind, resolved to a variant, and that variant's
  settings. Every field is type-checked; one that is some other variant's setting is then left out (it is not
  this run's), one that is no variant's fails."""
  if 'kind' not in config:
    raise ConfigError(f'{field}.kind: missing; valid: ' + ', '.join(transformer.VARIANTS))
  kind = _check_type(f'{field}.kind', config.kind, str)
  _one_of(f'{field}.kind', kind, sorted(transformer.VARIANTS))
  every_setting = transformer.positions.setting_names()
  unknown = sorted(set(config.keys()) - set(every_setting) - {'kind'})
  if unknown:
    raise ConfigError(f'{field}.{unknown[0]}: unknown field; valid fields of {field}: kind, '
                      f'{", ".join(every_setting)}')
  hints = {}
  for variant in transformer.VARIANTS.values():
    hints.update(typing.get_type_hints(variant.settings))
  values = {name: _check_type(f'{field}.{name}', config[name], hints[name])
            for name in sorted(config.keys()) if name != 'kind'}
  smallest, largest = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
  for name, value in values.items():
    if isinstance(value, float) and value != 0 and not smallest <= abs(value) <= largest:
      raise ConfigError(f'{field}.{name}: got {value!r}; valid: a number float32 holds (0, or a magnitude in '
                        f'[{smallest:.3g}, {largest:.3g}]): the model computes in float32')
  return transformer.PositionConfig(kind, **transformer.VARIANTS[kind].own_settings(values))


def _positive(field: str, value, allow_zero: bool = False):
  if not (value > 0 or (value == 0 and allow_zero)):  # written so that NaN fails too
    raise ConfigError(f'{field}: got {value!r}; valid: a {"non-negative" if allow_zero else "positive"} number')


def _one_of(field: str, value, valid):
  if value not in valid:
    raise ConfigError(f'{field}: got {value!r}; valid: {", ".join(valid)}')


def from_config_dict(config: ml_collections.ConfigDict, num_devices: int,
                     vocab_size: Optional[int] = None) -> Experiment:
  """Validate and convert. num_devices is the global device count the batch is split over. vocab_size: the
  model's vocabulary for a run whose task has no data yet (a model imported without a corpus), whose task is then
  not checked against data."""
  top = {'seed', 'parallel', 'task', 'model', 'train'}
  unknown = sorted(set(config.keys()) - top)
  if unknown:
    raise ConfigError(f'{unknown[0]}: unknown field; valid top-level fields: {", ".join(sorted(top))}')
  seed = _check_type('seed', config.seed, int)
  if not 0 <= seed <= MAX_SEED:
    raise ConfigError(f'seed: got {seed}; valid: an integer in [0, {MAX_SEED}] (JAX seeds are 32-bit)')
  parallel = _parallel_settings(config.parallel, num_devices)
  task = _task_settings(config.task)
  train = _train_settings(config.train, num_devices)
  task_object = TASKS[task.name](task)
  problem = task_object.validate() if vocab_size is None else None
  if problem:
    raise ConfigError(problem)
  model = _model_config(config.model, task_object, vocab_size)
  _check_lengths(task, task_object, model)
  _check_packing(task, model)
  return Experiment(seed=seed, parallel=parallel, task=task, model=model, train=train)


def _parallel_settings(section, num_devices: int) -> ParallelSettings:
  """The parallel section: the mode, the mesh's fsdp and tensor sizes (which must divide the devices) and
  the rules from logical parameter axes to mesh axes."""
  if not isinstance(section, ml_collections.ConfigDict):
    raise ConfigError(f'parallel: got {section!r}; valid: a section, set as --config.parallel.mode=pmap|mesh')
  fields = {'mode', 'fsdp', 'tensor', 'rules'}
  unknown = sorted(set(section.keys()) - fields)
  if unknown:
    raise ConfigError(f'parallel.{unknown[0]}: unknown field; valid fields of parallel: mode, fsdp, tensor, rules')
  mode = _check_type('parallel.mode', section.mode, str)
  _one_of('parallel.mode', mode, PARALLEL_MODES)
  fsdp, tensor = _check_type('parallel.fsdp', section.fsdp, int), _check_type('parallel.tensor', section.tensor, int)
  if fsdp != -1:
    _positive('parallel.fsdp', fsdp)
  _positive('parallel.tensor', tensor)
  if mode == 'pmap' and (fsdp, tensor) != (1, 1):
    name, value = ('parallel.fsdp', fsdp) if fsdp != 1 else ('parallel.tensor', tensor)
    raise ConfigError(f'{name}: got {value} with parallel.mode=pmap, which replicates parameters; valid: 1, or '
                      f'parallel.mode=mesh')
  rules = []
  for logical in sorted(section.rules.keys()):
    target = _check_type(f'parallel.rules.{logical}', section.rules[logical], str)
    if target not in ('', 'fsdp', 'tensor'):
      raise ConfigError(f"parallel.rules.{logical}: got {target!r}; valid: 'fsdp', 'tensor', or '' (that axis whole "
                        f"on every device)")
    rules.append((logical, target))
  parallel = ParallelSettings(mode, fsdp, tensor, tuple(rules))
  mesh_shape(parallel, num_devices)
  return parallel


def mesh_shape(parallel: ParallelSettings, num_devices: int) -> dict:
  """{'data': ..., 'fsdp': ..., 'tensor': ...}: the mesh of `num_devices` devices the parallel settings ask
  for (all on 'data' with pmap); ConfigError when fsdp x tensor does not divide the device count."""
  if parallel.mode == 'pmap':
    return {'data': num_devices, 'fsdp': 1, 'tensor': 1}
  tensor = parallel.tensor
  if num_devices % tensor:
    raise ConfigError(f'parallel.tensor: got {tensor} on {num_devices} device(s); valid: a divisor of {num_devices}')
  fsdp = num_devices // tensor if parallel.fsdp == -1 else parallel.fsdp
  if num_devices % (fsdp * tensor):
    raise ConfigError(f'parallel.fsdp: got {parallel.fsdp} with parallel.tensor={tensor} on {num_devices} '
                      f'device(s); valid: a divisor of {num_devices // tensor}, or -1 for all of them')
  return {'data': num_devices // (fsdp * tensor), 'fsdp': fsdp, 'tensor': tensor}


def _task_settings(section) -> TaskSettings:
  """The task section, each field checked."""
  task = TaskSettings(**_section(section, 'task.', TaskSettings))
  _one_of('task.name', task.name, sorted(TASKS))
  _one_of('task.model_kind', task.model_kind, TASKS[task.name].model_kinds)
  for name in ('vocab_size', 'min_length', 'max_length', 'eval_batches', 'horizon', 'patch_length'):
    _positive(f'task.{name}', getattr(task, name))
  if task.min_length > task.max_length:
    raise ConfigError(f'task.min_length: got {task.min_length}; valid: at most task.max_length={task.max_length}')
  for length in task.eval_lengths:
    if not isinstance(length, int) or length <= 0:
      raise ConfigError(f'task.eval_lengths: got {task.eval_lengths!r}; valid: a tuple of positive integers')
  if not task.eval_lengths:
    raise ConfigError('task.eval_lengths: got (); valid: at least one length')
  for name in ('passkey_fraction', 'needle_fraction'):
    fraction = getattr(task, name)
    if not (isinstance(fraction, (int, float)) and 0.0 <= fraction < 1.0):
      raise ConfigError(f'task.{name}: got {fraction!r}; valid: a number in [0, 1)')
  if task.passkey_fraction + task.needle_fraction >= 1.0:
    raise ConfigError(f'task.needle_fraction: got {task.needle_fraction} with task.passkey_fraction='
                      f'{task.passkey_fraction}; valid: the two together below 1 (some rows stay text)')
  if not (isinstance(task.needles, int) and 1 <= task.needles <= len(needles.WORDS)):
    raise ConfigError(f'task.needles: got {task.needles!r}; valid: an integer from 1 to {len(needles.WORDS)}')
  for name in ('passkey_fraction', 'needle_fraction'):
    if getattr(task, name) and task.name not in ('shakespeare', 'corpus'):
      raise ConfigError(f'task.{name}: got {getattr(task, name)} with task.name={task.name!r}; valid: 0, '
                        'or a language-model task (shakespeare, corpus)')
  repeated = sorted({n for n in task.eval_lengths if task.eval_lengths.count(n) > 1})
  if repeated:
    raise ConfigError(f'task.eval_lengths: got {task.eval_lengths!r}, which repeats {repeated}; valid: each '
                      f'length once')
  return task


def _train_settings(section, num_devices: int) -> TrainSettings:
  """The train section, each field checked; the global batch must split over the devices."""
  train = TrainSettings(**_section(section, 'train.', TrainSettings))
  for name in ('steps', 'batch_size', 'gradient_accumulation', 'eval_microbatches', 'learning_rate', 'log_every',
               'eval_every', 'checkpoint_every', 'keep_checkpoints'):
    _positive(f'train.{name}', getattr(train, name))
  for name in ('warmup_steps', 'weight_decay'):
    _positive(f'train.{name}', getattr(train, name), allow_zero=True)
  if not train.gradient_clip >= 0:
    raise ConfigError(f'train.gradient_clip: got {train.gradient_clip!r}; valid: a positive global norm, or 0 '
                      f'for no clipping')
  if not train.epsilon > 0:
    raise ConfigError(f'train.epsilon: got {train.epsilon!r}; valid: a positive number (Adam divides by '
                      f'sqrt(v) + epsilon)')
  for name in ('beta1', 'beta2'):
    if not 0.0 <= getattr(train, name) < 1.0:
      raise ConfigError(f'train.{name}: got {getattr(train, name)!r}; valid: a number in [0, 1)')
  _one_of('train.optimizer', train.optimizer, OPTIMIZERS)
  _one_of('train.schedule', train.schedule, SCHEDULES)
  if not 0.0 <= train.label_smoothing < 1.0:
    raise ConfigError(f'train.label_smoothing: got {train.label_smoothing!r}; valid: a number in [0, 1)')
  if train.batch_size % num_devices:
    raise ConfigError(f'train.batch_size: got {train.batch_size}; valid: a multiple of the device count '
                      f'{num_devices} (the global batch is split evenly over devices)')
  if train.batch_size % (num_devices * train.gradient_accumulation):
    raise ConfigError(f'train.batch_size: got {train.batch_size} with train.gradient_accumulation='
                      f'{train.gradient_accumulation} on {num_devices} device(s); valid: a multiple of '
                      f'{num_devices * train.gradient_accumulation} (every device splits its share into that many '
                      f'equal microbatches)')
  if train.batch_size % (num_devices * train.eval_microbatches):
    raise ConfigError(f'train.eval_microbatches: got {train.eval_microbatches} with train.batch_size='
                      f'{train.batch_size} on {num_devices} device(s); valid: a divisor of {train.batch_size // num_devices} '
                      f'(every device splits its share of an evaluation batch into that many equal microbatches)')
  return train


def _model_config(section, task_object, vocab_size: Optional[int] = None) -> transformer.ModelConfig:
  """The model's config, with the task's vocabulary (or vocab_size) and fields; the library's refusals named
  model.FIELD."""
  try:
    position = _position(section.position)
    local = section.get('local_position')
    local_position = _position(local, 'model.local_position') if local is not None and local.get('kind') else None
    model_fields = _section(section, 'model.', transformer.ModelConfig,
                            skip=('position', 'local_position', 'vocab_size', 'num_outputs', 'input_features',
                                  'aligned_cross_attention'))
    requested = _check_type('model.vocab_size', section.vocab_size, int) if 'vocab_size' in section else 0
    if requested and requested < (vocab_size or task_object.vocab_size):
      raise ConfigError(f'model.vocab_size: got {requested}; valid: 0 (the task\'s {task_object.vocab_size} tokens) '
                        'or at least that many')
    model = transformer.ModelConfig(position=position, vocab_size=requested or vocab_size or task_object.vocab_size,
                                    local_position=local_position, **dict(model_fields, **task_object.model_fields))
  except ConfigError:
    raise
  except ValueError as error:  # the library names the field without the section
    raise ConfigError(f'model.{error}') from None
  return model


def _check_packing(task: TaskSettings, model) -> None:
  """Rows that pack several documents (task.packing='documents') need a Transformer (every variant serves them),
  at the positions the rows give (not randomized ones)."""
  if task.packing != 'documents':
    return
  if model.architecture != 'transformer':
    raise ConfigError(f'task.packing: got \'documents\' with model.architecture={model.architecture!r}; valid: '
                      f'\'stream\' for the recurrent baselines (they carry no document boundaries)')
  if model.randomized_max_length:
    raise ConfigError(f'model.randomized_max_length: got {model.randomized_max_length} with task.packing=\'documents\'; '
                      f'valid: 0 (packed rows give each token its position in its document)')


def _check_lengths(task: TaskSettings, task_object, model) -> None:
  """The variant takes the attention it gets, and the positions of the longest sequence trained or
  evaluated."""
  position = model.position
  for causal in CAUSAL_STACKS[task.model_kind] if model.architecture == 'transformer' else ():
    try:
      position.check_attention(model.num_heads, model.head_dim, causal)
    except ValueError as error:
      raise ConfigError(f'model.{error} (model.position.kind={position.kind}, {task.model_kind})') from None
  longest = max(task_object.sequence_length(n) for n in (task.max_length, *task.eval_lengths))
  try:
    position.settings.check_positions(max(longest, model.randomized_max_length) - 1)
  except ValueError as error:
    raise ConfigError(f'model.{error} (sequences of up to {longest} with task.eval_lengths={task.eval_lengths}'
                      f'{f", randomized_max_length={model.randomized_max_length}" if model.randomized_max_length else ""})'
                      ) from None
  if model.randomized_max_length and model.randomized_max_length < longest:
    raise ConfigError(f'model.randomized_max_length: got {model.randomized_max_length}; valid: 0 (off) or at least '
                      f'{longest}, the longest sequence of task.max_length={task.max_length} and '
                      f'task.eval_lengths={task.eval_lengths} (positions are drawn from [0, randomized_max_length))')
  rows = position_table_length(model)
  if rows is not None and longest > rows:
    raise ConfigError(f'model.position.max_length: got {rows}; valid: at least {longest}, the longest '
                      f'sequence of task.eval_lengths={task.eval_lengths} ({position.kind} positions cannot '
                      f'extrapolate)')


def evaluation_width_cap(experiment: Experiment) -> Optional[int]:
  """The widest a batch (axis 1) may be padded to in evaluation (width_cap)."""
  return width_cap(experiment.model, experiment.task.model_kind)


def width_cap(model: transformer.ModelConfig, model_kind: str) -> Optional[int]:
  """The widest a batch (axis 1) may be padded to, when a learned table or randomized positions limit it:
  the table's rows or randomized_max_length, less the [CLS] token an encoder-only model puts in front of
  the batch."""
  limits = [limit for limit in (position_table_length(model), model.randomized_max_length) if limit]
  if not limits:
    return None
  rows = min(limits)
  return rows - 1 if model_kind == 'encoder_only' and model.pooling == 'cls' else rows


def position_table_length(model: transformer.ModelConfig) -> Optional[int]:
  """The longest sequence the variant can represent (a learned table's rows), or None: any."""
  return model.position.settings.longest_sequence()


def check_workdir(workdir: str) -> None:
  """The workdir must be creatable and writable; checked without creating anything."""
  path = os.path.abspath(workdir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f'workdir: got {workdir!r}, which is a file; valid: a directory path')
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ConfigError(f'workdir: got {workdir!r}; valid: a path under a directory ({existing} is a file)')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ConfigError(f'workdir: got {workdir!r}; valid: a path under a writable directory ({existing} is not)')


def seed_workdirs(workdir: str, first_seed: int, seeds: int) -> list[str]:
  """The workdirs of seeds first_seed .. first_seed + seeds - 1 trained in one program: `workdir` with
  {seed} replaced by each seed (one seed: `workdir` itself, {seed} replaced if it is there)."""
  if seeds < 1:
    raise ConfigError(f'--seeds: got {seeds}; valid: a positive integer')
  if first_seed + seeds - 1 > MAX_SEED:
    raise ConfigError(f'--seeds: got {seeds} from seed {first_seed}, past the largest seed {MAX_SEED}; valid: at '
                      f'most {MAX_SEED - first_seed + 1}')
  if seeds > 1 and '{seed}' not in workdir:
    raise ConfigError(f'--workdir: got {workdir!r}, the same for every seed; valid with --seeds={seeds}: a path '
                      f'with {{seed}} in it, e.g. {workdir.rstrip("/")}-seed{{seed}}')
  return [workdir.replace('{seed}', str(first_seed + offset)) for offset in range(seeds)]


def to_dict(experiment: Experiment) -> dict:
  """The run record: every field, model.position (and model.local_position, or None) flat (its kind and that
  variant's settings), and under
  data.identity what names the task's data beyond its settings (a prepared corpus), when it has such."""
  record = dataclasses.asdict(experiment)
  record['model']['position'] = experiment.model.position.fields()
  local = experiment.model.local_position
  record['model']['local_position'] = None if local is None else local.fields()
  record['parallel']['rules'] = dict(experiment.parallel.rules)
  identity = TASKS[experiment.task.name](experiment.task).data_identity()
  if identity is not None:
    record['data'] = {'identity': identity}
  return record
