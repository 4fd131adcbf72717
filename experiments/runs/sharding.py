"""Parameters split over a device mesh (parallel.mode=mesh).

The library names what each parameter axis means ('embed', 'heads', 'kv_heads', 'mlp', 'vocab': transformer/layers.py,
declared where the parameter is created). config.parallel.rules says over which mesh axis ('fsdp' or
'tensor') each name is split; an unnamed axis, or one whose rule is '', is whole on every device. With
fsdp = N, every matrix is split along its model-width axis over N devices (ZeRO-3 / FSDP: XLA gathers a
layer's parameters where they are used and reduce-scatters their gradients); with tensor = T, heads and
feed-forward units are split over T devices (Megatron-style). Optimizer state follows its parameters.
"""

import math

import flax.linen as nn
import jax
import optax
from jax.sharding import PartitionSpec

import transformer

from experiments.runs import steps
from experiments.runs.settings import ConfigError, ParallelSettings, mesh_shape

MESH_AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')  # a batch's examples are split over both; 'tensor' devices share theirs
# Flax logical axis rules for the library's activation constraints (transformer.layers.batch_split).
ACTIVATION_RULES = ((transformer.layers.BATCH, BATCH_AXES),)


def logical_names(model, sample_args: tuple, sample_kwargs: dict):
  """The tree of the model's parameters, each leaf a PartitionSpec of logical axis names (None for an
  unnamed axis; an empty spec for a parameter that names none). Traced abstractly: nothing allocated."""
  boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *sample_args, **sample_kwargs)['params'])
  return nn.get_partition_spec(boxed)


def parameter_specs(names, params, parallel: ParallelSettings, mesh: dict):
  """Each parameter's PartitionSpec over mesh axes, by the rules. ConfigError, naming the parameter, when a
  named axis is split over more devices than its size divides into."""
  def spec(path, names_spec, leaf):
    axes, used = [], set()
    for dimension, name in zip(leaf.shape, tuple(names_spec) + (None,) * (len(leaf.shape) - len(names_spec))):
      target = parallel.rule(name) if name else ''
      count = mesh.get(target, 1) if target and target not in used else 1
      if count > 1 and dimension % count:
        raise ConfigError(
            f'parallel.{target}: got {count} devices along {target!r}; parameter {_name(path)} has a {name!r} axis of '
            f'{dimension}, which {count} does not divide; valid: a divisor of {dimension}, or '
            f'--config.parallel.rules.{name}= (that axis whole on every device)')
      axes.append(target if count > 1 else None)
      used.add(target)
    return PartitionSpec(*axes)
  return jax.tree_util.tree_map_with_path(spec, names, params,
                                          is_leaf=lambda x: isinstance(x, PartitionSpec))


def state_specs(state, param_specs):
  """The training state's PartitionSpecs: the step whole, parameters by their specs, and each optimizer
  statistic (Adam's moments) as its parameter; the rest of the optimizer state (counts) whole."""
  opt_specs = optax.tree_map_params(state.tx, lambda _, spec: spec, state.opt_state, param_specs,
                                    transform_non_params=lambda _: PartitionSpec(),
                                    is_leaf=lambda x: isinstance(x, PartitionSpec))
  return state.replace(step=PartitionSpec(), params=param_specs, opt_state=opt_specs)


def bytes_per_device(tree, specs, mesh: dict) -> int:
  """The bytes one device holds of `tree` (arrays or shapes) laid out by `specs`."""
  def share(leaf, spec):
    split = math.prod(mesh[axis] for axis in spec if axis)
    return leaf.size * leaf.dtype.itemsize // split
  return sum(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      share, tree, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))))


def _name(path) -> str:
  return '/'.join(str(getattr(entry, 'key', getattr(entry, 'name', entry))) for entry in path)


def plan(experiment, model, task, state, device_count: int) -> tuple:
  """(the state's PartitionSpecs, None for pmap; and the bytes one device holds: a dict of mesh, parameters,
  optimizer_state and activations, the last an estimate) for `state` (arrays or shapes) on device_count
  devices. ConfigError for a mesh the devices or the parameters cannot take."""
  mesh = mesh_shape(experiment.parallel, device_count)
  specs = None
  if experiment.parallel.mode == 'mesh':
    names = logical_names(model, *steps.sample_inputs(experiment, task))
    specs = state_specs(state, parameter_specs(names, state.params, experiment.parallel, mesh))
  whole = jax.tree_util.tree_map(lambda _: PartitionSpec(), state)
  laid_out = specs or whole
  return specs, dict(mesh=mesh, parameters=bytes_per_device(state.params, laid_out.params, mesh),
                     optimizer_state=bytes_per_device(state.opt_state, laid_out.opt_state, mesh),
                     activations=estimated_activation_bytes(experiment, mesh))


def estimated_activation_bytes(experiment, mesh: dict) -> int:
  """What one device keeps for the backward pass of one microbatch, roughly: per layer the norms' inputs,
  queries, the attention output and the residuals (7 D), keys and values (2 G K), the feed-forward hidden units
  before and after the activation (2 F; 3 F gated), and the attention weights (H L, an upper bound: blockwise and fused cores
  keep less); with model.remat=block, each layer's input (D) and one layer's full set; with matmuls, the
  matmuls' outputs too (4 D + F); plus float32 logits and
  their gradient (2 V). Counted in the compute dtype over b = batch / (data x fsdp x accumulation) examples
  of the training length; the tensor axis divides the heads' and units' shares."""
  model, train = experiment.model, experiment.train
  examples = train.batch_size // (mesh['data'] * mesh['fsdp'] * train.gradient_accumulation)
  length = experiment.task.max_length + 1
  width, hidden, heads, tensor = model.model_dim, model.feed_forward_dim, model.num_heads, mesh['tensor']
  keys_values = 2 * model.key_value_heads * model.head_dim
  units = (3 if model.activation in transformer.layers.GATED_ACTIVATIONS else 2) * hidden
  per_layer = length * (7 * width + keys_values + (units + heads * length) // tensor)
  kind = experiment.task.model_kind
  layers = (model.num_encoder_layers if kind != 'decoder_only' else 0) + (
      model.num_decoder_layers if kind != 'encoder_only' else 0)
  kept_by_remat = {'none': per_layer, 'block': length * width, 'matmuls': length * (5 * width + hidden)}
  kept = layers * kept_by_remat[model.remat] + (per_layer if model.remat != 'none' else 0)
  item = 2 if model.compute_dtype == 'bfloat16' else 4
  return examples * (kept * item + 2 * length * model.vocab_size * 4)
