"""What the library can only refuse while tracing, found before a run writes anything.

Some refusals depend on the call, not the config alone: the attention core asked for
(model.attention_implementation) needs the backend, the compute dtype, whether attention dropout
reads the weights, what the variant adds, the mask's parts (transformer/attention_core.py). Rather
than restate those rules, `check` traces the run's own initialisation and training step abstractly
(`jax.eval_shape`: shapes only, nothing compiled, allocated or written) and turns any ValueError the
library raises into a ConfigError (`refusing`), so the command refuses in one line with the library's own words.
The trainer does the same with the step it will run, before it writes (trainer.run_seeds).
"""

import contextlib
import functools
import json
import os

import jax
import jax.numpy as jnp

import transformer
from experiments.runs import checkpoints, sharding, steps
from experiments.runs.settings import ConfigError, Experiment
from experiments.tasks import TASKS

SAMPLE_BATCH = 2  # examples in the traced batch: the rules do not depend on the batch size


def check(experiment: Experiment) -> None:
  """ConfigError if tracing this run's initialisation or training step raises a ValueError, or if its state
  would not fit one device. `compare` checks every variant so before it starts any; the trainer traces its own
  step (`trainer.run_seeds`) and so needs no second trace here."""
  task, model, state, _, _ = planned(experiment, jax.device_count())
  with refusing():
    batch = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                   task.batch(experiment.seed, 0, 'train', SAMPLE_BATCH))
    train_step = functools.partial(steps.train_step, model=model, task=task, experiment=experiment)
    jax.eval_shape(train_step, state, batch, jnp.uint32(experiment.seed))


def planned(experiment: Experiment, device_count: int):
  """(task, model, the abstract training state, its PartitionSpecs, bytes per device) of a run over
  device_count devices, from shapes alone; ConfigError if tracing the initialisation raises a ValueError or if
  one device could not hold the state."""
  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(experiment.model, experiment.task.model_kind)
  with refusing():
    state = jax.eval_shape(lambda: steps.create_train_state(experiment, model, task))
  specs, memory = sharding.plan(experiment, model, task, state, device_count)
  check_memory(memory)
  return task, model, state, specs, memory


@contextlib.contextmanager
def refusing():
  """A ValueError the library raises while tracing, as a one-line ConfigError in its own words."""
  try:
    yield
  except ValueError as error:
    message = ' '.join(str(error).split())
    raise ConfigError(message if message.startswith('model.') else f'model: {message}') from None


def check_memory(memory: dict) -> None:
  """ConfigError if one device would hold more than its memory (sharding.plan's bytes per device)."""
  needed = memory['parameters'] + memory['optimizer_state'] + memory['activations']
  available = device_memory()
  if available and needed > available:
    raise ConfigError(
        f'model: one device would hold {needed / 2**30:.1f} GiB (parameters {memory["parameters"] / 2**30:.1f}, '
        f'optimizer state {memory["optimizer_state"] / 2**30:.1f}, activations about '
        f'{memory["activations"] / 2**30:.1f}), more than its {available / 2**30:.1f} GiB; valid: a configuration that '
        f'fits: parameters split over more devices (parallel.fsdp), train.gradient_accumulation, model.remat, a '
        f'smaller model or batch')


def device_memory() -> int:
  """Bytes one device holds: what the accelerator reports, or the host's physical memory on a CPU; 0 if unknown."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if stats.get('bytes_limit'):
    return int(stats['bytes_limit'])
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return 0


def _has_checkpoint(workdir: str) -> bool:
  directory = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))


def check_init_from(experiment: Experiment, workdir: str) -> None:
  """ConfigError unless train.init_from can start this run: empty; or a training run whose newest
  checkpoint is intact, has this run's parameter shapes and, when this run already recorded where it
  started (init_from.json) but has no checkpoint of its own yet, is still the step it recorded. A run
  that has checkpoints of its own resumes from them and reads no source. Reads, writes nothing."""
  source = experiment.train.init_from
  if not source or _has_checkpoint(workdir):
    return
  prefix = f'train.init_from: got {source!r}'
  if not os.path.isdir(os.path.join(source, 'checkpoints')):
    raise ConfigError(f'{prefix}, which has no checkpoints directory; valid: the --workdir of a training run, or '
                      f'empty for a fresh initialisation')
  try:
    source_model, params, step = checkpoints.load_params_with_step(source)
  except Exception as error:  # pylint: disable=broad-except
    reason = ' '.join(str(error).split())[:300] or type(error).__name__
    raise ConfigError(f'{prefix}, which cannot be read: {reason}') from None
  record_path = os.path.join(workdir, checkpoints.INIT_FROM_FILE)
  if os.path.exists(record_path):
    with open(record_path) as file:
      recorded = json.load(file)
    if recorded['workdir'] != os.path.abspath(source) or recorded['step'] != step:
      raise ConfigError(f'{prefix}, now at step {step}, but {workdir} started from step {recorded["step"]} of '
                        f'{recorded["workdir"]} ({record_path}); valid: that source at that step, or a new --workdir')
  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(experiment.model, experiment.task.model_kind)
  wanted = jax.eval_shape(lambda: steps.create_train_state(experiment, model, task)).params
  try:
    checkpoints.check_shapes({'params': params}, {'params': wanted}, step, os.path.join(source, 'checkpoints'))
  except checkpoints.CheckpointMismatch as error:
    vocabulary = source_model.vocab_size
    hint = (f' (its vocabulary is {vocabulary} and this model\'s {experiment.model.vocab_size}: '
            f'--config.model.vocab_size={vocabulary} gives this one as many output rows, the task\'s tokens among '
            'them)' if vocabulary > experiment.model.vocab_size else '')
    raise ConfigError(f'{prefix}, whose parameters do not fit this model ({error.difference}, step {step}); '
                      f'valid: a run of this model\'s shapes{hint}') from None
