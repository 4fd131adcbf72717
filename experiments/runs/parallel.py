"""All device placement lives here: the training loop never asks which path runs.

pmap (default): parameters replicated on every local device, each device takes an equal slice of
the batch, sums and gradients are psum-ed (the gradient of the global mean).
mesh: one jit-compiled program over a data x fsdp x tensor device mesh (experiments/runs/sharding.py): the
batch split over data and fsdp, parameters and optimizer state split by the config's rules (whole on every
device with fsdp = tensor = 1); XLA inserts the collectives.
Both work across hosts after jax.distributed.initialize: every host builds the same global batch
from (seed, step, split) and places its own part.
"""

import functools
import os
from typing import Callable, Optional

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.runs import sharding
from experiments.runs.settings import ParallelSettings, mesh_shape

AXIS = 'batch'


def initialize_distributed(coordinator_address: Optional[str], num_processes: Optional[int],
                           process_id: Optional[int]) -> None:
  """jax.distributed.initialize for multi-host runs, from flags or JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID; or, inside a SLURM job of several tasks (srun, SLURM_NTASKS > 1)
  with none of those given, with no arguments, so that JAX reads the coordinator, the process count
  and this process's index from SLURM's variables itself. Does nothing for a single process."""
  address = coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS')
  count = num_processes or int(os.environ.get('JAX_NUM_PROCESSES', '0') or 0)
  index = process_id if process_id is not None else os.environ.get('JAX_PROCESS_ID')
  slurm_tasks = int(os.environ.get('SLURM_NTASKS', '0') or 0) if 'SLURM_JOB_ID' in os.environ else 0
  if not address and count <= 1 and slurm_tasks <= 1:
    return
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')  # CPU collectives across processes
  if not address and count <= 1:
    jax.distributed.initialize()  # JAX's SLURM cluster detection
  else:
    jax.distributed.initialize(coordinator_address=address, num_processes=count or None,
                               process_id=None if index is None else int(index))
  logging.info('process %d of %d, %d local of %d devices', jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


class _Placement:
  """Moves states and batches to devices and compiles the steps, for one parallel mode (a subclass each)."""

  def __init__(self, parallel: ParallelSettings, devices: Optional[list] = None, batch_axis: int = 0,
               state_specs=None):
    """devices: all devices of all hosts by default; a subset (single host only) for comparisons.
    batch_axis: the axis of a global batch that holds its examples (1 when a replica axis comes first,
    experiments/runs/replicas.py); the state's leaves carry that replica axis too, and stay whole.
    state_specs: the training state's PartitionSpecs over the mesh axes (sharding.state_specs); None: whole."""
    self.batch_axis = batch_axis
    self.devices = list(devices) if devices is not None else jax.devices()
    self.num_devices = len(self.devices)
    self.local_devices = [d for d in self.devices if d.process_index == jax.process_index()]
    self.mesh_shape = mesh_shape(parallel, self.num_devices)
    self.state_specs = state_specs

  def host_rows(self, batch_size: int) -> slice:
    """The examples of a global batch of batch_size that this process's devices take: the rows it reads
    (Task.batch_rows) and hands to put_batch. All of them with one process."""
    raise NotImplementedError

  def put_batch(self, host_batch: dict, batch_size: int) -> dict:
    """This process's rows (host_rows(batch_size), along batch_axis) of a global batch of batch_size examples
    (numpy), placed for the step."""
    raise NotImplementedError

  def put_state(self, host_state):
    """A training state (numpy, one copy) placed for the step."""
    raise NotImplementedError

  def abstract_state(self, shapes):
    """What put_state gives for a state of these shapes: jax.ShapeDtypeStruct leaves with their shardings. Like
    put_state, it fixes the state shardings the steps compiled after it take."""
    raise NotImplementedError

  def trace_train_step(self, train_step: Callable, state, batch: dict, seed) -> None:
    """Traces compile_train_step's result on what the loop passes it (an abstract_state, a put_batch, the seed),
    compiling nothing: a refusal the library raises while tracing is raised here, and the loop's first call
    reuses the trace (JAX caches it by function and argument types)."""
    raise NotImplementedError

  def host_state(self, state):
    """One copy on the host (numpy)."""
    raise NotImplementedError

  def checkpoint_state(self, state):
    """What a checkpoint writes of a placed state: one copy on the host (numpy) unless a subclass can do better."""
    return self.host_state(state)

  def checkpoint_shardings(self, abstract_state):
    """Where a restored checkpoint's arrays go, a sharding per leaf of one run's state (None: numpy, then
    put_state)."""
    del abstract_state
    return None

  def to_host(self, metrics: dict) -> dict:
    """Metrics are identical on every device (already reduced): read one copy."""
    return self.host_state(metrics)

  def compile_train_step(self, step_fn: Callable) -> Callable:
    """step_fn(state, batch, seed, axis_name=...) -> (state, metrics); the state is donated, the seed
    (experiments/runs/replicas.py) is the same on every device."""
    raise NotImplementedError

  def compile_eval_step(self, eval_fn: Callable) -> Callable:
    """eval_fn(params, batch, axis_name=...) -> summed metrics."""
    raise NotImplementedError


class PmapPlacement(_Placement):
  """pmap: the state replicated on every local device, a leading device axis on batches and states."""

  def host_rows(self, batch_size: int) -> slice:
    per_host = batch_size // jax.process_count()
    return slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)

  def put_batch(self, host_batch: dict, batch_size: int) -> dict:
    axis, local_count, rows = self.batch_axis, len(self.local_devices), self.host_rows(batch_size)
    per_host = rows.stop - rows.start

    def on_devices(v):  # one slice of this host's examples per local device, the device axis first
      assert v.shape[axis] == per_host, (v.shape, axis, per_host)
      split = v.reshape(*v.shape[:axis], local_count, per_host // local_count, *v.shape[axis + 1:])
      return np.moveaxis(split, axis, 0)
    return {k: on_devices(v) for k, v in host_batch.items()}

  def _copies(self) -> NamedSharding:
    # pmap (jit + shard_map since JAX 0.8) returns arrays sharded over a mesh whose axis is named
    # after its axis_name; placing the state on that very sharding keeps the step traced once.
    return NamedSharding(Mesh(np.asarray(self.local_devices), (AXIS,)), PartitionSpec(AXIS))

  def put_state(self, host_state):
    count, copies = len(self.local_devices), self._copies()
    return jax.tree_util.tree_map(lambda x: jax.device_put(np.stack([np.asarray(x)] * count), copies), host_state)

  def abstract_state(self, shapes):
    count, copies = len(self.local_devices), self._copies()
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((count, *x.shape), x.dtype, sharding=copies), shapes)

  def trace_train_step(self, train_step: Callable, state, batch: dict, seed) -> None:
    jax.eval_shape(train_step, state, batch, seed)

  def host_state(self, state):
    # The first local device's copy, read from its buffer: indexing x[0] would run an eager gather
    # per leaf and step.
    return jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_shards[0].data).reshape(x.shape[1:]), state)

  def compile_train_step(self, step_fn: Callable) -> Callable:
    return jax.pmap(functools.partial(step_fn, axis_name=AXIS), axis_name=AXIS, in_axes=(0, 0, None),
                    donate_argnums=0)

  def compile_eval_step(self, eval_fn: Callable) -> Callable:
    return jax.pmap(functools.partial(eval_fn, axis_name=AXIS), axis_name=AXIS)


class MeshPlacement(_Placement):
  """mesh: one jit-compiled program over a data x fsdp x tensor device mesh; batches split over data and
  fsdp, the state by its PartitionSpecs; XLA inserts the collectives."""

  def __init__(self, parallel: ParallelSettings, devices: Optional[list] = None, batch_axis: int = 0,
               state_specs=None):
    super().__init__(parallel, devices, batch_axis, state_specs)
    shape = tuple(self.mesh_shape[axis] for axis in sharding.MESH_AXES)
    self.mesh = Mesh(np.asarray(self.devices).reshape(shape), sharding.MESH_AXES)
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    self.sharded = NamedSharding(self.mesh, PartitionSpec(*([None] * batch_axis), sharding.BATCH_AXES))
    self.state_shardings = None
    self.rules = sharding.ACTIVATION_RULES
    self._host_rows = {}  # batch size -> host_rows

  def _state_shardings(self, state):
    """NamedShardings of the state's leaves (a replica axis first, whole, when there is one), in the state's own
    tree (the specs may come from a state built apart, whose optimizer objects are equal but not the same)."""
    if self.state_specs is None:
      return jax.tree_util.tree_map(lambda _: self.replicated, state)
    specs = jax.tree_util.tree_leaves(self.state_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    structure = jax.tree_util.tree_structure(state)
    assert len(specs) == structure.num_leaves, (len(specs), structure.num_leaves)
    return jax.tree_util.tree_unflatten(structure, [
        NamedSharding(self.mesh, PartitionSpec(*([None] * self.batch_axis), *spec)) for spec in specs])

  def host_rows(self, batch_size: int) -> slice:
    """The span of the batch rows this process's devices hold (contiguous: the mesh orders devices by
    process); worked out once per batch size, since put_batch asks at every step."""
    if batch_size not in self._host_rows:
      self._host_rows[batch_size] = self._span_of_rows(batch_size)
    return self._host_rows[batch_size]

  def _span_of_rows(self, batch_size: int) -> slice:
    by_device = NamedSharding(self.mesh, PartitionSpec(sharding.BATCH_AXES)).addressable_devices_indices_map(
        (batch_size,))
    spans = sorted({(index[0].indices(batch_size)[:2]) for index in by_device.values()})
    start, stop = spans[0][0], spans[-1][1]
    if sum(stop - start for start, stop in spans) != stop - start:
      raise ValueError(f'this process\'s devices hold batch rows {spans}, not one span; valid: a device list '
                       'ordered by process (jax.devices())')
    return slice(start, stop)

  def put_batch(self, host_batch: dict, batch_size: int) -> dict:
    axis, rows = self.batch_axis, self.host_rows(batch_size)

    def placed(v):
      shape = (*v.shape[:axis], batch_size, *v.shape[axis + 1:])

      def local(index):  # the global index of a device's block -> the same block of this host's rows
        row_block = index[axis].indices(batch_size)
        return v[(*index[:axis], slice(row_block[0] - rows.start, row_block[1] - rows.start), *index[axis + 1:])]
      return jax.make_array_from_callback(shape, self.sharded, local)
    return {k: placed(v) for k, v in host_batch.items()}

  def put_state(self, host_state):
    """Numpy leaves are split by their shardings; jax.Arrays already placed so (a checkpoint read into
    checkpoint_shardings) stay where they are."""
    self.state_shardings = self._state_shardings(host_state)
    return jax.tree_util.tree_map(
        lambda x, where: x if isinstance(x, jax.Array) and x.sharding == where else
        jax.make_array_from_callback(np.shape(x), where, lambda index: np.asarray(x)[index]),
        host_state, self.state_shardings)

  def abstract_state(self, shapes):
    self.state_shardings = self._state_shardings(shapes)
    return jax.tree_util.tree_map(lambda x, where: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where), shapes,
                                  self.state_shardings)

  def trace_train_step(self, train_step: Callable, state, batch: dict, seed) -> None:
    train_step.trace(state, batch, seed)

  def host_state(self, state):
    return jax.tree_util.tree_map(_whole, state)

  def checkpoint_state(self, state):
    """The state as placed: each process writes its own shards (nothing gathered). Seeds in one program
    (a replica axis first) are split per run on the host."""
    return state if self.batch_axis == 0 else self.host_state(state)

  def checkpoint_shardings(self, abstract_state):
    return self._state_shardings(abstract_state) if self.batch_axis == 0 else None

  def compile_train_step(self, step_fn: Callable) -> Callable:
    return _InMesh(jax.jit(functools.partial(step_fn, axis_name=None),
                           in_shardings=(self.state_shardings, self.sharded, self.replicated),
                           out_shardings=(self.state_shardings, self.replicated), donate_argnums=0),
                   self.mesh, self.rules)

  def compile_eval_step(self, eval_fn: Callable) -> Callable:
    return _InMesh(jax.jit(functools.partial(eval_fn, axis_name=None),
                           in_shardings=(self.state_shardings.params, self.sharded), out_shardings=self.replicated),
                   self.mesh, self.rules)


class _InMesh:
  """A jitted step called (and so traced) with its mesh set and the logical axis rules active: the library's
  activation constraints (transformer.layers.batch_split) then keep activations split over the batch axes."""

  def __init__(self, jitted, mesh: Mesh, rules: tuple):
    self.jitted, self.mesh, self.rules = jitted, mesh, rules

  def __call__(self, *args):
    with jax.sharding.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return self.jitted(*args)

  def lower(self, *args):
    with jax.sharding.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return self.jitted.lower(*args)

  def trace(self, *args):
    with jax.sharding.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return self.jitted.trace(*args)


def _whole(x: jax.Array) -> np.ndarray:
  """The whole array on the host: one device's copy of a replicated array; a split one gathered, from other
  processes too."""
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  return np.asarray(x) if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)


def sum_over_processes(sums: dict) -> dict:
  """Host-side sums (numpy scalars or arrays) added up over all processes, each having summed its own rows of
  a batch; every process must call it at the same point. With one process, the sums themselves."""
  if jax.process_count() == 1 or not sums:
    return sums
  return jax.tree_util.tree_map(lambda x: np.sum(x, axis=0), multihost_utils.process_allgather(sums))


PLACEMENTS = {'pmap': PmapPlacement, 'mesh': MeshPlacement}


def placement_for(parallel: ParallelSettings, devices: Optional[list] = None, batch_axis: int = 0,
                  state_specs=None) -> _Placement:
  """The placement of config.parallel (mode 'pmap' or 'mesh'); state_specs only counts for a mesh."""
  return PLACEMENTS[parallel.mode](parallel, devices, batch_axis, state_specs)
