"""Bad input, faults and interruptions lose nothing."""

import glob
import hashlib
import json
import logging
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
from experiments.runs import checkpoints, settings, trainer
from experiments.runs.checkpoints import CheckpointMismatch
from experiments.data import shakespeare as shakespeare_data
from experiments.runs.metrics import MetricsDamaged, read_metrics, without_wall_clock
from tests import command_server
from tests.helpers import smoke_experiment, subprocess_environment
from experiments.tasks.algorithmic import Copy

ROOT = pathlib.Path(__file__).resolve().parent.parent

BAD_COMMAND_LINES = [  # (arguments after --workdir, what the one line must say); 8 devices in this process
    (['--config.model.nonexistent=3'], '--config.model.nonexistent: unknown config field; valid fields of model:'),
    (['--config.model.position.colour=red'], '--config.model.position.colour: unknown config field'),
    (['--config.train.stpes=20'], '--config.train.stpes: unknown config field (did you mean train.steps?); valid '
                                  'fields of train: batch_size,'),
    (['--config.train.steps=many'], "--config.train.steps=many: invalid literal for int()"),
    (['--config.train.learning_rate=fast'], '--config.train.learning_rate=fast'),
    (['--config.model.position.per_head=maybe'],  # a variant's setting: not in the config file, typed by its variant
     "model.position.per_head: got 'maybe' of type str; valid: a value of type bool"),
    (['--config.model.position.kind=rope', '--config.model.position.rope_base=tiny'],
     "model.position.rope_base: got 'tiny' of type str; valid: a value of type float"),
    (['--config.seed=1.5'], '--config.seed=1.5: invalid literal for int()'),
    (['--config.model.num_heads=3'], 'model.num_heads: got 3; valid: a divisor of model_dim=32'),  # tests/test_settings.py has the rest
    (['--config.train.gradient_clip=nan'], 'train.gradient_clip: got nan; valid: a finite number'),
    (['--config.seed=-1'], 'seed: got -1; valid: an integer in [0, 2147483647]'),
]
CONFIG_FILES = {  # a config file's text, and what the one line must say
    'raises.py': ("raise RuntimeError('boom in config')\n", 'cannot load {path}: RuntimeError: boom in config'),
    'syntax.py': ('def get_config(:\n', 'cannot load {path}: SyntaxError:'),
    'none.py': ('x = 1\n', '{path} defines no get_config()'),
    'raises_later.py': ('def get_config():\n  return 1 / 0\n', 'get_config() raised ZeroDivisionError: division by zero'),
    'wrong_type.py': ("def get_config():\n  return {'seed': 0}\n", 'get_config() returned a dict; valid: an '
                                                                     'ml_collections.ConfigDict'),
}


def _train_cli(argv, devices=8):
  """The real command line in a subprocess: (exit code, non-empty stderr lines)."""
  result = command_server.run([sys.executable, '-m', 'experiments.train', *argv], cwd=ROOT,
                              env=subprocess_environment(devices),
                              capture_output=True, text=True, timeout=300)
  return result.returncode, [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize('arguments,expected', BAD_COMMAND_LINES, ids=[' '.join(a) for a, _ in BAD_COMMAND_LINES])
def test_a_bad_command_line_exits_with_one_line_and_writes_nothing(tmp_path, arguments, expected):
  workdir = tmp_path / 'run'
  code, lines = _train_cli(['--config=configs/smoke.py', f'--workdir={workdir}', *arguments])
  assert code == 2
  assert len(lines) == 1 and lines[0].startswith('error: '), lines
  assert expected in lines[0], lines[0]
  assert not workdir.exists()


@pytest.mark.parametrize('name', sorted(CONFIG_FILES))
def test_a_config_file_that_cannot_give_a_config_is_one_line(tmp_path, name):
  text, expected = CONFIG_FILES[name]
  path = tmp_path / name
  path.write_text(text)
  for extra in ([], ['--config.train.steps=3']):  # with an override, ml_collections loads the file while parsing
    code, lines = _train_cli([f'--config={path}', f'--workdir={tmp_path / "run"}', *extra])
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith('error: --config: ') and expected.format(path=path) in lines[0], lines[0]
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_a_workdir_that_cannot_be_created_is_one_line(tmp_path):
  too_long = tmp_path / ('x' * 300)
  code, lines = _train_cli(['--config=configs/smoke.py', f'--workdir={too_long}'])
  assert code == 2 and len(lines) == 1, lines
  assert lines[0].startswith(f"error: workdir: got '{too_long}'; cannot create or write it: File name too long")
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
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


SCHEDULE = {'train.checkpoint_every': 5, 'train.keep_checkpoints': 3}


@pytest.fixture(scope='module')
def trained_runs(tmp_path_factory):
  """Trained once per module (and test worker): an uninterrupted 20-step run and one stopped at 15,
  checkpoints every 5, three kept. The tests damage copies."""
  root = tmp_path_factory.mktemp('trained')
  trainer.run(smoke_experiment(**SCHEDULE), str(root / 'whole'))
  trainer.run(smoke_experiment(**SCHEDULE, **{'train.steps': 15}), str(root / 'stopped-15'))
  return root


def _checkpointed_runs(tmp_path, trained_runs, steps=15):
  """Copies, in this test's folder, of the uninterrupted run (whole) and of one stopped at `steps`, 15 or
  20 (a copy of the uninterrupted run: the same configuration), to be damaged; and their schedule."""
  shutil.copytree(trained_runs / 'whole', tmp_path / 'whole')
  run = tmp_path / 'damaged'
  shutil.copytree(trained_runs / {15: 'stopped-15', 20: 'whole'}[steps], run)
  return run, SCHEDULE


def _assert_metrics_of_the_whole_run(tmp_path, run):
  assert without_wall_clock(read_metrics(str(run))) == without_wall_clock(read_metrics(str(tmp_path / 'whole')))


@pytest.mark.slow
def test_corrupt_or_incomplete_checkpoint_resumes_from_the_last_good_one(tmp_path, trained_runs):
  run, schedule = _checkpointed_runs(tmp_path, trained_runs)
  assert sorted(os.listdir(run / 'checkpoints')) == ['10', '15', '5']
  for victim in glob.glob(str(run / 'checkpoints' / '15' / '**' / 'd' / '*'), recursive=True)[:1]:
    os.remove(victim)  # damaged: a data file of the newest checkpoint is gone
  shutil.copytree(run / 'checkpoints' / '10', run / 'checkpoints' / '20.orbax-checkpoint-tmp-1')  # a cut save
  trainer.run(smoke_experiment(**schedule), str(run))
  assert os.listdir(run / 'checkpoints.unreadable')[0].startswith('15-')  # set aside, not deleted
  _assert_metrics_of_the_whole_run(tmp_path, run)


@pytest.mark.slow
def test_a_flipped_byte_in_a_checkpoint_is_caught_by_its_digest(tmp_path, caplog, trained_runs):
  run, schedule = _checkpointed_runs(tmp_path, trained_runs)
  files = [p for p in glob.glob(str(run / 'checkpoints' / '15' / '**' / '*'), recursive=True) if os.path.isfile(p)]
  victim = max(files, key=os.path.getsize)  # the largest data file: parameters or optimiser moments
  data = bytearray(pathlib.Path(victim).read_bytes())
  data[len(data) // 2] ^= 0x01
  pathlib.Path(victim).write_bytes(bytes(data))
  trainer.run(smoke_experiment(**schedule), str(run))
  warning = next(r.getMessage() for r in caplog.records if 'checkpoint at step 15 cannot be used' in r.getMessage())
  assert 'its bytes changed since it was written: default/' in warning
  aside = sorted(os.listdir(run / 'checkpoints.unreadable'))
  assert aside[0].startswith('15-') and aside[1].endswith('.digest.json')  # the checkpoint and its digest, kept
  _assert_metrics_of_the_whole_run(tmp_path, run)


@pytest.mark.slow
def test_the_analysis_commands_refuse_a_checkpoint_whose_bytes_changed(tmp_path, trained_runs):
  run, _ = _checkpointed_runs(tmp_path, trained_runs)
  checkpoints.load_run(str(run))  # intact: loads
  victim = max((p for p in glob.glob(str(run / 'checkpoints' / '15' / '**' / '*'), recursive=True)
                if os.path.isfile(p)), key=os.path.getsize)
  with open(victim, 'r+b') as file:
    file.seek(os.path.getsize(victim) // 2)
    byte = file.read(1)
    file.seek(-1, os.SEEK_CUR)
    file.write(bytes([byte[0] ^ 0x80]))
  with pytest.raises(ValueError, match=r'checkpoints/15: its bytes changed since it was written \(default/'):
    checkpoints.load_run(str(run))


@pytest.mark.slow
def test_metrics_damaged_before_their_last_line_are_refused_and_left_alone(tmp_path, trained_runs):
  run, schedule = _checkpointed_runs(tmp_path, trained_runs)
  lines = (run / 'metrics.jsonl').read_text().splitlines(keepends=True)
  lines[1] = '{"step": 10, "spl\n'
  (run / 'metrics.jsonl').write_text(''.join(lines))
  before = _fingerprint(run)
  with pytest.raises(MetricsDamaged, match=r'metrics.jsonl: line 2 is not a JSON record .* move the run aside'):
    trainer.run(smoke_experiment(**schedule), str(run))
  assert {k: v for k, v in _fingerprint(run).items() if not k.endswith('.lock')} == {
      k: v for k, v in before.items() if not k.endswith('.lock')}


@pytest.mark.slow
def test_a_damaged_checkpoint_without_a_digest_is_set_aside_quietly(tmp_path, capfd, trained_runs):
  """Checkpoints written before digests: orbax's failing restore is the check, and the dozens of 'Event
  loop is closed' tracebacks its in-flight reads used to print are gone."""
  run, schedule = _checkpointed_runs(tmp_path, trained_runs)
  shutil.rmtree(run / 'checkpoints.digests')
  for victim in glob.glob(str(run / 'checkpoints' / '15' / 'default' / '**' / 'd' / '*'), recursive=True):
    os.remove(victim)
  capfd.readouterr()
  trainer.run(smoke_experiment(**schedule), str(run))
  assert os.listdir(run / 'checkpoints.unreadable')[0].startswith('15-')
  _assert_metrics_of_the_whole_run(tmp_path, run)
  assert 'Event loop is closed' not in capfd.readouterr().err


@pytest.mark.slow
def test_a_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path, caplog, trained_runs):
  """Killed in the middle of writing a record after its last checkpoint (step 15)."""
  caplog.set_level(logging.INFO)
  run, schedule = _checkpointed_runs(tmp_path, trained_runs, steps=20)
  (run / 'summary.json').unlink()
  shutil.rmtree(run / 'checkpoints' / '20')  # as if killed before the final checkpoint
  text = (run / 'metrics.jsonl').read_text()
  (run / 'metrics.jsonl').write_text(text[:-len(text.splitlines()[-1]) // 2 - 1])  # half the last record
  trainer.run(smoke_experiment(**schedule), str(run))
  assert any('dropped a torn last line' in r.getMessage() for r in caplog.records)
  assert any('resuming from the checkpoint at step 15' in r.getMessage() for r in caplog.records)
  _assert_metrics_of_the_whole_run(tmp_path, run)


@pytest.mark.slow
def test_metrics_cut_below_what_a_checkpoint_covers_resume_from_one_they_cover(tmp_path, caplog, trained_runs):
  """A tail lost below the newest checkpoint (a power loss without fsync would do it): that checkpoint
  cannot be resumed without losing records, so an older one that the file still covers is used."""
  caplog.set_level(logging.INFO)
  run, schedule = _checkpointed_runs(tmp_path, trained_runs)
  lines = (run / 'metrics.jsonl').read_text().splitlines(keepends=True)
  first_after_step_10 = next(i for i, line in enumerate(lines) if json.loads(line)['step'] > 10)
  (run / 'metrics.jsonl').write_text(''.join(lines[:first_after_step_10]) + lines[first_after_step_10][:7])
  trainer.run(smoke_experiment(**schedule), str(run))
  messages = [r.getMessage() for r in caplog.records]
  assert any('checkpoint at step 15 cannot be used (metrics.jsonl holds' in m for m in messages), messages
  assert any('resuming from the checkpoint at step 10' in m for m in messages)
  _assert_metrics_of_the_whole_run(tmp_path, run)


@pytest.mark.slow
def test_the_metrics_a_checkpoint_covers_are_fsynced_before_it_is_written(tmp_path, monkeypatch):
  """Every record up to its step but that step's evaluation, which follows the checkpoint and which it says
  follows."""
  events = []
  real_fsync, real_save = os.fsync, checkpoints.Checkpoints.save

  def fsync(descriptor):
    events.append(('fsync', os.path.basename(os.readlink(f'/proc/self/fd/{descriptor}'))))
    return real_fsync(descriptor)

  def save(self, step, host_state, covers=None):
    events.append(('checkpoint', step, covers['records'], covers.get('evaluation_follows')))
    return real_save(self, step, host_state, covers)

  monkeypatch.setattr(os, 'fsync', fsync)
  monkeypatch.setattr(checkpoints.Checkpoints, 'save', save)
  trainer.run(smoke_experiment(), str(tmp_path))
  saves = [i for i, event in enumerate(events) if event[0] == 'checkpoint']
  assert [events[i][1] for i in saves] == [10, 20]
  records = read_metrics(str(tmp_path))
  for index in saves:  # steps 10 and 20 are evaluation steps too: each checkpoint comes before its evaluation
    assert events[index - 1] == ('fsync', 'metrics.jsonl')
    _, step, covered, evaluation_follows = events[index]
    assert covered == len([r for r in records if r['step'] < step or (r['step'] == step and r['split'] == 'train')])
    assert evaluation_follows is True


@pytest.mark.slow
def test_a_checkpoint_of_other_shapes_fails_clearly_and_is_left_untouched(tmp_path):
  """The shapes check stays as a last line behind the run's identity: here config.json is made to agree
  with a config of another width, so only the checkpoint itself can tell."""
  trainer.run(smoke_experiment(), str(tmp_path))
  other = smoke_experiment(**{'model.model_dim': 48, 'train.steps': 30})
  (tmp_path / 'config.json').write_text(json.dumps(settings.to_dict(other)))
  (tmp_path / 'summary.json').unlink()
  before = _fingerprint(tmp_path / 'checkpoints')
  with pytest.raises(CheckpointMismatch, match=r"\['params'\]\S* has shape \(\S*32,?\) there and \(\S*48,?\) here"):
    trainer.run(other, str(tmp_path))
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


_environment = subprocess_environment


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


@pytest.mark.slow
def test_kill_9_then_restart_ends_with_the_metrics_of_an_uninterrupted_run(tmp_path):
  whole = command_server.run(_command(tmp_path / 'whole'), cwd=ROOT, env=_environment(), capture_output=True, text=True,
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
  restarted = command_server.run(_command(run), cwd=ROOT, env=_environment(), capture_output=True, text=True,
                                 timeout=600)
  assert restarted.returncode == 0, restarted.stderr[-2000:]
  resumed_from = int(restarted.stderr.split('resuming from the checkpoint at step ')[1].split()[0])
  assert logged - 10 <= resumed_from <= logged  # at most the work since the last checkpoint is lost
  assert without_wall_clock(read_metrics(str(run))) == without_wall_clock(read_metrics(str(tmp_path / 'whole')))


@pytest.mark.slow
def test_a_second_run_on_the_same_workdir_refuses(tmp_path):
  run = tmp_path / 'run'
  first = subprocess.Popen(_command(run, '--config.train.steps=100000'), cwd=ROOT, env=_environment(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    _wait_for_lines(run / 'metrics.jsonl', 2)
    config_before = (run / 'config.json').read_bytes()
    second = command_server.run(_command(run), cwd=ROOT, env=_environment(), capture_output=True, text=True,
                                timeout=300)
    assert second.returncode == 2
    assert second.stderr.startswith('error: workdir') and 'is in use by a running job (pid ' in second.stderr
    assert second.stderr.count('\n') == 1
    assert (run / 'config.json').read_bytes() == config_before
  finally:
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=120)
  assert first.returncode == 0


@pytest.mark.slow
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
