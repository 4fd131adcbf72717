"""A run is its configuration: a restart with another one is refused before anything is written, except
the changes run_record.RESUMABLE_FIELDS allows, which are recorded."""

import glob
import hashlib
import json
import os
import pathlib
import shutil
import sys

import pytest

from experiments.runs import run_record, settings, trainer
from experiments.runs.metrics import read_metrics, without_wall_clock
from tests import command_server
from tests.helpers import smoke_experiment, subprocess_environment

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _fingerprint(directory) -> dict:
  """Every file's bytes but the lock's (each run writes its pid there)."""
  return {path: hashlib.sha256(open(path, 'rb').read()).hexdigest()
          for path in glob.glob(f'{directory}/**', recursive=True)
          if os.path.isfile(path) and not path.endswith('.lock')}


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory):
  """configs/smoke.py (20 steps) trained to the end once per module (and test worker); tests change copies."""
  workdir = tmp_path_factory.mktemp('smoke') / 'run'
  trainer.run(smoke_experiment(), str(workdir))
  return workdir


def _copy(run, workdir):
  """A copy of a finished run in workdir (which may exist, empty)."""
  shutil.copytree(run, workdir, dirs_exist_ok=True)


def _unfinished(smoke_run, workdir):
  """A copy of the smoke run stopped after its checkpoint at step 10."""
  _copy(smoke_run, workdir)
  (workdir / 'summary.json').unlink()
  shutil.rmtree(workdir / 'checkpoints' / '20')
  os.remove(workdir / 'checkpoints.digests' / '20.json')


@pytest.mark.slow
def test_resuming_with_another_configuration_is_refused_naming_every_field_and_writing_nothing(tmp_path, smoke_run):
  _unfinished(smoke_run, tmp_path)
  before = _fingerprint(tmp_path)
  with pytest.raises(run_record.RunMismatch) as raised:
    trainer.run(smoke_experiment(seed=7, **{'model.position.kind': 'rope', 'task.name': 'reverse'}), str(tmp_path))
  fields = [line.split(':')[0] for line in raised.value.lines]
  # sinusoidal's setting goes, rope's comes: each run records its own variant's settings
  assert fields == ['model.position.kind', 'model.position.rope_base', 'model.position.sinusoidal_base', 'seed',
                    'task.name']
  assert raised.value.lines[0].startswith(f"model.position.kind: the run in {tmp_path} has 'sinusoidal', this "
                                          f"command asks for 'rope' (this field may not change in a run)")
  assert _fingerprint(tmp_path) == before


@pytest.mark.slow
def test_config_json_is_written_once_and_a_finished_run_takes_no_other_configuration(tmp_path, smoke_run):
  _copy(smoke_run, tmp_path)
  written = (tmp_path / 'config.json').read_bytes()
  before = _fingerprint(tmp_path)
  with pytest.raises(run_record.RunMismatch, match='model.position.kind: .* has .sinusoidal., .* asks for .alibi.'):
    trainer.run(smoke_experiment(**{'model.position.kind': 'alibi'}), str(tmp_path))
  with pytest.raises(run_record.RunMismatch, match=r'model.model_dim: .* has 32, .* asks for 48'):
    trainer.run(smoke_experiment(**{'model.model_dim': 48, 'train.steps': 30}), str(tmp_path))
  assert _fingerprint(tmp_path) == before
  trainer.run(smoke_experiment(**{'train.steps': 30}), str(tmp_path))  # an allowed change
  assert (tmp_path / 'config.json').read_bytes() == written
  assert run_record.stored_config(str(tmp_path))['train']['steps'] == 30


@pytest.mark.slow
def test_a_longer_train_steps_continues_a_finished_run_into_the_longer_run(tmp_path, smoke_run):
  _copy(smoke_run, tmp_path / 'whole')
  trainer.run(smoke_experiment(**{'train.steps': 10}), str(tmp_path / 'extended'))
  assert run_record.is_finished(str(tmp_path / 'extended'))
  trainer.run(smoke_experiment(), str(tmp_path / 'extended'))
  assert without_wall_clock(read_metrics(str(tmp_path / 'extended'))) == without_wall_clock(
      read_metrics(str(tmp_path / 'whole')))
  changes = [json.loads(line) for line in (tmp_path / 'extended' / 'config_changes.jsonl').read_text().splitlines()]
  assert changes == [{'step': 10, 'changes': {'train.steps': [10, 20]}}]
  assert run_record.stored_config(str(tmp_path / 'extended')) == run_record.stored_config(str(tmp_path / 'whole'))
  assert run_record.is_finished(str(tmp_path / 'extended'))


@pytest.mark.slow
@pytest.mark.parametrize('first,then,reason', [
    ({}, {'train.steps': 15}, 'a run is continued to more steps, never shortened'),
    ({'train.schedule': 'warmup_cosine'}, {'train.schedule': 'warmup_cosine', 'train.steps': 30},
     "warmup_cosine's learning rate at every step depends on train.steps"),
    ({}, {'train.log_every': 1}, 'the run finished at step 20; only a longer train.steps continues it'),
    ({}, {'task.eval_lengths': (6, 12, 24)}, 'the run finished at step 20'),
])
def test_changes_that_would_misdescribe_the_run_are_refused(tmp_path, smoke_run, first, then, reason):
  if first:
    trainer.run(smoke_experiment(**first), str(tmp_path))
  else:
    _copy(smoke_run, tmp_path)
  before = _fingerprint(tmp_path)
  with pytest.raises(run_record.RunMismatch) as raised:
    trainer.run(smoke_experiment(**then), str(tmp_path))
  assert len(raised.value.lines) == 1 and reason in raised.value.lines[0], raised.value.lines
  assert _fingerprint(tmp_path) == before


@pytest.mark.slow
def test_resumable_changes_to_an_unfinished_run_are_recorded_with_their_step(tmp_path, smoke_run):
  _unfinished(smoke_run, tmp_path)
  changed = {'train.log_every': 2, 'task.eval_lengths': (6, 12, 24), 'parallel.mode': 'mesh', 'train.eval_microbatches': 2}
  trainer.run(smoke_experiment(**changed), str(tmp_path))
  record = json.loads((tmp_path / 'config_changes.jsonl').read_text())
  assert record == {'step': 10, 'changes': {'parallel.mode': ['pmap', 'mesh'], 'task.eval_lengths': [[6, 12], [6, 12, 24]],
                                            'train.eval_microbatches': [1, 2], 'train.log_every': [5, 2]}}
  stored = run_record.stored_config(str(tmp_path))
  assert stored == run_record.canonical(settings.to_dict(smoke_experiment(**changed)))
  assert run_record.is_finished(str(tmp_path), stored)
  final = [r for r in read_metrics(str(tmp_path)) if r['split'] == 'eval' and r['step'] == 20]
  assert sorted(r['length'] for r in final) == [6, 12, 24]
  assert [r['step'] for r in read_metrics(str(tmp_path)) if r['split'] == 'train'] == [5, 10, 12, 14, 16, 18, 20]


@pytest.mark.slow
def test_a_workdir_with_results_but_no_config_is_refused(tmp_path, smoke_run):
  _copy(smoke_run, tmp_path)
  (tmp_path / 'config.json').unlink()
  with pytest.raises(run_record.RunMismatch, match='holds checkpoints, metrics.jsonl, summary.json but no config.json'):
    trainer.run(smoke_experiment(), str(tmp_path))


@pytest.mark.slow
def test_the_command_line_refuses_with_one_line_per_field_and_exit_code_2(tmp_path):
  environment = subprocess_environment(1)
  command = [sys.executable, '-m', 'experiments.train', '--config=configs/smoke.py', f'--workdir={tmp_path}',
             '--config.train.steps=5']
  assert command_server.run(command, cwd=ROOT, env=environment, capture_output=True, timeout=300).returncode == 0
  before = _fingerprint(tmp_path)
  refused = command_server.run(command + ['--config.model.position.kind=t5', '--config.model.num_heads=4'], cwd=ROOT,
                               env=environment, capture_output=True, text=True, timeout=300)
  assert refused.returncode == 2
  lines = refused.stderr.splitlines()
  # t5's settings come and sinusoidal's go with the kind: each one a line
  assert [line.split(':')[:2] for line in lines] == [['error', f' {field}'] for field in (
      'model.num_heads', 'model.position.kind', 'model.position.max_distance', 'model.position.num_buckets',
      'model.position.shared_across_layers', 'model.position.sinusoidal_base')]
  assert _fingerprint(tmp_path) == before


def test_a_record_from_before_per_variant_settings_reads_as_its_kinds_own(tmp_path):
  """Records written when every run listed every variant's fields: the run is its kind and that
  variant's settings (so it resumes, and loads, under the current code)."""
  record = {'model': {'position': {'kind': 'shaw', 'clip_distance': 3, 'per_head': False, 'rope_base': 10000.0,
                                   'num_buckets': 32, 'max_length': 256}}, 'seed': 0}
  (tmp_path / 'config.json').write_text(json.dumps(record))
  assert run_record.stored_config(str(tmp_path))['model']['position'] == {
      'kind': 'shaw', 'clip_distance': 3, 'per_head': False}


def test_a_record_from_before_a_field_existed_reads_as_the_value_it_ran_with(tmp_path):
  """model.randomized_max_length came after records were written; a run without it ran with 0 (plain
  positions), so it resumes and is reused by a sweep under the current code, while a record that has
  the field keeps its own value."""
  experiment = smoke_experiment()
  requested = settings.to_dict(experiment)
  old = json.loads(json.dumps(requested))
  del old['model']['randomized_max_length']
  (tmp_path / 'config.json').write_text(json.dumps(old))
  assert run_record.differences(run_record.stored_config(str(tmp_path)), requested) == {}
  old['model']['randomized_max_length'] = 64
  (tmp_path / 'config.json').write_text(json.dumps(old))
  assert run_record.differences(run_record.stored_config(str(tmp_path)), requested) == {
      'model.randomized_max_length': (64, 0)}


def test_a_record_from_before_fields_moved_or_changed_type_reads_as_it_ran(tmp_path):
  """parallel was the mode alone ('pmap'), model.remat a bool: such a record reads as parallel.mode and the
  remat policy it ran ('none' for false, 'block' for true), and a change to the old field applies to the new."""
  requested = settings.to_dict(smoke_experiment(**{'model.remat': 'block'}))
  old = json.loads(json.dumps(requested))
  old['parallel'] = 'pmap'
  old['model']['remat'] = True
  (tmp_path / 'config.json').write_text(json.dumps(old))
  assert run_record.differences(run_record.stored_config(str(tmp_path)), requested) == {}
  (tmp_path / 'config_changes.jsonl').write_text(json.dumps({'step': 10, 'changes': {'parallel': ['pmap', 'mesh']}}))
  assert run_record.stored_config(str(tmp_path))['parallel']['mode'] == 'mesh'
  assert run_record.differences(run_record.stored_config(str(tmp_path)), requested) == {
      'parallel.mode': ('mesh', 'pmap')}
