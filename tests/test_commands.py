"""Every command refuses bad input before it writes, reads a finished run as it was trained, and never
replaces a good result (docs/robustness.md)."""

import glob
import json
import os
import pathlib
import re
import shutil
import sys

import numpy as np
import pytest

import transformer
from experiments import rank
from experiments.runs import checkpoints, preflight, run_record, settings, trainer
from experiments.evaluation import long_context
from experiments.runs.metrics import read_metrics, without_wall_clock
from experiments.shared import cli
from experiments.sweeps import ranking
from tests import command_server
from tests.helpers import ROOT, smoke_experiment, subprocess_environment

SHAKESPEARE = {'task.name': 'shakespeare', 'task.model_kind': 'decoder_only', 'task.max_length': 16,
               'task.eval_lengths': (16,), 'model.num_decoder_layers': 1, 'model.attention_block_size': 8,
               'train.steps': 4, 'train.eval_every': 4, 'train.checkpoint_every': 4, 'train.log_every': 2}


def command(*arguments, cwd=ROOT):
  """(exit code, stdout, the non-empty lines of stderr) of `python -m ARGUMENTS`."""
  done = command_server.run([sys.executable, '-m', *arguments], env=subprocess_environment(), capture_output=True,
                            text=True, cwd=cwd, check=False, timeout=600)
  return done.returncode, done.stdout, [line for line in done.stderr.splitlines() if line.strip()]


def tree(directory) -> dict:
  """{relative path: bytes} of every file under a directory (but the lock a run takes)."""
  found = {}
  for root, _, names in os.walk(directory):
    for name in names:
      if name != '.lock':
        path = os.path.join(root, name)
        with open(path, 'rb') as file:
          found[os.path.relpath(path, directory)] = file.read()
  return found


@pytest.fixture(scope='module')
def rope_run(tmp_path_factory):
  """A finished tiny Shakespeare run with RoPE."""
  workdir = str(tmp_path_factory.mktemp('runs') / 'rope')
  trainer.run(smoke_experiment(**SHAKESPEARE, **{'model.position.kind': 'rope'}), workdir)
  return workdir


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Finished tiny runs on another core or with a pattern: a copy run on the XLA core, one on the Pallas
  kernel, a Shakespeare pattern by layer with ALiBi in it."""
  base = tmp_path_factory.mktemp('runs')
  made = {'xla': smoke_experiment(**{'model.attention_implementation': 'xla', 'train.steps': 4}),
          'pallas': smoke_experiment(**{'model.attention_implementation': 'pallas', 'model.position.kind': 'alibi',
                                        'train.steps': 2, 'train.eval_every': 2, 'train.checkpoint_every': 2}),
          'pattern': smoke_experiment(**SHAKESPEARE, **{'model.position.kind': 'layer_pattern',
                                                        'model.position.layer_pattern': 'alibi,rope'})}
  for name, experiment in made.items():
    trainer.run(experiment, str(base / name))
  return {name: str(base / name) for name in made}


# Refusals that the library raises while tracing: found before the run writes anything.

@pytest.mark.parametrize('overrides, expected', [
    ({'model.attention_implementation': 'cudnn'}, "got 'cudnn', but cuDNN runs on GPUs and this backend is cpu"),
    ({'model.attention_implementation': 'pallas', 'model.position.kind': 'shaw'}, "got 'pallas', but this call needs "
                                                                                 'the attention weights'),
    ({'model.attention_implementation': 'xla', 'model.attention_dropout_rate': 0.1}, "got 'xla', but this call needs "
                                                                                    'the attention weights'),
    ({'model.attention_implementation': 'blockwise', 'model.attention_block_size': 0}, 'attention_block_size is 0'),
], ids=['cudnn-on-cpu', 'pallas-shaw', 'xla-dropout', 'blockwise-size-0'])
def test_what_tracing_refuses_is_a_configuration_error(overrides, expected):
  with pytest.raises(settings.ConfigError, match='model.attention_implementation: .*' + re.escape(expected)):
    preflight.check(smoke_experiment(**overrides))


def test_a_state_larger_than_a_device_is_refused_before_anything_is_written(tmp_path):
  """A learned table of a billion rows: parameters and Adam's two moments, 4 bytes each, cannot fit this
  machine's memory; found from shapes alone, by the sweep's check and by the trainer before it writes."""
  huge = smoke_experiment(**{'model.position.kind': 'learned', 'model.position.max_length': 10**9})
  table_bytes = 3 * 4 * 10**9 * huge.model.model_dim
  if not table_bytes > preflight.device_memory() > 0:
    pytest.skip(f'this machine reports {preflight.device_memory()} bytes per device: the table would fit')
  with pytest.raises(settings.ConfigError, match=r'^model: one device would hold \d+\.\d GiB \(parameters '):
    preflight.check(huge)
  with pytest.raises(settings.ConfigError, match=r'^model: one device would hold '):
    trainer.run(huge, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_the_train_command_refuses_a_core_before_it_writes_and_the_corrected_command_runs(tmp_path):
  """cuDNN on a CPU is refused by the model's initialisation; the XLA core with attention dropout only by the
  training step (initialisation is deterministic), which the trainer traces before it writes."""
  workdir = tmp_path / 'run'
  for overrides in (['--config.model.attention_implementation=cudnn'],
                    ['--config.model.attention_implementation=xla', '--config.model.attention_dropout_rate=0.1']):
    code, _, lines = command('experiments.train', '--config=configs/smoke.py', f'--workdir={workdir}', *overrides,
                             '--config.train.steps=2')
    assert code == 2 and len(lines) == 1 and lines[0].startswith('error: model.attention_implementation:'), lines
    assert not workdir.exists()
  code, _, lines = command('experiments.train', '--config=configs/smoke.py', f'--workdir={workdir}',
                           '--config.train.steps=2')
  assert code == 0, lines[-3:]


@pytest.mark.parametrize('overrides, expected', [
    ({'model.position.kind': 'fire', 'model.position.fire_threshold': 1e308}, 'position.fire_threshold: got 1e+308'),
    ({'model.position.kind': 'none', 'model.position.temperature_scale': 1e308},  # inf in float32
     'model.position.temperature_scale: got 1e+308; valid: a number float32 holds'),
    ({'model.position.kind': 'xpos', 'model.position.xpos_scale_base': 1e-308},  # 0 in float32
     'model.position.xpos_scale_base: got 1e-308; valid: a number float32 holds'),
    ({'model.position.kind': 'xpos', 'model.position.xpos_scale_base': 0.1},  # zeta^(n / gamma) leaves float32
     'position.xpos_scale_base: got 0.1; valid: at least 1 for positions up to 25'),
    ({'model.position.kind': 'layer_pattern', 'model.position.layer_pattern': 'rope,xpos',
      'model.position.xpos_scale_base': 0.1}, 'position.xpos_scale_base: got 0.1'),
], ids=['fire-threshold', 'temperature-inf', 'xpos-zero', 'xpos-scale', 'xpos-in-a-pattern'])
def test_values_that_cannot_train_are_refused(overrides, expected):
  """Each of these, accepted before, turned the loss NaN within 4 steps."""
  with pytest.raises(settings.ConfigError, match=re.escape(expected)):
    smoke_experiment(**overrides)


def test_xpos_refuses_positions_beyond_its_float32_range():
  settings_ = transformer.PositionConfig('xpos').settings
  settings_.check_positions(55 * 512)
  with pytest.raises(ValueError, match='xpos_scale_base: got 512.0; valid: at least 1192'):
    settings_.check_positions(65535)


# train.init_from: every way the source can fail is a configuration error, before the run exists.

def _fine_tune(source):
  return smoke_experiment(**{'train.init_from': source, 'train.steps': 2})


@pytest.fixture
def copy_run(tmp_path):
  workdir = str(tmp_path / 'source')
  trainer.run(smoke_experiment(**{'train.steps': 2, 'train.checkpoint_every': 2, 'train.eval_every': 2}), workdir)
  return workdir


@pytest.mark.slow
def test_a_source_without_its_record_is_refused(copy_run, tmp_path):
  os.remove(os.path.join(copy_run, 'config.json'))
  with pytest.raises(settings.ConfigError, match='train.init_from: .*which cannot be read: .*config.json: missing'):
    preflight.check_init_from(_fine_tune(copy_run), str(tmp_path / 'tuned'))


@pytest.mark.slow
def test_a_source_whose_checkpoint_changed_is_refused(copy_run, tmp_path):
  victim = max((p for p in glob.glob(os.path.join(copy_run, 'checkpoints', '2', '**', '*'), recursive=True)
                if os.path.isfile(p)), key=os.path.getsize)
  data = bytearray(pathlib.Path(victim).read_bytes())
  data[len(data) // 2] ^= 0x01
  pathlib.Path(victim).write_bytes(bytes(data))
  with pytest.raises(settings.ConfigError, match='train.init_from: .*its bytes changed since it was written'):
    preflight.check_init_from(_fine_tune(copy_run), str(tmp_path / 'tuned'))


@pytest.mark.slow
def test_a_source_trained_on_after_the_fine_tune_started_is_refused(copy_run, tmp_path):
  tuned = tmp_path / 'tuned'
  tuned.mkdir()
  (tuned / checkpoints.INIT_FROM_FILE).write_text(json.dumps(dict(workdir=os.path.abspath(copy_run), step=1,
                                                                  finished_step=None)))
  with pytest.raises(settings.ConfigError, match='now at step 2, but .* started from step 1'):
    preflight.check_init_from(_fine_tune(copy_run), str(tuned))
  preflight.check_init_from(_fine_tune(copy_run), str(tmp_path / 'another'))  # a new workdir may start from it


def test_a_source_of_other_shapes_is_refused(copy_run, tmp_path):
  wider = smoke_experiment(**{'train.init_from': copy_run, 'model.model_dim': 64})
  with pytest.raises(settings.ConfigError, match='train.init_from: .*has shape'):
    preflight.check_init_from(wider, str(tmp_path / 'tuned'))


# Commands that read a finished run build the model the run trained.

@pytest.mark.slow
@pytest.mark.parametrize('name', ['xla', 'pattern'])
def test_analyze_reads_any_run_and_says_when_it_takes_another_core(runs, name):
  code, out, lines = command('experiments.analyze', f'--workdir={runs[name]}')
  assert code == 0, lines[-3:]
  assert ('instead of the run\'s xla' in out) == (name == 'xla')
  pictures = os.listdir(os.path.join(runs[name], 'analysis'))
  assert 'attention_maps.png' in pictures
  assert (name != 'pattern') or 'position_terms_alibi.png' in pictures, pictures


@pytest.mark.slow
def test_exact_match_decodes_a_pallas_run_and_keeps_a_result_it_cannot_replace(runs):
  path = os.path.join(runs['pallas'], 'greedy_exact_match.json')
  code, out, lines = command('experiments.exact_match', f'--workdir={runs["pallas"]}', '--lengths=1-2', '--examples=4')
  assert code == 0, lines[-3:]
  assert "instead of the run's pallas" in out
  first = json.loads(open(path).read())
  assert first['examples'] == 4 and sorted(first['exact_match']) == ['1', '2']
  before = open(path, 'rb').read()
  for arguments, expected in ((['--examples=0'], '--examples=0: 0 is not'), (['--examples=-4'], 'is not'),
                              (['--examples=5'], 'holds 4 examples per size'), (['--lengths=abc'], '--lengths')):
    code, _, lines = command('experiments.exact_match', f'--workdir={runs["pallas"]}', *arguments)
    assert code == 2 and len(lines) == 1 and expected in lines[0], (arguments, lines)
    assert open(path, 'rb').read() == before
  code, _, lines = command('experiments.exact_match', f'--workdir={runs["pallas"]}', '--lengths=1-3', '--examples=4')
  assert code == 0, lines[-3:]
  grown = json.loads(open(path).read())
  assert sorted(grown['exact_match']) == ['1', '2', '3'] and grown['exact_match']['1'] == first['exact_match']['1']


# Flags: a value that cannot be used is one line, exit code 2, and nothing written.

@pytest.mark.slow
@pytest.mark.parametrize('arguments, expected', [
    (['experiments.evaluate', '--workdir={rope}', '--lengths=abc'], "--lengths: got 'abc'"),
    (['experiments.evaluate', '--workdir={rope}', '--position=rope_base=abc'], "--position: got rope_base='abc'"),
    (['experiments.evaluate', '--workdir={rope}', '--extension=pi', '--factor=2', '--position=extension_factor=8'],
     '--position: got extension_factor=8; valid: the extension through --extension and --factor'),
    (['experiments.evaluate', '--workdir={rope}', '--lengths=16,32', '--tokens=20'], '--lengths: 32 is longer than'),
    (['experiments.evaluate', '--workdir={rope}', '--extension=pi', '--factor=inf'],
     '--factor: got inf; valid: a finite number >= 1'),
    (['experiments.evaluate', '--workdir={rope}', '--lengths=16,32,16'], "--lengths: got '16,32,16', which repeats 16"),
    (['experiments.analyze', '--workdir={rope}', '--length=-3'], '--length=-3'),
    (['experiments.benchmark', 'step', '--steps=0'], '--steps=0'),
    (['experiments.benchmark', 'attention', '--repeats=0'], '--repeats=0'),
    (['experiments.benchmark', 'attention', '--length=0'], '--length=0'),
], ids=['lengths', 'position-type', 'position-extension', 'lengths-tokens', 'factor-inf', 'lengths-repeated',
        'analyze-length', 'steps', 'repeats', 'length'])
def test_a_bad_flag_is_one_line_and_writes_nothing(rope_run, arguments, expected, tmp_path):
  before = tree(rope_run)
  code, _, lines = command(*[a.format(rope=rope_run) for a in arguments], cwd=tmp_path)
  assert code == 2 and len(lines) == 1 and lines[0].startswith('error: ') and expected in lines[0], lines
  assert tree(rope_run) == before and not os.listdir(tmp_path)


def test_an_output_path_that_cannot_be_written_is_refused_and_the_probe_leaves_nothing(tmp_path):
  with pytest.raises(cli.CommandError, match='valid: a file in an existing directory'):
    cli.check_output_path('--output', str(tmp_path / 'missing' / 'x.json'))
  if os.path.isdir('/proc'):  # writable by permission bits for root, yet no file can be made there
    with pytest.raises(cli.CommandError, match='valid: a path under a writable directory'):
      cli.check_output_path('--output', '/proc/ranking.md')
  with pytest.raises(cli.CommandError, match='which is a directory'):
    cli.check_output_path('--output', str(tmp_path))
  cli.check_output_path('--output', str(tmp_path / 'x.json'))
  cli.check_output_path('--output', str(tmp_path / 'a' / 'b'), directory=True)
  assert not os.listdir(tmp_path)


# Results files: a torn tail is dropped with a warning, never a reason to fail.

@pytest.mark.slow
def test_a_torn_last_line_of_an_evaluation_is_dropped_and_the_evaluation_goes_on(rope_run):
  request = long_context.Request(method='none', factor=1.0, protocol='windows', stride_fraction=0.5, tokens=400,
                                 batch_size=4)
  directory, first = long_context.evaluate_run(rope_run, [16], request, name='torn', log=lambda line: None)
  results = os.path.join(directory, 'results.jsonl')
  with open(results, 'a') as file:
    file.write('{"length": 32, "bits_per')  # a killed append
  _, both = long_context.evaluate_run(rope_run, [16, 32], request, name='torn', log=lambda line: None)
  assert both[16] == first[16]
  assert [json.loads(line)['length'] for line in open(results)] == [16, 32]


# rank compares rows by the settings they share.

def _finished(workdir, **overrides):
  trainer.run(smoke_experiment(**{'train.steps': 2, 'train.eval_every': 2, 'train.checkpoint_every': 2}, **overrides),
              workdir)


@pytest.mark.slow
def test_rank_reads_a_sweep_of_variants_with_their_own_settings_and_refuses_a_mix(tmp_path):
  sweep = tmp_path / 'sweep'
  for kind in ('rope', 'kerple_log', 'fire'):
    _finished(str(sweep / f'{kind}-seed0'), **{'model.position.kind': kind})
  task, table = rank.read_sweep(str(sweep))
  assert task == 'copy' and table.variants == ['fire', 'kerple_log', 'rope']
  _finished(str(sweep / 'rope-seed1'), **{'model.position.kind': 'rope', 'model.position.rope_base': 500.0, 'seed': 1})
  with pytest.raises(ranking.RankingError, match='differ in model.position.rope_base'):
    rank.read_sweep(str(sweep))


# Seeds in one program resume from the newest step every replica saved.

@pytest.mark.slow
def test_seeds_killed_while_saving_resume_from_the_step_they_all_saved(tmp_path):
  whole = [str(tmp_path / f'whole-{seed}') for seed in (0, 1)]
  trainer.run_seeds(smoke_experiment(), whole)
  cut = [str(tmp_path / f'cut-{seed}') for seed in (0, 1)]
  trainer.run_seeds(smoke_experiment(), cut)
  # As a kill -9 inside the save at step 20 leaves it: seed 0's checkpoint written, seed 1's not, no summary.
  shutil.rmtree(os.path.join(cut[1], 'checkpoints', '20'))
  os.remove(os.path.join(cut[1], 'checkpoints.digests', '20.json'))
  for workdir in cut:
    os.remove(os.path.join(workdir, run_record.SUMMARY_FILE))
  trainer.run_seeds(smoke_experiment(), cut)
  for seed in (0, 1):
    assert without_wall_clock(read_metrics(cut[seed])) == without_wall_clock(read_metrics(whole[seed]))
    assert run_record.is_finished(cut[seed])
  assert os.listdir(os.path.join(cut[0], 'checkpoints.unreadable'))  # seed 0's step 20 moved aside, not deleted
  final = [checkpoints.load_run(w)[2] for w in (cut[1], whole[1])]
  for got, want in zip(*(jax_leaves(p) for p in final)):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def jax_leaves(tree_):
  import jax  # pylint: disable=g-import-not-at-top
  return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree_)]
