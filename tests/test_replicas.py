"""Seeds in one program: each replica is the run of its seed alone, on any device count, resumed or not;
a diverging replica stops alone; replicas that cannot resume together are refused."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from experiments.runs import run_record, settings, trainer
from experiments.runs.metrics import read_metrics, without_wall_clock
from experiments.sweeps.programs import programs
from experiments.tasks.algorithmic import Copy
from tests import command_server
from tests.helpers import smoke_experiment, subprocess_environment

ROOT = pathlib.Path(__file__).resolve().parent.parent
DROPOUT = {'model.dropout_rate': 0.1, 'train.log_every': 1}  # dropout: each replica's own stream is exercised


def _assert_same_records(found, expected, rtol=1e-5):
  found, expected = without_wall_clock(found), without_wall_clock(expected)
  assert [(r['step'], r['split'], r.get('length')) for r in found] == [
      (r['step'], r['split'], r.get('length')) for r in expected]
  for got, want in zip(found, expected):
    assert set(got) == set(want)
    for name, value in want.items():
      if isinstance(value, float):
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=1e-7, err_msg=f'{name} at step {want["step"]}')
      else:
        assert got[name] == value, name


@pytest.mark.slow
def test_each_replica_is_the_run_of_its_seed_alone(tmp_path):
  steps = {'train.steps': 30}
  workdirs = [str(tmp_path / f'together-seed{seed}') for seed in (3, 4, 5)]
  evaluations = trainer.run_seeds(smoke_experiment(seed=3, **steps, **DROPOUT), workdirs)
  for offset, workdir in enumerate(workdirs):
    alone = str(tmp_path / f'alone-seed{3 + offset}')
    evaluation = trainer.run(smoke_experiment(seed=3 + offset, **steps, **DROPOUT), alone)
    assert (pathlib.Path(workdir) / 'config.json').read_text() == (pathlib.Path(alone) / 'config.json').read_text()
    _assert_same_records(read_metrics(workdir), read_metrics(alone))
    assert sorted(os.listdir(pathlib.Path(workdir) / 'checkpoints')) == sorted(os.listdir(pathlib.Path(alone) /
                                                                                       'checkpoints'))
    assert run_record.is_finished(workdir) and set(evaluations[offset]) == set(evaluation)
  losses = [read_metrics(w)[-1]['loss'] for w in workdirs]
  assert len(set(losses)) == 3  # three different runs, not one run three times


@pytest.mark.slow
@pytest.mark.parametrize('parallel', ['pmap', 'mesh'])
def test_replicas_on_eight_devices_match_one_device(tmp_path, parallel):
  assert jax.device_count() == 8, 'conftest.py asks for 8 CPU devices'
  experiment = smoke_experiment(**{'parallel.mode': parallel, 'train.log_every': 1})  # dropout differs by device count
  for name, devices in (('one', jax.devices()[:1]), ('eight', jax.devices())):
    trainer.run_seeds(experiment, [str(tmp_path / f'{name}-{seed}') for seed in (0, 1)], devices=devices)
  for seed in (0, 1):
    _assert_same_records(read_metrics(str(tmp_path / f'eight-{seed}')), read_metrics(str(tmp_path / f'one-{seed}')))


@pytest.mark.slow
def test_resumed_replicas_equal_uninterrupted_ones(tmp_path):
  trainer.run_seeds(smoke_experiment(**DROPOUT), [str(tmp_path / f'whole-{seed}') for seed in (0, 1)])
  resumed = [str(tmp_path / f'resumed-{seed}') for seed in (0, 1)]
  trainer.run_seeds(smoke_experiment(**DROPOUT, **{'train.steps': 10}), resumed)
  trainer.run_seeds(smoke_experiment(**DROPOUT), resumed)
  for seed in (0, 1):
    assert without_wall_clock(read_metrics(resumed[seed])) == without_wall_clock(
        read_metrics(str(tmp_path / f'whole-{seed}')))


@pytest.mark.slow
def test_a_diverging_replica_stops_alone_and_the_others_finish(tmp_path, monkeypatch):
  original = Copy.batch

  def poisoned(self, seed, step, split, batch_size, length=None):
    batch = original(self, seed, step, split, batch_size, length)
    if seed == 1 and split == 'train' and step == 6:
      batch['weights'] = batch['weights'].copy()
      batch['weights'][0, :] = np.inf
    return batch

  monkeypatch.setattr(Copy, 'batch', poisoned)
  workdirs = [tmp_path / f'seed{seed}' for seed in (0, 1, 2)]
  with pytest.raises(trainer.NonFiniteLoss) as raised:
    trainer.run_seeds(smoke_experiment(**{'train.checkpoint_every': 3}), [str(w) for w in workdirs])
  assert str(raised.value).startswith(f'seed 1 ({workdirs[1]}): non-finite loss ')
  assert 'at step 7; stopping. The last good checkpoint (step 6)' in str(raised.value)
  assert len(str(raised.value).splitlines()) == 1  # only seed 1 diverged
  assert sorted(int(s) for s in os.listdir(workdirs[1] / 'checkpoints')) == [3, 6]
  assert not (workdirs[1] / 'summary.json').exists()
  assert max(r['step'] for r in read_metrics(str(workdirs[1]))) == 5  # logged every 5 steps
  for healthy in (workdirs[0], workdirs[2]):
    assert run_record.is_finished(str(healthy))
    assert all(np.isfinite(r['loss']) for r in read_metrics(str(healthy)))


@pytest.mark.slow
def test_a_replica_finished_beside_an_unfinished_one_is_left_as_it_is(tmp_path):
  """Killed between the two summaries: the restart evaluates the unfinished one again, touches the other."""
  workdirs = [tmp_path / 'seed0', tmp_path / 'seed1']
  trainer.run_seeds(smoke_experiment(), [str(w) for w in workdirs])
  summary = (workdirs[1] / 'summary.json').read_text()
  metrics = read_metrics(str(workdirs[1]))
  (workdirs[1] / 'summary.json').unlink()
  def files(workdir):  # but the lock, which every run takes
    return {str(p): p.stat().st_mtime_ns for p in workdir.glob('**/*') if p.is_file() and p.name != '.lock'}
  untouched = files(workdirs[0])
  trainer.run_seeds(smoke_experiment(), [str(w) for w in workdirs])
  assert files(workdirs[0]) == untouched
  def evaluation(text):
    return without_wall_clock(list(json.loads(text)['evaluation'].values()))
  assert evaluation((workdirs[1] / 'summary.json').read_text()) == evaluation(summary)
  assert without_wall_clock(read_metrics(str(workdirs[1]))) == without_wall_clock(metrics)


@pytest.mark.slow
def test_replicas_that_cannot_resume_together_are_refused_before_training(tmp_path):
  trainer.run(smoke_experiment(seed=1, **{'train.steps': 10}), str(tmp_path / 'seed1'))
  with pytest.raises(trainer.ReplicasOutOfStep, match=r'checkpoints are at step 0 in .*seed0, step 10 in .*seed1 '
                                                      r'with no step saved by all; train them one at a time '
                                                      r'\(--seeds=1\)'):
    trainer.run_seeds(smoke_experiment(), [str(tmp_path / 'seed0'), str(tmp_path / 'seed1')])
  assert not (tmp_path / 'seed0' / 'metrics.jsonl').exists()


@pytest.mark.slow
def test_a_run_of_another_configuration_among_the_replicas_refuses_them_all(tmp_path):
  trainer.run(smoke_experiment(seed=1, **{'model.position.kind': 'rope'}), str(tmp_path / 'seed1'))
  with pytest.raises(run_record.RunMismatch, match='model.position.kind: the run in .*seed1 has .rope.'):
    trainer.run_seeds(smoke_experiment(), [str(tmp_path / 'seed0'), str(tmp_path / 'seed1')])
  assert not (tmp_path / 'seed0' / 'config.json').exists()


@pytest.mark.parametrize('workdir,seed,seeds,expected', [
    ('runs/copy', 0, 2, "--workdir: got 'runs/copy', the same for every seed; valid with --seeds=2: a path with "
                        "{seed} in it, e.g. runs/copy-seed{seed}"),
    ('runs/s{seed}', settings.MAX_SEED, 2, f'--seeds: got 2 from seed {settings.MAX_SEED}, past the largest seed'),
    ('runs/s{seed}', 0, 0, '--seeds: got 0; valid: a positive integer'),
])
def test_bad_seed_workdirs_are_named(workdir, seed, seeds, expected):
  with pytest.raises(settings.ConfigError) as raised:
    settings.seed_workdirs(workdir, seed, seeds)
  assert str(raised.value).startswith(expected)


def test_seed_workdirs():
  assert settings.seed_workdirs('runs/s{seed}', 4, 3) == ['runs/s4', 'runs/s5', 'runs/s6']
  assert settings.seed_workdirs('runs/one', 4, 1) == ['runs/one']


def test_compare_groups_consecutive_seeds_that_resume_from_one_step(tmp_path):
  for seed, step in ((2, 10), (3, 10), (5, 10)):
    (tmp_path / f'none-seed{seed}' / 'checkpoints' / str(step)).mkdir(parents=True)
  seeds = [0, 1, 2, 3, 5, 6]
  assert programs('none', seeds, str(tmp_path), together=True) == [[0, 1], [2, 3], [5], [6]]
  assert programs('none', seeds, str(tmp_path), together=False) == [[s] for s in seeds]


_environment = subprocess_environment


@pytest.mark.slow
def test_a_stopped_program_resumes_into_the_uninterrupted_runs(tmp_path):
  """SIGTERM to `train --seeds=2`: every replica checkpoints at one step and the command exits 0; the
  rerun finishes both, each with the metrics of the uninterrupted runs."""
  def command(pattern):
    return [sys.executable, '-m', 'experiments.train', '--config=configs/smoke.py', f'--workdir={pattern}',
            '--seeds=2', '--config.train.steps=60', '--config.train.log_every=1', '--config.train.checkpoint_every=25']
  whole = command_server.run(command(tmp_path / 'whole{seed}'), cwd=ROOT, env=_environment(), capture_output=True,
                             text=True, timeout=600)
  assert whole.returncode == 0, whole.stderr[-2000:]
  process = subprocess.Popen(command(tmp_path / 'stopped{seed}'), cwd=ROOT, env=_environment(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  metrics = tmp_path / 'stopped1' / 'metrics.jsonl'
  deadline = time.time() + 300
  while not (metrics.exists() and metrics.read_text().count('\n') >= 5) and time.time() < deadline:
    time.sleep(0.02)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-2000:]
  stopped_at = [max(int(n) for n in os.listdir(tmp_path / f'stopped{seed}' / 'checkpoints')) for seed in (0, 1)]
  assert stopped_at[0] == stopped_at[1] < 60 and not (tmp_path / 'stopped0' / 'summary.json').exists()
  rerun = command_server.run(command(tmp_path / 'stopped{seed}'), cwd=ROOT, env=_environment(), capture_output=True,
                             text=True, timeout=600)
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  assert f'resuming from the checkpoints at step {stopped_at[0]}' in rerun.stderr
  for seed in (0, 1):
    assert without_wall_clock(read_metrics(str(tmp_path / f'stopped{seed}'))) == without_wall_clock(
        read_metrics(str(tmp_path / f'whole{seed}')))


@pytest.mark.slow
def test_a_sweep_of_seeds_in_one_program_tabulates_like_one_process_per_run(tmp_path):
  def sweep(workdir, *extra):
    return command_server.run([sys.executable, '-m', 'experiments.compare', '--config=configs/smoke.py',
                               '--positions=none', '--seeds=2', f'--workdir={workdir}', '--config.train.steps=10',
                               *extra], cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=900)
  together, apart = sweep(tmp_path / 'together'), sweep(tmp_path / 'apart', '--novmap_seeds')
  assert together.returncode == 0 and apart.returncode == 0, together.stderr[-2000:] + apart.stderr[-2000:]
  assert '[program 1/1] none-seed0, none-seed1: training' in together.stderr
  assert '[program 2/2] none-seed1: training' in apart.stderr
  assert 'step 10 loss' in (tmp_path / 'together' / 'none-seed0' / 'train.log').read_text()
  assert 'its output is in' in (tmp_path / 'together' / 'none-seed1' / 'train.log').read_text()
  for seed in (0, 1):
    assert '--seeds=2' in (tmp_path / 'together' / f'none-seed{seed}' / 'train.log').read_text()
  assert (tmp_path / 'together' / 'results.md').read_text() == (tmp_path / 'apart' / 'results.md').read_text()
