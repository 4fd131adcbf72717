"""TrainState, the optimiser and its schedule, and the pure train and eval steps.

Steps return summed metrics; the gradient is that of loss_sum / (global weight_sum), so one device,
eight devices or eight hosts compute the same update (the global mean), up to summation order.
"""

import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from experiments.runs.settings import Experiment, TrainSettings
from experiments.tasks.base import Task


class TrainState(train_state.TrainState):
  """params, opt_state, step, and the (static) apply_fn and tx."""


def learning_rate_schedule(train: TrainSettings) -> optax.Schedule:
  """warmup_rsqrt is the paper's lr = d^-0.5 min(s^-0.5, s warmup^-1.5), rescaled to peak at
  train.learning_rate when s = warmup_steps."""
  peak, warmup = train.learning_rate, max(train.warmup_steps, 1)
  if train.schedule == 'warmup_rsqrt':
    def schedule(step):
      step = jnp.maximum(step.astype(jnp.float32) + 1.0, 1.0)
      return peak * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))
    return schedule
  if train.schedule == 'warmup_cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(train.steps, warmup + 1))
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], [warmup])


@functools.lru_cache(maxsize=64)
def make_optimizer(train: TrainSettings) -> optax.GradientTransformation:
  """One object per settings (optax's transformations are pure functions): the states built for a run then
  share one tree structure, which is part of what JAX keys a traced step by, so the step is traced once."""
  schedule = learning_rate_schedule(train)
  if train.optimizer == 'adamw':
    optimizer = optax.adamw(schedule, train.beta1, train.beta2, train.epsilon, weight_decay=train.weight_decay)
  else:
    optimizer = optax.adam(schedule, train.beta1, train.beta2, train.epsilon)
  if train.gradient_clip > 0:
    optimizer = optax.chain(optax.clip_by_global_norm(train.gradient_clip), optimizer)
  return optimizer


def sample_inputs(experiment: Experiment, task: Task) -> tuple[tuple, dict]:
  """A training-shaped batch of two as the model's (args, kwargs): what initialisation traces."""
  return task.model_inputs(task.batch(experiment.seed, 0, 'train', 2))


@functools.partial(jax.jit, static_argnames='model')
def _initial_params(key, args: tuple, kwargs: dict, model: nn.Module):
  """One function for every initialisation, the model a static argument (modules hash by their fields): the
  trainer's abstract state, each seed's state and a sweep's check of the same model share one trace."""
  return nn.meta.unbox(model.init(key, *args, **kwargs)['params'])


def create_train_state(experiment: Experiment, model: nn.Module, task: Task) -> TrainState:
  """Parameters initialised from the seed on a training-shaped batch (on the host, not sharded)."""
  args, kwargs = sample_inputs(experiment, task)
  params = _initial_params(jax.random.PRNGKey(experiment.seed), args, kwargs, model=model)
  return TrainState.create(apply_fn=model.apply, params=params, tx=make_optimizer(experiment.train))


def _forward_sums(params, batch, *, model, task, label_smoothing, dropout_key, deterministic, positions_key=None):
  args, kwargs = task.model_inputs(batch)
  rngs = {} if deterministic else {'dropout': dropout_key}
  if positions_key is not None:
    rngs['positions'] = positions_key
  logits = model.apply({'params': params}, *args, deterministic=deterministic, rngs=rngs, **kwargs)
  return task.loss_and_metrics(logits, batch, label_smoothing)


def train_step(state: TrainState, batch: dict, seed, *, model, task, experiment: Experiment,
               axis_name: Optional[str] = None) -> tuple[TrainState, dict[str, Any]]:
  """One optimisation step of the run with this seed (an argument, not experiment.seed, so that one
  program can step several seeds' replicas: experiments/runs/replicas.py). Dropout's key is
  fold_in(PRNGKey(seed + 1), step). With axis_name (pmap), sums and gradients are psum-ed over devices.
  Randomized positions (model.randomized_max_length) are drawn from fold_in(fold_in(PRNGKey(seed), 1), step),
  the same on every device (one subset per global batch); evaluation passes no key, so the model draws
  them from PRNGKey(0): every run is evaluated on the same positions."""
  dropout_key = jax.random.fold_in(jax.random.PRNGKey(seed + 1), state.step)
  positions_key = None
  if experiment.model.randomized_max_length:
    positions_key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), 1), state.step)
  if axis_name is not None:
    dropout_key = jax.random.fold_in(dropout_key, jax.lax.axis_index(axis_name))
  reduce = (lambda x: jax.lax.psum(x, axis_name)) if axis_name is not None else (lambda x: x)
  deterministic = experiment.model.dropout_rate == 0.0 and experiment.model.attention_dropout_rate == 0.0
  forward = functools.partial(_forward_sums, model=model, task=task,
                              label_smoothing=experiment.train.label_smoothing, deterministic=deterministic,
                              positions_key=positions_key)

  grads, sums = _summed_gradients(state.params, batch, forward, dropout_key, experiment.train.gradient_accumulation)
  grads, sums = reduce(grads), reduce(sums)
  total_weight = jnp.maximum(sums['weight_sum'], 1.0)
  grads = jax.tree_util.tree_map(lambda g: g / total_weight, grads)
  new_state = state.apply_gradients(grads=grads)
  metrics = dict(sums, gradient_norm=optax.tree.norm(grads),
                 learning_rate=learning_rate_schedule(experiment.train)(state.step))
  return new_state, metrics


def _summed_gradients(params, batch: dict, forward, dropout_key, accumulation: int):
  """(d loss_sum / d params, sums) of one device's batch, added over `accumulation` microbatches
  (summed_over_microbatches). Microbatch i draws dropout from fold_in(dropout_key, i)."""
  def loss_sum(p, microbatch, key):
    sums = forward(p, microbatch, dropout_key=key)
    return sums['loss_sum'], sums

  def gradient(index, microbatch):
    key = dropout_key if accumulation == 1 else jax.random.fold_in(dropout_key, index)
    return jax.grad(loss_sum, has_aux=True)(params, microbatch, key)

  return summed_over_microbatches(gradient, batch, accumulation)


def split_microbatches(batch: dict, count: int) -> dict:
  """batch's leaves, B x ... -> count x (B / count) x ...: microbatch i holds examples i, i + count, i + 2 count,
  ..., so a batch sharded over devices in contiguous blocks keeps every device's share of every microbatch."""
  return jax.tree_util.tree_map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // count, count, *x.shape[1:]), 0, 1),
                                batch)


def summed_over_microbatches(function, batch: dict, count: int):
  """function(index, microbatch) -> a tree of additive values, added over the `count` microbatches of batch
  (split_microbatches) in a lax.scan, so one microbatch's activations are alive at a time: the whole batch's
  values up to float summation order. count 1: function(0, batch)."""
  if count == 1:
    return function(0, batch)
  microbatches = split_microbatches(batch, count)

  def add_one(totals, index_and_microbatch):
    return jax.tree_util.tree_map(jnp.add, totals, function(*index_and_microbatch)), None

  shapes = jax.eval_shape(function, 0, jax.tree_util.tree_map(lambda x: x[0], microbatches))
  zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  totals, _ = jax.lax.scan(add_one, zeros, (jnp.arange(count), microbatches))
  return totals


def eval_step(params, batch: dict, *, model, task, axis_name: Optional[str] = None, microbatches: int = 1) -> dict:
  """The batch's summed metrics, added over `microbatches` microbatches (summed_over_microbatches), so that an
  evaluation at a long length fits where the whole batch at once would not."""
  def sums_of(_, microbatch):
    return _forward_sums(params, microbatch, model=model, task=task, label_smoothing=0.0, dropout_key=None,
                         deterministic=True)

  sums = summed_over_microbatches(sums_of, batch, microbatches)
  return jax.lax.psum(sums, axis_name) if axis_name is not None else sums
