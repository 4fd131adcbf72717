"""Bad input, faults and interruptions lose nothing."""

import glob
import json
import hashlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from configs import shakespeare as shakespeare_config
from experiments import settings, trainer
from experiments.checkpoints import CheckpointMismatch
from experiments.data import shakespeare as shakespeare_data
from experiments.metrics import read_metrics, without_wall_clock
from tests.helpers import smoke_experiment
from experiments.tasks.algorithmic import Copy

ROOT = pathlib.Path(__file__).resolve().parent.parent

BAD_OVERRIDES = [  # (overrides, what the one line must say); 8 devices in this process
    (['--config.model.nonexistent=3'], '--config.model.nonexistent: unknown config field'),
    (['--config.model.position.colour=red'], '--config.model.position.colour: unknown config field'),
    (['--config.train.steps=many'], "--config.train.steps=many: invalid literal for int()"),
    (['--config.train.learning_rate=fast'], '--config.train.learning_rate=fast'),
    (['--config.model.position.per_head=maybe'], '--config.model.position.per_head=maybe'),
    (['--config.train.steps=0'], 'train.steps: got 0; valid: a positive number'),
    (['--config.train.steps=-5'], 'train.steps: got -5; valid: a positive number'),
    (['--config.train.batch_size=0'], 'train.batch_size: got 0; valid: a positive number'),
    (['--config.model.model_dim=0'], 'model.model_dim: got 0; valid: a positive integer'),
    (['--config.model.feed_forward_dim=-1'], 'model.feed_forward_dim: got -1; valid: a positive integer'),
    (['--config.model.num_heads=3'], 'model.num_heads: got 3; valid: a divisor of model_dim=32'),
    (['--config.model.position.kind=fourier'], "model.position.kind: got 'fourier'; valid: alibi, learned"),
    (['--config.task.name=tetris'], "task.name: got 'tetris'; valid: addition, classify, copy"),
    (['--config.task.model_kind=encoder_only'], "task.model_kind: got 'encoder_only'; valid: decoder_only"),
    (['--config.model.position.kind=learned', '--config.model.position.max_length=20'],
     'model.position.max_length: got 20; valid: at least 26'),
    (['--config.train.batch_size=12'], 'train.batch_size: got 12; valid: a multiple of the device count 8'),
    (['--config.parallel=fsdp'], "parallel: got 'fsdp'; valid: pmap, mesh"),
    (['--config.model.norm=middle'], "model.norm: got 'middle'; valid: post, pre"),
    (['--config.model.activation=swish'], "model.activation: got 'swish'; valid: relu, gelu"),
    (['--config.model.dropout_rate=1.5'], 'model.dropout_rate: got 1.5; valid: a rate in [0, 1)'),
    (['--config.train.label_smoothing=1.0'], 'train.label_smoothing: got 1.0; valid: a number in [0, 1)'),
    (['--config.train.schedule=cosine'], "train.schedule: got 'cosine'; valid: warmup_rsqrt"),
    (['--config.task.min_length=10'], 'task.min_length: got 10; valid: at most task.max_length=6'),
    (['--config.model.position.num_buckets=7'], 'model.position.num_buckets: got 7; valid: an even number'),
    (['--config.model.position.rope_base=0.5'], 'model.position.rope_base: got 0.5; valid: a number > 1'),
    (['--config.seed=1.5'], '--config.seed=1.5: invalid literal for int()'),
]


def _train_cli(argv, devices=8):
  """The real command line in a subprocess: (exit code, non-empty stderr lines)."""
  environment = dict(os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
                     JAX_PLATFORMS='cpu', PYTHONPATH=str(ROOT))
  result = subprocess.run([sys.executable, '-m', 'experiments.train', *argv], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)
  return result.returncode, [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize('overrides,expected', BAD_OVERRIDES, ids=[' '.join(o) for o, _ in BAD_OVERRIDES])
def test_bad_config_exits_with_one_line_and_writes_nothing(tmp_path, overrides, expected):
  workdir = tmp_path / 'run'
  code, lines = _train_cli(['--config=configs/smoke.py', f'--workdir={workdir}', *overrides])
  assert code == 2
  assert len(lines) == 1 and lines[0].startswith('error: '), lines
  assert expected in lines[0], lines[0]
  assert not workdir.exists()


def test_a_workdir_under_a_file_is_refused(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  code, lines = _train_cli(['--config=configs/smoke.py', f'--workdir={blocker}/run'])
  assert code == 2 and len(lines) == 1
  assert lines[0] == f"error: workdir: got '{blocker}/run'; valid: a path under a directory ({blocker} is a file)"


def test_a_missing_data_file_is_a_config_error_naming_it_and_the_rebuild_command(tmp_path, monkeypatch):
  """In process, since the data directory is patched; the command line turns a ConfigError into
  exit code 2 and its one line (shown by the table above)."""
  broken = tmp_path / 'shakespeare'
  shutil.copytree(shakespeare_data.DIRECTORY, broken)
  (broken / 'train.txt.xz').unlink()
  monkeypatch.setattr(shakespeare_data, 'DIRECTORY', str(broken))
  with pytest.raises(settings.ConfigError) as raised:
    settings.from_config_dict(shakespeare_config.get_config(), 1)
  message = str(raised.value)
  assert '\n' not in message
  assert message.startswith('task.name: shakespeare: ')
  assert 'train.txt.xz: missing; rebuild it with: python -m experiments.data.prepare_shakespeare' in message


def _fingerprint(directory) -> dict:
  return {path: hashlib.sha256(open(path, 'rb').read()).hexdigest()
          for path in glob.glob(f'{directory}/**', recursive=True) if os.path.isfile(path)}


def test_corrupt_or_incomplete_checkpoint_resumes_from_the_last_good_one(tmp_path):
  schedule = {'train.checkpoint_every': 5, 'train.keep_checkpoints': 3}
  trainer.run(smoke_experiment(**schedule), str(tmp_path / 'whole'))
  run = tmp_path / 'damaged'
  trainer.run(smoke_experiment(**schedule, **{'train.steps': 15}), str(run))
  assert sorted(os.listdir(run / 'checkpoints')) == ['10', '15', '5']
  for victim in glob.glob(str(run / 'checkpoints' / '15' / '**' / 'd' / '*'), recursive=True)[:1]:
    os.remove(victim)  # damaged: a data file of the newest checkpoint is gone
  shutil.copytree(run / 'checkpoints' / '10', run / 'checkpoints' / '20.orbax-checkpoint-tmp-1')  # a cut save
  trainer.run(smoke_experiment(**schedule), str(run))
  assert os.listdir(run / 'checkpoints.unreadable')[0].startswith('15-')  # set aside, not deleted
  assert without_wall_clock(read_metrics(str(run))) == without_wall_clock(read_metrics(str(tmp_path / 'whole')))


def test_a_config_with_other_shapes_fails_clearly_and_leaves_the_checkpoint_untouched(tmp_path):
  trainer.run(smoke_experiment(), str(tmp_path))
  before = _fingerprint(tmp_path / 'checkpoints')
  with pytest.raises(CheckpointMismatch, match=r"\['params'\]\S* has shape \(\S*32,?\) there and \(\S*48,?\) here"):
    trainer.run(smoke_experiment(**{'model.model_dim': 48, 'train.steps': 30}), str(tmp_path))
  assert _fingerprint(tmp_path / 'checkpoints') == before


def test_an_inf_in_a_batch_stops_the_run_naming_the_step_and_keeps_the_good_checkpoints(tmp_path, monkeypatch):
  original = Copy.batch

  def poisoned(self, seed, step, split, batch_size, length=None):
    batch = original(self, seed, step, split, batch_size, length)
    if split == 'train' and step == 6:
      batch['weights'] = batch['weights'].copy()
      batch['weights'][0, :] = np.inf
    return batch

  monkeypatch.setattr(Copy, 'batch', poisoned)
  with pytest.raises(trainer.NonFiniteLoss, match='non-finite loss (inf|nan) at step 7;'):
    trainer.run(smoke_experiment(**{'train.checkpoint_every': 3}), str(tmp_path))
  assert sorted(int(s) for s in os.listdir(tmp_path / 'checkpoints')) == [3, 6]
  assert not (tmp_path / 'summary.json').exists()


def _environment():
  return dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1', JAX_PLATFORMS='cpu',
              PYTHONPATH=str(ROOT))


def _command(workdir, *extra):
  return [sys.executable, '-m', 'experiments.train', '--config=configs/smoke.py', f'--workdir={workdir}',
          '--config.train.steps=80', '--config.train.log_every=1', '--config.train.checkpoint_every=10',
          '--config.train.eval_every=40', *extra]


def _wait_for_lines(path, count, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if path.exists() and path.read_text().count('\n') >= count:
      return
    time.sleep(0.02)
  raise TimeoutError(f'{path} never reached {count} lines')


def test_kill_9_then_restart_ends_with_the_metrics_of_an_uninterrupted_run(tmp_path):
  whole = subprocess.run(_command(tmp_path / 'whole'), cwd=ROOT, env=_environment(), capture_output=True, text=True,
                         timeout=600)
  assert whole.returncode == 0, whole.stderr[-2000:]
  run = tmp_path / 'killed'
  process = subprocess.Popen(_command(run), cwd=ROOT, env=_environment(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  _wait_for_lines(run / 'metrics.jsonl', 25 + np.random.default_rng().integers(0, 30))
  process.kill()
  process.wait()
  logged = read_metrics(str(run))[-1]['step']
  assert logged < 80
  restarted = subprocess.run(_command(run), cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=600)
  assert restarted.returncode == 0, restarted.stderr[-2000:]
  resumed_from = int(restarted.stderr.split('resuming from the checkpoint at step ')[1].split()[0])
  assert logged - 10 <= resumed_from <= logged  # at most the work since the last checkpoint is lost
  assert without_wall_clock(read_metrics(str(run))) == without_wall_clock(read_metrics(str(tmp_path / 'whole')))


def test_a_second_run_on_the_same_workdir_refuses(tmp_path):
  run = tmp_path / 'run'
  first = subprocess.Popen(_command(run, '--config.train.steps=100000'), cwd=ROOT, env=_environment(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    _wait_for_lines(run / 'metrics.jsonl', 2)
    config_before = (run / 'config.json').read_bytes()
    second = subprocess.run(_command(run), cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 2
    assert second.stderr.startswith('error: workdir') and 'is in use by a running job (pid ' in second.stderr
    assert second.stderr.count('\n') == 1
    assert (run / 'config.json').read_bytes() == config_before
  finally:
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=120)
  assert first.returncode == 0


def test_rerunning_a_finished_run_changes_nothing_and_a_missing_summary_is_rebuilt(tmp_path):
  experiment = smoke_experiment()
  first = trainer.run(experiment, str(tmp_path))
  metrics_before = (tmp_path / 'metrics.jsonl').read_text()
  summary_before = (tmp_path / 'summary.json').read_text()
  assert trainer.run(experiment, str(tmp_path)) == first
  assert (tmp_path / 'metrics.jsonl').read_text() == metrics_before
  assert (tmp_path / 'summary.json').read_text() == summary_before
  (tmp_path / 'summary.json').unlink()  # killed after the final checkpoint, before the summary
  trainer.run(experiment, str(tmp_path))
  assert without_wall_clock(read_metrics(str(tmp_path))) == without_wall_clock(
      [json.loads(line) for line in metrics_before.splitlines()])
  rebuilt = json.loads((tmp_path / 'summary.json').read_text())['evaluation']
  original = json.loads(summary_before)['evaluation']
  assert without_wall_clock(list(rebuilt.values())) == without_wall_clock(list(original.values()))
