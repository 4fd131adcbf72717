"""Parameters split over a device mesh: the same losses as one device, the bytes each device holds, resuming
on another mesh, and the refusals of a mesh the devices or the parameters cannot take."""

import base64
import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import transformer
from experiments.runs import preflight, sharding, steps, trainer
from experiments.runs.checkpoints import Checkpoints
from experiments.runs.metrics import read_metrics
from experiments.runs.parallel import placement_for
from experiments.runs.settings import ConfigError
from experiments.tasks import TASKS
from tests.helpers import smoke_experiment, subprocess_environment

MESH = {'parallel.mode': 'mesh', 'train.log_every': 1}


def _losses(workdir) -> np.ndarray:
  return np.array([r['loss'] for r in read_metrics(str(workdir))])


def _placements(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / 'placements.jsonl').read_text().splitlines()]


@pytest.mark.parametrize('fsdp, tensor', [(8, 1), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_a_split_state_gives_the_losses_of_one_device(tmp_path, fsdp, tensor):
  """20 steps and two evaluations, with parameters split over fsdp (and heads and units over tensor)
  devices, the rest of the 8 along data: the losses of the plain one-device run to 1e-5."""
  trainer.run(smoke_experiment(**{'train.log_every': 1}), str(tmp_path / 'one'), devices=jax.devices()[:1])
  split = smoke_experiment(**MESH, **{'parallel.fsdp': fsdp, 'parallel.tensor': tensor})
  trainer.run(split, str(tmp_path / 'split'), devices=jax.devices())
  one, many = _losses(tmp_path / 'one'), _losses(tmp_path / 'split')
  assert len(one) == 20 + 2 * 2
  np.testing.assert_allclose(many, one, rtol=1e-5)
  assert _placements(tmp_path / 'split')[0]['mesh'] == {'data': 8 // (fsdp * tensor), 'fsdp': fsdp, 'tensor': tensor}


def _on_first_device(state) -> int:
  """Bytes of the state's shards that live on device 0, read from the arrays themselves."""
  first = jax.devices()[0]
  return sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(state)
             for shard in leaf.addressable_shards if shard.device == first)


def _placed(experiment):
  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(experiment.model, experiment.task.model_kind)
  host_state = jax.device_get(steps.create_train_state(experiment, model, task))
  specs, memory = sharding.plan(experiment, model, task, host_state, jax.device_count())
  placement = placement_for(experiment.parallel, jax.devices(), state_specs=specs)
  return placement.put_state(host_state), memory


def test_fsdp_over_eight_devices_holds_an_eighth_of_the_split_parameters_on_each():
  """Bytes on device 0, measured on the placed arrays: with fsdp=8 every matrix holds an eighth, the
  vectors (biases, norms) stay whole; the plan's report says the same."""
  overrides = {'model.model_dim': 64, 'model.feed_forward_dim': 128}
  whole_state, whole = _placed(smoke_experiment(**overrides, **MESH))
  split_state, split = _placed(smoke_experiment(**overrides, **MESH, **{'parallel.fsdp': 8}))
  vectors = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(split_state) if leaf.ndim < 2)
  matrices = _on_first_device(whole_state) - vectors
  print(f'\nbytes on one of 8 devices: replicated {_on_first_device(whole_state):,} '
        f'(parameters {whole["parameters"]:,}, optimizer {whole["optimizer_state"]:,}); fsdp=8 '
        f'{_on_first_device(split_state):,} (parameters {split["parameters"]:,}, optimizer {split["optimizer_state"]:,})'
        f'; whole vectors {vectors:,}')
  assert matrices > 10 * vectors  # the matrices are what an eighth is taken of
  assert _on_first_device(split_state) == matrices // 8 + vectors
  assert split['parameters'] + split['optimizer_state'] + 4 == _on_first_device(split_state)  # + the step (int32)
  assert whole['parameters'] + whole['optimizer_state'] + 4 == _on_first_device(whole_state)


def _saved_shardings(checkpoint) -> dict:
  """{leaf path: its sharding as orbax recorded it} of a checkpoint's _sharding file."""
  recorded = json.loads((checkpoint / 'default' / '_sharding').read_text())
  return {base64.b64decode(key).decode(): json.loads(value) for key, value in recorded.items()}


@pytest.mark.slow
def test_a_run_split_over_eight_devices_resumes_on_two_and_on_one_as_if_uninterrupted(tmp_path):
  """Stopped at step 10 with fsdp=8 on 8 devices, its checkpoint holds each array as split there (no
  gather); resumed with fsdp=2 on 2 devices, and from a copy on 1: at step 20 the losses of the
  uninterrupted run (1e-5), the change recorded, and where each start ran in placements.jsonl."""
  eight = {**MESH, 'parallel.fsdp': 8}
  trainer.run(smoke_experiment(**eight), str(tmp_path / 'full'), devices=jax.devices())
  trainer.run(smoke_experiment(**eight, **{'train.steps': 10}), str(tmp_path / 'resumed'), devices=jax.devices())
  saved = _saved_shardings(tmp_path / 'resumed' / 'checkpoints' / '10')
  embedding = saved['params.embedding.embedding.embedding']
  assert embedding['shape'] == [1, 8, 1] and 'fsdp' in json.dumps(embedding['partition_spec'])
  assert sum('fsdp' in json.dumps(value['partition_spec']) for value in saved.values()) > 10
  shutil.copytree(tmp_path / 'resumed', tmp_path / 'resumed-on-one')
  trainer.run(smoke_experiment(**MESH, **{'parallel.fsdp': 2}), str(tmp_path / 'resumed'), devices=jax.devices()[:2])
  trainer.run(smoke_experiment(**MESH), str(tmp_path / 'resumed-on-one'), devices=jax.devices()[:1])
  for resumed, devices, fsdp in (('resumed', 2, 2), ('resumed-on-one', 1, 1)):
    np.testing.assert_allclose(_losses(tmp_path / resumed), _losses(tmp_path / 'full'), rtol=1e-5)
    starts = _placements(tmp_path / resumed)
    assert [(s['step'], s['devices'], s['mesh']['fsdp']) for s in starts] == [(0, 8, 8), (10, devices, fsdp)]
    changes = json.loads((tmp_path / resumed / 'config_changes.jsonl').read_text())
    assert changes == {'step': 10, 'changes': {'parallel.fsdp': [8, fsdp], 'train.steps': [10, 20]}}


def test_a_checkpoint_split_eight_ways_is_read_straight_into_a_split_over_two(tmp_path):
  """Checkpoints.restore_latest with the shardings of another mesh: each of the 2 devices gets its half of
  every split matrix, placed where the new run wants it, with the values a whole (numpy) read gives."""
  eight = smoke_experiment(**MESH, **{'parallel.fsdp': 8, 'train.steps': 2, 'train.eval_every': 2})
  trainer.run(eight, str(tmp_path / 'run'), devices=jax.devices())
  two = smoke_experiment(**MESH, **{'parallel.fsdp': 2})
  task = TASKS[two.task.name](two.task)
  model = transformer.build_model(two.model, two.task.model_kind)
  template = jax.device_get(steps.create_train_state(two, model, task))
  specs, _ = sharding.plan(two, model, task, template, 2)
  placement = placement_for(two.parallel, jax.devices()[:2], state_specs=specs)
  shardings = placement.checkpoint_shardings(template)
  checkpoints = Checkpoints(str(tmp_path / 'run'), keep=2)
  step, split, _ = checkpoints.restore_latest(template, shardings=shardings)
  _, whole, _ = checkpoints.restore_latest(template)
  checkpoints.close()
  assert step == 2
  halves = 0
  for leaf, where, numpy_leaf in zip(*(jax.tree_util.tree_leaves(t) for t in (split, shardings, whole))):
    assert isinstance(leaf, jax.Array) and leaf.sharding == where
    assert {shard.device for shard in leaf.addressable_shards} == set(jax.devices()[:2])
    for shard in leaf.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(numpy_leaf)[shard.index])
    halves += any(shard.data.shape != np.shape(numpy_leaf) for shard in leaf.addressable_shards)
  assert halves > 10  # the split matrices (and their optimizer moments) arrive in halves
  # What evaluate, analyze and train.init_from read: the parameters, in a process of one device.
  read = subprocess.run([sys.executable, '-c', 'import jax, numpy as np; from experiments.runs import checkpoints; '
                         f'p = checkpoints.restore_params({str(tmp_path / "run")!r}, 2); '
                         'print(jax.device_count(), float(sum(np.abs(x).sum() for x in jax.tree_util.tree_leaves(p))))'],
                        env=subprocess_environment(1), capture_output=True, text=True, timeout=300)
  assert read.returncode == 0, read.stderr[-2000:]
  devices, total = read.stdout.split()
  assert devices == '1'
  assert float(total) == pytest.approx(sum(float(np.abs(x).sum()) for x in jax.tree_util.tree_leaves(whole.params)),
                                       rel=1e-6)
  assert placement.put_state(split) is not None and all(
      a is b for a, b in zip(jax.tree_util.tree_leaves(placement.put_state(split)), jax.tree_util.tree_leaves(split)))


def test_a_parameter_axis_the_fsdp_size_does_not_divide_is_refused_before_compiling():
  experiment = smoke_experiment(**MESH, **{'parallel.fsdp': 8, 'model.model_dim': 36, 'model.num_heads': 2})
  with pytest.raises(ConfigError, match=r"^parallel.fsdp: got 8 devices along 'fsdp'; parameter decoder/.* has a "
                                        r"'embed' axis of 36, which 8 does not divide; valid: a divisor of 36, or "
                                        r"--config.parallel.rules.embed= \(that axis whole on every device\)$"):
    preflight.check(experiment)
  preflight.check(smoke_experiment(**MESH, **{'parallel.fsdp': 8, 'model.model_dim': 36, 'model.num_heads': 2,
                                              'parallel.rules.embed': ''}))  # left whole by rule: accepted
