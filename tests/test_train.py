"""The runner: outputs, determinism, compile-once, 1 vs 8 devices (pmap and mesh), resumption."""

import json
import os

import chex
import jax
import numpy as np
import pytest

from experiments.runs import trainer
from experiments.runs.metrics import read_metrics, without_wall_clock
from tests.helpers import smoke_experiment


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory):
  """configs/smoke.py (pmap, 20 steps) trained once per module (and test worker): the reference that several
  tests compare a run of their own with. Read only."""
  workdir = tmp_path_factory.mktemp('smoke') / 'run'
  trainer.run(smoke_experiment(), str(workdir))
  return str(workdir)


def test_outputs_in_the_workdir(tmp_path):
  experiment = smoke_experiment()
  evaluation = trainer.run(experiment, str(tmp_path))
  assert set(evaluation) == set(experiment.task.eval_lengths)
  resolved = json.loads((tmp_path / 'config.json').read_text())
  assert resolved['model']['position']['kind'] == 'sinusoidal' and resolved['train']['steps'] == 20
  records = read_metrics(str(tmp_path))
  train_records = [r for r in records if r['split'] == 'train']
  assert [r['step'] for r in train_records] == [5, 10, 15, 20]
  for record in train_records:
    assert {'step', 'split', 'loss', 'token_accuracy', 'sequence_accuracy', 'learning_rate',
            'tokens_per_second', 'wall_time'} <= set(record)
  assert train_records[-1]['loss'] < train_records[0]['loss']
  eval_records = [r for r in records if r['split'] == 'eval']
  assert sorted({(r['step'], r['length']) for r in eval_records}) == [(10, 6), (10, 12), (20, 6), (20, 12)]
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['10', '20']
  assert any(name.startswith('events.out.tfevents') for name in os.listdir(tmp_path / 'tensorboard'))


@pytest.mark.slow
def test_same_config_and_seed_give_the_same_metrics(tmp_path, smoke_run):
  trainer.run(smoke_experiment(), str(tmp_path / 'second'))
  first = without_wall_clock(read_metrics(smoke_run))
  assert first == without_wall_clock(read_metrics(str(tmp_path / 'second')))
  trainer.run(smoke_experiment(seed=1), str(tmp_path / 'other_seed'))
  assert first != without_wall_clock(read_metrics(str(tmp_path / 'other_seed')))


@pytest.mark.slow
@pytest.mark.parametrize('seeds', [1, 2])
@pytest.mark.parametrize('parallel', ['pmap', 'mesh'])
def test_train_step_is_traced_once(tmp_path, parallel, seeds):
  """The trace made before the run writes (where tracing's refusals are raised) is the one the steps use."""
  experiment = smoke_experiment(**{'parallel.mode': parallel, 'train.steps': 4 if seeds > 1 else 20})
  traces = []

  def wrap(step_fn):
    @chex.assert_max_traces(n=1)
    def counted(state, batch, seed, axis_name=None):
      traces.append(1)
      return step_fn(state, batch, seed, axis_name=axis_name)
    return counted

  chex.clear_trace_counter()
  trainer.run_seeds(experiment, [str(tmp_path / f'seed{i}') for i in range(seeds)], wrap_train_step=wrap)
  assert len(traces) == 1
  assert all(len(read_metrics(str(tmp_path / f'seed{i}'))) > 1 for i in range(seeds))


def _losses(workdir):
  return np.array([r['loss'] for r in read_metrics(workdir)])


@pytest.mark.slow
@pytest.mark.parametrize('parallel', ['pmap', 'mesh'])
def test_one_device_and_eight_devices_give_the_same_losses(tmp_path, parallel):
  assert jax.device_count() == 8, 'conftest.py asks for 8 CPU devices'
  experiment = smoke_experiment(**{'parallel.mode': parallel, 'train.log_every': 1})
  trainer.run(experiment, str(tmp_path / 'one'), devices=jax.devices()[:1])
  trainer.run(experiment, str(tmp_path / 'eight'), devices=jax.devices())
  one, eight = _losses(str(tmp_path / 'one')), _losses(str(tmp_path / 'eight'))
  assert len(one) == 20 + 2 * 2
  np.testing.assert_allclose(eight, one, rtol=1e-5)


@pytest.mark.parametrize('parallel, device_count', [('pmap', 1), ('mesh', 8)])
def test_gradient_accumulation_gives_the_losses_of_the_whole_batch(tmp_path, parallel, device_count):
  """Batch 64 as 4 microbatches of 16 (on 8 devices, 2 per device each), added up inside one step: the
  update of batch 64 in one piece, so the same losses step after step."""
  overrides = {'parallel.mode': parallel, 'train.batch_size': 64, 'train.log_every': 1}
  devices = jax.devices()[:device_count]
  trainer.run(smoke_experiment(**overrides), str(tmp_path / 'whole'), devices=devices)
  trainer.run(smoke_experiment(**overrides, **{'train.gradient_accumulation': 4}), str(tmp_path / 'four'),
              devices=devices)
  whole, four = _losses(str(tmp_path / 'whole')), _losses(str(tmp_path / 'four'))
  assert len(whole) == 20 + 2 * 2
  np.testing.assert_allclose(four, whole, rtol=1e-5)


def test_evaluation_in_microbatches_gives_the_metrics_of_the_whole_batch(tmp_path, smoke_run):
  """Each evaluation batch of 16 (2 rows per device on 8) as 2 microbatches whose sums are added up in turn: the
  same evaluation records as the whole batch at once, and the training untouched."""
  trainer.run(smoke_experiment(**{'train.eval_microbatches': 2}), str(tmp_path))
  whole, split = read_metrics(smoke_run), read_metrics(str(tmp_path))
  assert ([r for r in without_wall_clock(split) if r['split'] == 'train']
          == [r for r in without_wall_clock(whole) if r['split'] == 'train'])
  evaluations = [[r for r in records if r['split'] == 'eval'] for records in (whole, split)]
  assert [(r['step'], r['length']) for r in evaluations[1]] == [(r['step'], r['length']) for r in evaluations[0]]
  assert len(evaluations[0]) == 4
  for whole_record, split_record in zip(*evaluations):
    for name in ('loss', 'token_accuracy', 'sequence_accuracy'):
      np.testing.assert_allclose(split_record[name], whole_record[name], rtol=1e-5, err_msg=name)


@pytest.mark.slow
def test_pmap_and_mesh_agree(tmp_path, smoke_run):
  trainer.run(smoke_experiment(**{'parallel.mode': 'mesh'}), str(tmp_path / 'mesh'))
  np.testing.assert_allclose(_losses(str(tmp_path / 'mesh')), _losses(smoke_run), rtol=1e-5)


@pytest.mark.slow
def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path, smoke_run):
  trainer.run(smoke_experiment(**{'train.steps': 10}), str(tmp_path / 'resumed'))
  trainer.run(smoke_experiment(), str(tmp_path / 'resumed'))
  assert without_wall_clock(read_metrics(str(tmp_path / 'resumed'))) == without_wall_clock(read_metrics(smoke_run))


@pytest.mark.parametrize('failing_step', [10, 20])
def test_an_evaluation_that_fails_loses_no_training_and_the_resume_evaluates_first(tmp_path, smoke_run,
                                                                                   monkeypatch, failing_step):
  """The checkpoint at an evaluation step is written before the evaluation. One that fails there (out of memory
  at a long length, say) leaves that checkpoint, and the rerun evaluates that step before anything else: the
  records of the run that never failed, the last step (no summary yet) included."""
  real_evaluate = trainer.evaluate

  def failing(*args, **kwargs):
    if args[5] == failing_step:
      raise MemoryError('out of memory in the evaluation')
    return real_evaluate(*args, **kwargs)

  monkeypatch.setattr(trainer, 'evaluate', failing)
  with pytest.raises(MemoryError):
    trainer.run(smoke_experiment(), str(tmp_path))
  assert sorted(int(name) for name in os.listdir(tmp_path / 'checkpoints') if name.isdigit())[-1] == failing_step
  assert not (tmp_path / 'summary.json').exists()
  monkeypatch.setattr(trainer, 'evaluate', real_evaluate)
  trainer.run(smoke_experiment(), str(tmp_path))
  assert without_wall_clock(read_metrics(str(tmp_path))) == without_wall_clock(read_metrics(smoke_run))
  summaries = []
  for workdir in (str(tmp_path), smoke_run):
    with open(os.path.join(workdir, 'summary.json')) as file:
      evaluation = json.load(file)['evaluation']
    summaries.append({length: without_wall_clock([record]) for length, record in evaluation.items()})
  assert summaries[0] == summaries[1] and len(summaries[0]) == 2


@pytest.mark.slow
def test_dropout_runs_and_differs_from_no_dropout(tmp_path, smoke_run):
  trainer.run(smoke_experiment(**{'model.dropout_rate': 0.3}), str(tmp_path / 'dropout'))
  assert not np.allclose(_losses(str(tmp_path / 'dropout')), _losses(smoke_run))


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
  experiment = smoke_experiment(**{'train.learning_rate': 1e9, 'train.gradient_clip': 0.0, 'train.warmup_steps': 0,
                              'train.checkpoint_every': 1, 'train.steps': 200})
  with pytest.raises(trainer.NonFiniteLoss, match=r'at step (\d+)') as raised:
    trainer.run(experiment, str(tmp_path))
  bad_step = int(raised.value.args[0].split('at step ')[1].split(';')[0])
  kept = sorted(int(s) for s in os.listdir(tmp_path / 'checkpoints'))
  assert kept and max(kept) == bad_step - 1
