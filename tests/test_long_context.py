"""Long-context evaluation (experiments/evaluation/windows.py, long_context.py, experiments/evaluate.py) and
fine-tuning from a finished run (train.init_from)."""

import json
import os
import pathlib
import sys

import numpy as np
import pytest

from experiments.runs import checkpoints, trainer
from experiments.evaluation import long_context, rope_scaling, windows
from tests import command_server
from tests.helpers import ROOT, smoke_experiment, subprocess_environment

TINY_SHAKESPEARE = {'task.name': 'shakespeare', 'task.model_kind': 'decoder_only', 'task.max_length': 16,
                    'task.eval_lengths': (16,), 'model.position.kind': 'rope', 'model.num_decoder_layers': 1,
                    'model.attention_block_size': 8, 'train.steps': 6, 'train.eval_every': 6,
                    'train.checkpoint_every': 6, 'train.log_every': 3}


@pytest.mark.parametrize('num_tokens, length, stride', [(100, 16, 8), (100, 16, 5), (97, 16, 15), (64, 16, 3),
                                                        (16, 16, 4), (1000, 128, 32)])
def test_sliding_windows_score_every_token_once_with_context(num_tokens, length, stride):
  scored = np.zeros(num_tokens, int)
  plan = windows.plan(num_tokens, length, 'sliding', stride)
  for index, window in enumerate(plan):
    assert 0 <= window.start and window.start + length <= num_tokens
    scored[window.start + window.first_scored:window.start + length] += 1
    if index:
      assert window.first_scored >= length - stride  # context inside the window for every scored token
  assert scored[0] == 0 and np.all(scored[1:] == 1)


def test_non_overlapping_windows_skip_only_each_windows_first_token():
  plan = windows.plan(70, 16, 'windows')
  assert [w.start for w in plan] == [0, 16, 32, 48] and all(w.first_scored == 1 for w in plan)
  batch = windows.window_batch(np.arange(70), plan, 16, bos=99)
  np.testing.assert_array_equal(batch['inputs'][1], [99] + list(range(16, 31)))
  np.testing.assert_array_equal(batch['targets'][1], list(range(16, 32)))
  assert batch['scored'].sum() == 4 * 15


@pytest.mark.parametrize('call, message', [(lambda: windows.plan(100, 16, 'sliding', 0), '--stride'),
                                           (lambda: windows.plan(100, 16, 'sliding', 16), '--stride'),
                                           (lambda: windows.plan(10, 16, 'windows'), '--lengths'),
                                           (lambda: windows.plan(100, 16, 'strided'), '--protocol')])
def test_bad_window_requests_are_refused_naming_the_flag(call, message):
  with pytest.raises(ValueError, match=message):
    call()


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('runs') / 'rope')
  trainer.run(smoke_experiment(**TINY_SHAKESPEARE), workdir)
  return workdir


def _request(method='none', factor=1.0, **changes):
  fields = dict(method=method, factor=factor, protocol='sliding', stride_fraction=0.5, tokens=600, batch_size=4)
  fields.update(changes)
  return long_context.Request(**fields)


@pytest.mark.slow
def test_evaluation_goes_next_to_the_run_and_is_never_rewritten(tiny_run):
  with open(os.path.join(tiny_run, 'metrics.jsonl'), 'rb') as file:
    metrics_before = file.read()
  directory, results = long_context.evaluate_run(tiny_run, [16, 64], _request('yarn', 4.0), log=lambda line: None)
  assert directory == os.path.join(tiny_run, 'evaluations', 'yarn-x4-sliding0.5-600')
  assert set(results) == {16, 64} and all(np.isfinite(r['bits_per_character']) for r in results.values())
  assert results[64]['scored_tokens'] == 599 and len(results[64]['bits_by_position']) == 63
  with open(os.path.join(directory, 'evaluation.json')) as file:
    spec = json.load(file)
  assert spec['original_length'] == 16 and spec['position']['extension_factor'] == 4.0
  with open(os.path.join(tiny_run, 'metrics.jsonl'), 'rb') as file:
    assert file.read() == metrics_before
  with open(os.path.join(directory, 'results.jsonl')) as file:
    written = file.read()
  _, again = long_context.evaluate_run(tiny_run, [16, 64], _request('yarn', 4.0), log=lambda line: None)
  assert again == results
  with open(os.path.join(directory, 'results.jsonl')) as file:
    assert file.read() == written
  with pytest.raises(ValueError, match='records another evaluation.*factor'):
    long_context.evaluate_run(tiny_run, [16], _request('yarn', 8.0), name='yarn-x4-sliding0.5-600')
  from experiments.shared.files import Busy, exclusive_lock  # pylint: disable=g-import-not-at-top
  with exclusive_lock(os.path.join(directory, long_context.LOCK_FILE), 'the test'):  # a second evaluate of it
    with pytest.raises(Busy, match=r'is in use by a running job \(pid '):
      long_context.evaluate_run(tiny_run, [16, 32, 64], _request('yarn', 4.0), log=lambda line: None)
  with open(os.path.join(directory, 'results.jsonl')) as file:
    assert file.read() == written


@pytest.mark.slow
def test_factor_one_and_the_run_as_trained_give_the_same_numbers(tiny_run):
  _, plain = long_context.evaluate_run(tiny_run, [32], _request(), log=lambda line: None)
  _, pi_one = long_context.evaluate_run(tiny_run, [32], _request('pi', 1.0), name='pi-one', log=lambda line: None)
  assert plain[32]['bits_per_character'] == pi_one[32]['bits_per_character']


@pytest.mark.slow
def test_longrope_reads_its_factors_from_a_hugging_face_config(tiny_run, tmp_path):
  """evaluate --extension=longrope --factor=2 --rope_scaling=config.json: factors of one and an attention
  factor of one give the run as trained; other long factors other numbers, in a directory named by the
  factors' hash; --rope_scaling without longrope is refused in one line."""
  with open(os.path.join(tiny_run, 'config.json')) as file:
    model = json.load(file)['model']
  pairs = model['model_dim'] // model['num_heads'] // 2

  def config_file(name, long_factor):
    path = tmp_path / name
    path.write_text(json.dumps({'rope_scaling': {'rope_type': 'longrope', 'short_factor': [1.0] * pairs,
                                                 'long_factor': long_factor, 'attention_factor': 1.0}}))
    return str(path)
  _, plain = long_context.evaluate_run(tiny_run, [32], _request(), log=lambda line: None)
  ones = rope_scaling.longrope_overrides(config_file('ones.json', [1.0] * pairs))
  _, same = long_context.evaluate_run(tiny_run, [32], _request('longrope', 2.0, position_overrides=ones),
                                      log=lambda line: None)
  assert same[32]['bits_per_character'] == plain[32]['bits_per_character']
  rescaled = rope_scaling.longrope_overrides(config_file('rescaled.json', [1.0 + p for p in range(pairs)]))
  directory, other = long_context.evaluate_run(tiny_run, [32], _request('longrope', 2.0, position_overrides=rescaled),
                                               log=lambda line: None)
  assert other[32]['bits_per_character'] != plain[32]['bits_per_character']
  assert '-longrope_long_factorssha' in os.path.basename(directory)
  refused = command_server.run([sys.executable, '-m', 'experiments.evaluate', f'--workdir={tiny_run}', '--lengths=32',
                                '--extension=yarn', '--factor=2',
                                f'--rope_scaling={config_file("x.json", [1.0] * pairs)}'],
                               env=subprocess_environment(), capture_output=True, text=True, cwd=ROOT, check=False)
  assert refused.returncode == 2 and '--rope_scaling: got' in refused.stderr and 'valid: with --extension=longrope' in (
      refused.stderr)


@pytest.mark.slow
def test_an_extension_on_a_variant_without_rotation_is_refused(tmp_path):
  workdir = str(tmp_path / 'alibi')
  trainer.run(smoke_experiment(**dict(TINY_SHAKESPEARE, **{'model.position.kind': 'alibi'})), workdir)
  with pytest.raises(ValueError, match='--extension.*alibi run'):
    long_context.evaluate_run(workdir, [16], _request('ntk', 2.0))


@pytest.mark.slow
def test_fine_tuning_starts_from_the_runs_parameters_and_records_it(tiny_run, tmp_path):
  workdir = str(tmp_path / 'fine-tuned')
  _, _, parent_params, parent_step = checkpoints.load_run_with_step(tiny_run)
  longer = dict(TINY_SHAKESPEARE, **{'task.max_length': 32, 'task.eval_lengths': (32,), 'train.init_from': tiny_run,
                                    'model.position.rope_extension': 'pi', 'model.position.extension_factor': 2.0,
                                    'model.position.original_length': 16})
  os.makedirs(tmp_path / 'probe')
  started = checkpoints.initial_params(str(tmp_path / 'probe'), parent_params, tiny_run)
  for got, want in zip(jax_leaves(started), jax_leaves(parent_params)):
    np.testing.assert_array_equal(got, want)
  trainer.run(smoke_experiment(**longer), workdir)
  with open(os.path.join(workdir, 'init_from.json')) as file:
    assert json.load(file)['step'] == parent_step
  _, _, tuned_params, _ = checkpoints.load_run_with_step(workdir)
  assert any(not np.array_equal(a, b) for a, b in zip(jax_leaves(tuned_params), jax_leaves(parent_params)))
  wider = dict(longer, **{'model.model_dim': 64})
  with pytest.raises(checkpoints.CheckpointMismatch, match='shape'):
    trainer.run(smoke_experiment(**wider), str(tmp_path / 'wider'))


def jax_leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


@pytest.mark.slow
def test_the_command_writes_one_table_over_runs_and_methods(tiny_run, tmp_path):
  output = tmp_path / 'table'
  command = [sys.executable, '-m', 'experiments.evaluate', f'--workdir={tiny_run}', '--lengths=16,32',
             '--extension=none,ntk,dynamic_ntk', '--factor=2', '--tokens=300', f'--output={output}']
  done = command_server.run(command, env=subprocess_environment(), capture_output=True, text=True, cwd=ROOT,
                            check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  table = (output / 'results.md').read_text()
  assert all(label in table for label in ('| rope | 1 |', '| rope + ntk x2 | 1 |', '| rope + dynamic_ntk | 1 |'))
  assert (output / 'plot_extension.png').stat().st_size > 0
  assert '| run | 1-15 | 16-31 |' in (output / 'by_position.md').read_text()  # trained at 16, windows of 32
  own = pathlib.Path(tiny_run) / 'evaluations' / 'ntk-x2-sliding0.5-300'
  assert '| rope + ntk x2 | 1 |' in (own / 'results.md').read_text() and (own / 'plot_extension.png').exists()
  evaluations = os.path.join(tiny_run, 'evaluations')
  collected = tmp_path / 'collected'
  collect = [sys.executable, '-m', 'experiments.evaluate', '--lengths=32', f'--output={collected}',
             f'--collect={evaluations}/ntk-x2-sliding0.5-300,{evaluations}/none-sliding0.5-300']
  done = command_server.run(collect, env=subprocess_environment(), capture_output=True, text=True, cwd=ROOT,
                            check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  rows = (collected / 'results.csv').read_text().splitlines()
  assert rows[0] == 'run,seed,32,evaluation' and [row.split(',')[:2] for row in rows[1:]] == [['rope + ntk x2', '0'],
                                                                                               ['rope', '0']]
  assert ',' + rows[1].split(',')[2] + ',' in (output / 'results.csv').read_text()  # read back, not recomputed
  missing_length = command_server.run(collect[:3] + ['--lengths=4096'] + collect[4:], env=subprocess_environment(),
                                      capture_output=True, text=True, cwd=ROOT, check=False)
  assert missing_length.returncode != 0 and 'no result at lengths [4096]' in missing_length.stderr
  missing_factor = command_server.run(command[:5] + ['--extension=yarn'], env=subprocess_environment(),
                                      capture_output=True, text=True, cwd=ROOT, check=False)
  assert missing_factor.returncode != 0 and '--factor: missing' in missing_factor.stderr


def test_position_overrides_parse_to_numbers_and_words():
  assert long_context.parse_position('interpolation_factor=4, temperature_floor=128,kind_of=x') == (
      ('interpolation_factor', 4), ('temperature_floor', 128), ('kind_of', 'x'))
  with pytest.raises(ValueError, match='--position'):
    long_context.parse_position('interpolation_factor')


@pytest.mark.slow
def test_another_variants_analogue_is_set_at_evaluation(tmp_path):
  """A sinusoidal run read at pos / 2: its own directory, other numbers; a setting its variant lacks is refused."""
  workdir = str(tmp_path / 'sinusoidal')
  trainer.run(smoke_experiment(**dict(TINY_SHAKESPEARE, **{'model.position.kind': 'sinusoidal'})), workdir)
  _, plain = long_context.evaluate_run(workdir, [32], _request(), log=lambda line: None)
  directory, interpolated = long_context.evaluate_run(
      workdir, [32], _request(position_overrides=(('interpolation_factor', 2),)), log=lambda line: None)
  assert directory.endswith('none-interpolation_factor2-sliding0.5-600')
  assert interpolated[32]['bits_per_character'] != plain[32]['bits_per_character']
  with pytest.raises(ValueError, match='rope_base.*not a setting of sinusoidal'):
    long_context.evaluate_run(workdir, [32], _request(position_overrides=(('rope_base', 500.0),)))


def test_position_bands_run_to_the_training_length_then_double():
  assert long_context.position_bands(2048, 128) == [(1, 128), (128, 256), (256, 512), (512, 1024), (1024, 2048)]
  assert long_context.position_bands(100, 128) == [(1, 100)]


@pytest.mark.slow
def test_a_missing_source_to_fine_tune_from_is_refused_before_the_run_is_created(tmp_path):
  workdir = tmp_path / 'tuned'
  done = command_server.run([sys.executable, '-m', 'experiments.train', '--config=configs/smoke.py',
                             f'--workdir={workdir}',
                             f'--config.train.init_from={tmp_path / "no-such-run"}'], env=subprocess_environment(),
                            capture_output=True, text=True, cwd=ROOT, check=False)
  assert done.returncode != 0 and 'train.init_from' in done.stderr and 'no checkpoints directory' in done.stderr
  assert not workdir.exists()


@pytest.mark.parametrize('chunk_bytes', [4 * 2 * 37 * 5, 4 * 2 * 37 * 7, 1 << 28])
def test_the_logits_formed_a_chunk_of_positions_at_a_time_give_one_passs_bits(monkeypatch, chunk_bytes):
  """Chunks of 5 and 7 positions (24 is no multiple of 7: the last chunk is padded) and one chunk: the bits of the
  whole logits' log-softmax, a naive pass beside."""
  import jax  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(long_context, 'LOGITS_CHUNK_BYTES', chunk_bytes)
  config = transformer.tiny_preset(transformer.PositionConfig('rope'), vocab_size=37)
  model = transformer.DecoderOnly(config)
  inputs = np.random.default_rng(0).integers(0, 37, size=(2, 24))
  targets = np.roll(inputs, -1, axis=1)
  params = model.init(jax.random.PRNGKey(0), inputs)['params']
  got = np.asarray(long_context.bits_function(model)(params, inputs, targets, {}))
  logits = np.asarray(model.apply({'params': params}, inputs), np.float64)
  log_probabilities = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
      logits.max(-1, keepdims=True)
  expected = -np.take_along_axis(log_probabilities, targets[..., None], -1)[..., 0] / np.log(2.0)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_stream_scored_through_streamingllms_cache(tiny_run):
  """--protocol=streaming: with a cache as long as the stream, the bits of the one window the 'windows' protocol
  reads over the same tokens; with a shorter one (4 sinks, 16 slots) other bits, in a directory of its own whose
  name and record say the sinks and the slots; a cache no larger than its sinks refused."""
  length = 64
  _, whole = long_context.evaluate_run(tiny_run, [length], _request(protocol='windows', tokens=length),
                                       log=lambda line: None)
  _, streamed = long_context.evaluate_run(tiny_run, [length], _request(protocol='streaming', tokens=length,
                                                                       sink_tokens=4, cache_size=length),
                                          log=lambda line: None)
  np.testing.assert_allclose(streamed[length]['bits_per_character'], whole[length]['bits_per_character'], rtol=1e-5)
  np.testing.assert_allclose(streamed[length]['bits_by_position'], whole[length]['bits_by_position'], atol=1e-4)
  directory, short = long_context.evaluate_run(tiny_run, [length], _request(protocol='streaming', tokens=length,
                                                                            sink_tokens=4, cache_size=16),
                                               log=lambda line: None)
  assert directory.endswith('none-streaming-s4-c16-64')
  np.testing.assert_allclose(short[length]['bits_by_position'][:15], streamed[length]['bits_by_position'][:15],
                             atol=1e-4)  # the cache not yet full
  assert short[length]['bits_per_character'] != streamed[length]['bits_per_character']
  with open(os.path.join(directory, 'evaluation.json')) as file:
    recorded = json.load(file)
  assert (recorded['protocol'], recorded['sink_tokens'], recorded['cache_size']) == ('streaming', 4, 16)
  assert 'stride_fraction' not in recorded
  with pytest.raises(ValueError, match=r'--sink_tokens, --cache_size: got 4 and 4; valid: 0 <= sink tokens < cache'):
    long_context.prepare_evaluation(tiny_run, [length], _request(protocol='streaming', tokens=length, sink_tokens=4,
                                                                 cache_size=4))


def test_an_extension_stretches_the_layers_it_is_asked_to():
  """Gemma 3's layout (RoPE 1e6 in the full layers, 1e4 in the sliding ones): --extension_layers=global stretches
  model.position alone, local the local layers' alone, all both; a run whose local layers share model.position gets
  a local position of its own, unstretched, for global; layers with no rotation to stretch are refused."""
  import transformer  # pylint: disable=import-outside-toplevel
  gemma = transformer.tiny_preset(transformer.PositionConfig('rope', rope_base=1e6), num_encoder_layers=0,
                                  layer_types='sliding,full', sliding_window=4,
                                  local_position=transformer.PositionConfig('rope', rope_base=1e4))
  stretched = lambda config, layers: long_context.extended_config(
      config, 64, _request('yarn', 4.0, extension_layers=layers))[0]
  extension = lambda position: position.settings.rope_extension
  for layers, expected in (('global', ('yarn', 'none')), ('local', ('none', 'yarn')), ('all', ('yarn', 'yarn'))):
    config = stretched(gemma, layers)
    assert (extension(config.position), extension(config.local_position)) == expected, layers
    assert (config.position.settings.rope_base, config.local_position.settings.rope_base) == (1e6, 1e4)
  shared = gemma.replace(local_position=None)
  assert stretched(shared, 'all').local_position is None and extension(stretched(shared, 'all').position) == 'yarn'
  for layers, expected in (('global', ('yarn', 'none')), ('local', ('none', 'yarn'))):
    split = stretched(shared, layers)
    assert (extension(split.position), extension(split.local_position)) == expected
  command_a = gemma.replace(position=transformer.PositionConfig('none'))
  assert extension(stretched(command_a, 'all').local_position) == 'yarn'
  with pytest.raises(ValueError, match=r"--extension: got 'yarn' for a none run \(--extension_layers=global\)"):
    stretched(command_a, 'global')
  assert long_context.default_name(_request('yarn', 4.0, extension_layers='global')) == 'yarn-x4-global-sliding0.5-600'


def test_an_extension_of_the_global_layers_is_named_and_labelled_apart_from_all_layers():
  """A probe or evaluation that stretched the global layers only never shares a directory or a table row with one
  that stretched all layers: the names, the probes' records and the rows' labels say which."""
  from experiments.evaluation import lineage, probes  # pylint: disable=import-outside-toplevel
  probe = probes.ProbeRequest(lengths=(64,), depths=(0.5,), trials=2)
  every, global_only = _request('yarn', 4.0), _request('yarn', 4.0, extension_layers='global')
  assert probes.default_name(every, probe) == 'passkey-yarn-x4-heldout-2'
  assert probes.default_name(global_only, probe) == 'passkey-yarn-x4-global-heldout-2'
  configuration = {'model.position.kind': 'rope'}
  labels = [lineage.label(configuration, 'yarn', 4.0, long_context.label_overrides(description))
            for description in ({}, {'extension_layers': 'global', 'corpus_name': 'shipped'})]
  assert labels == ['rope + yarn x4', 'rope + yarn x4 + extension_layers=global + corpus=shipped']
