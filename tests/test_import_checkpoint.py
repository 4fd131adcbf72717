"""A pretrained checkpoint imported as a finished run (experiments/import_checkpoint.py): a tiny Llama-layout
Hugging Face folder written here with safetensors' NumPy API (no PyTorch), its tokenizer the shipped corpus's
byte-level BPE, and a corpus prepared with that tokenizer (prepare_corpus --tokenizer=PATH). The run gives the
source's logits through `load_run`, evaluate reads it, and every refusal leaves nothing behind."""

import json
import os
import shutil
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

import transformer as T
from experiments import load_run
from experiments.data import corpus as corpus_format
from experiments.pretrained import hugging_face, llama
from tests import command_server
from tests.helpers import ROOT, subprocess_environment

SHIPPED_TOKENIZER = ROOT / 'experiments' / 'data' / 'corpus' / 'tokenizer.json'
VOCABULARY = 4096  # the shipped BPE's
TEXT = ('It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of '
        'foolishness, it was the epoch of belief, it was the epoch of incredulity. ')


def command(*arguments):
  """(exit code, stdout, stderr's last line) of `python -m ARGUMENTS`."""
  done = command_server.run([sys.executable, '-m', *map(str, arguments)], env=subprocess_environment(),
                            capture_output=True, text=True, cwd=ROOT, check=False, timeout=600)
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  return done.returncode, done.stdout, lines[-1] if lines else ''


def write_llama_folder(folder, vocabulary=VOCABULARY, width=32, heads=4, kv_heads=2, hidden=48, layers=2, seed=0,
                       tokenizer=True, **changes):
  """config.json, model.safetensors (random float32 weights) and, with tokenizer, the shipped BPE's tokenizer.json."""
  config = dict(architectures=['LlamaForCausalLM'], vocab_size=vocabulary, hidden_size=width, intermediate_size=hidden,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=1e-5,
                max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=False, hidden_act='silu',
                **changes)
  model_config = hugging_face.model_config(config)
  rng = np.random.default_rng(seed)
  tensors = {row.name: (rng.normal(size=row.shape) * 0.2 + (1.0 if 'norm' in row.name else 0.0)).astype(np.float32)
             for row in llama.table(model_config)}
  os.makedirs(folder, exist_ok=True)
  save_file(tensors, str(folder / 'model.safetensors'))
  (folder / 'config.json').write_text(json.dumps(config))
  if tokenizer:
    shutil.copy(SHIPPED_TOKENIZER, folder / 'tokenizer.json')
  return folder


@pytest.fixture(scope='module')
def imported(tmp_path_factory):
  """(source folder, corpus, workdir): the tiny folder imported with a corpus of its tokenizer."""
  root = tmp_path_factory.mktemp('imported')
  source = write_llama_folder(root / 'source')
  texts = root / 'texts'
  texts.mkdir()
  for index in range(12):
    (texts / f'doc{index}.txt').write_text(f'Document {index}. ' + TEXT * (2 + index % 3), encoding='utf-8')
  code, _, last = command('experiments.prepare_corpus', f'--input={texts}', f'--output={root / "corpus"}',
                          f'--tokenizer={source / "tokenizer.json"}', '--heldout_fraction=0.3')
  assert code == 0, last
  workdir = root / 'run'
  code, out, last = command('experiments.import_checkpoint', f'--source={source}', f'--corpus={root / "corpus"}',
                            f'--workdir={workdir}')
  assert code == 0, last
  assert 'LlamaForCausalLM' in out and 'tokenizer.json' in out
  return source, root / 'corpus', workdir


def test_a_corpus_prepared_with_a_pretrained_tokenizer_records_it_and_decodes_back(imported):
  source, corpus_directory, _ = imported
  corpus = corpus_format.open_corpus(str(corpus_directory))
  manifest = corpus.manifest
  assert manifest['tokenizer']['pretrained']['path'] == str(source / 'tokenizer.json')
  assert (corpus_directory / 'tokenizer.json').read_text() == corpus.tokenizer.to_str()
  assert corpus.vocab_size == VOCABULARY and corpus.eod == corpus.tokenizer.tokenizer.token_to_id('<|endoftext|>')
  tokens = np.asarray(corpus.tokens('heldout'))
  first = tokens[:np.flatnonzero(tokens == corpus.eod)[0]]
  assert corpus.tokenizer.decode(first).startswith('Document ') and TEXT in corpus.tokenizer.decode(first)


def test_the_imported_run_gives_the_sources_logits_and_tokenizer(imported):
  source, _, workdir = imported
  config, params = hugging_face.load(str(source))
  ids = np.random.default_rng(3).integers(0, VOCABULARY, size=(2, 64))
  expected = np.asarray(T.DecoderOnly(config).apply(params, ids))
  model, variables, tokenizer = load_run(str(workdir))
  np.testing.assert_array_equal(np.asarray(model.apply(variables, ids)), expected)
  assert tokenizer.encode(TEXT).ids == tokenizer.encode(TEXT).ids and tokenizer.get_vocab_size() == VOCABULARY
  record = json.loads((workdir / 'config.json').read_text())
  assert record['source']['architecture'] == 'LlamaForCausalLM' and record['train']['steps'] == 0
  assert sorted(record['source']['files']) == ['config.json', 'model.safetensors', 'tokenizer.json']
  assert record['task']['max_length'] == 64 and record['model']['num_kv_heads'] == 2
  assert json.loads((workdir / 'summary.json').read_text())['step'] == 0


def test_evaluate_reads_the_imported_run_and_refuses_it_once_its_source_changed(imported, tmp_path):
  source, corpus_directory, workdir = imported
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy)
  code, out, last = command('experiments.evaluate', f'--workdir={copy}', '--lengths=16,32', '--tokens=256',
                            '--protocol=windows')
  assert code == 0, last
  assert 'bits per byte' in out
  changed_source = tmp_path / 'source'
  shutil.copytree(source, changed_source)
  record = json.loads((copy / 'config.json').read_text())
  record['source']['path'] = str(changed_source)
  (copy / 'config.json').write_text(json.dumps(record))
  code, _, last = command('experiments.evaluate', f'--workdir={copy}', '--lengths=16', '--tokens=256', '--name=again')
  assert code == 0, last  # the same bytes in another place
  with open(changed_source / 'config.json', 'a', encoding='utf-8') as file:
    file.write(' ')
  code, _, last = command('experiments.evaluate', f'--workdir={copy}', '--lengths=16', '--tokens=256', '--name=third')
  assert code == 2 and 'has changed since it was imported' in last and 'config.json' in last, last
  assert not (copy / 'evaluations' / 'third').exists()


@pytest.mark.slow
def test_the_probes_longrope_search_and_analyze_read_the_imported_run(imported, tmp_path):
  """Every command that reads a finished run reads an imported one: the passkey grid (the field's filler, built with
  the run's tokenizer), the needle probe, LongRoPE's search and the analysis figures."""
  _, _, workdir = imported
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy)
  code, _, last = command('experiments.evaluate', f'--workdir={copy}', '--probe=passkey', '--probe_filler=classic',
                          '--lengths=48,64', '--depths=0,1', '--trials=2')
  assert code == 0, last
  cells = json.loads((copy / 'evaluations' / 'passkey-none-classic-2' / 'results.json').read_text())['cells']
  assert sorted((cell['length'], cell['depth'], cell['trials']) for cell in cells) == [
      (48, 0.0, 2), (48, 1.0, 2), (64, 0.0, 2), (64, 1.0, 2)]
  code, _, last = command('experiments.evaluate', f'--workdir={copy}', '--probe=needle', '--lengths=96',
                          '--depths=0.5', '--trials=2')
  assert code == 0, last
  code, _, last = command('experiments.longrope_search', f'--workdir={copy}', '--factor=2', '--tokens=200',
                          '--length=64', '--population=4', '--generations=1', '--batch_size=2',
                          f'--output={tmp_path / "search"}')
  assert code == 0, last
  found = json.loads((tmp_path / 'search' / 'config.json').read_text())
  assert len(found['rope_scaling']['long_factor']) == 4  # head width 8: four rotary pairs
  code, _, last = command('experiments.analyze', f'--workdir={copy}')
  assert code == 0, last
  assert (copy / 'analysis' / 'attention_maps.png').is_file()


def _refused(arguments, workdir, *fragments):
  code, _, last = command('experiments.import_checkpoint', *arguments, f'--workdir={workdir}')
  assert code == 2 and last.startswith('error: ') and all(fragment in last for fragment in fragments), last
  assert not os.path.exists(f'{workdir}.importing')


def test_import_refusals_name_the_problem_and_write_nothing(imported, tmp_path):
  source, corpus_directory, workdir = imported
  new = tmp_path / 'new'
  _refused([f'--corpus={corpus_directory}'], new, '--source: missing')
  _refused([f'--source={source}', f'--corpus={corpus_directory}'], workdir, 'already holds a run of', str(source))
  code, _, last = command('experiments.prepare_corpus', f'--input={corpus_directory.parent / "texts"}',
                          f'--output={tmp_path / "b"}', '--tokenizer=bytes', '--heldout_fraction=0.3')
  assert code == 0, last
  _refused([f'--source={source}', f'--corpus={tmp_path / "b"}'], new, 'was prepared with another tokenizer (bytes, '
           '257 tokens)', f'--tokenizer={source / "tokenizer.json"}')
  wrong = write_llama_folder(tmp_path / 'wrong', tokenizer=False)
  config = json.loads((wrong / 'config.json').read_text())
  (wrong / 'config.json').write_text(json.dumps(dict(config, intermediate_size=40)))
  _refused([f'--source={wrong}', f'--corpus={corpus_directory}'], new, 'model.layers.0.mlp.gate_proj.weight',
           'shape (48, 32)', 'valid: (40, 32)')
  (wrong / 'config.json').write_text(json.dumps(dict(config, architectures=['BertForMaskedLM'])))
  _refused([f'--source={wrong}', f'--corpus={corpus_directory}'], new, 'architectures', 'LlamaForCausalLM')
  (wrong / 'config.json').write_text(json.dumps(config))
  weights = (wrong / 'model.safetensors').read_bytes()
  (wrong / 'model.safetensors').write_bytes(weights[:len(weights) // 2])
  _refused([f'--source={wrong}', f'--corpus={corpus_directory}'], new, 'model.safetensors: truncated')
  assert not new.exists()


def test_prepare_corpus_refuses_a_tokenizer_that_is_not_byte_level(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  words = Tokenizer(models.WordLevel({'<|endoftext|>': 0, 'a': 1, '[UNK]': 2}, unk_token='[UNK]'))
  words.pre_tokenizer = pre_tokenizers.Whitespace()
  words.save(str(tmp_path / 'words.json'))
  for flags, fragment in (([f'--tokenizer={tmp_path / "words.json"}'], 'valid: a byte-level BPE'),
                          ([f'--tokenizer={SHIPPED_TOKENIZER}', '--vocab_size=512'], '--vocab_size: got 512'),
                          ([f'--tokenizer={tmp_path / "absent.json"}'], 'neither a file nor one of')):
    code, _, last = command('experiments.prepare_corpus', f'--input={ROOT / "README.md"}',
                            f'--output={tmp_path / "out"}', *flags)
    assert code == 2 and fragment in last, last
    assert not (tmp_path / 'out').exists()


def test_a_fine_tune_starts_from_the_imported_parameters(imported, tmp_path):
  """train.init_from=the imported run, in a config of the same shape (the Llama-style block, 2 key and value heads,
  untied) on its corpus: after two steps at a learning rate of 1e-9 the parameters are the imported ones (a fresh
  initialisation would be far off), and init_from.json names the import."""
  _, corpus_directory, workdir = imported
  overrides = {'model.model_dim': 32, 'model.num_heads': 4, 'model.num_kv_heads': 2, 'model.feed_forward_dim': 48,
               'model.num_decoder_layers': 2, 'model.layer_norm_eps': 1e-5, 'model.tie_embeddings': False,
               'task.path': corpus_directory, 'task.max_length': 32, 'task.eval_lengths': '(32,)',
               'train.init_from': workdir, 'train.steps': 2, 'train.batch_size': 2, 'train.log_every': 1,
               'train.eval_every': 2, 'train.checkpoint_every': 2, 'train.learning_rate': 1e-9}
  code, _, last = command('experiments.train', '--config=configs/llama.py:corpus', f'--workdir={tmp_path / "tune"}',
                          *(f'--config.{name}={value}' for name, value in overrides.items()))
  assert code == 0, last
  assert json.loads((tmp_path / 'tune' / 'init_from.json').read_text())['workdir'] == str(workdir)
  from experiments.runs import checkpoints  # pylint: disable=g-import-not-at-top
  _, _, tuned = checkpoints.load_run(str(tmp_path / 'tune'))
  _, _, source = checkpoints.load_run(str(workdir))
  import jax  # pylint: disable=g-import-not-at-top
  difference = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(
      jax.tree_util.tree_leaves(tuned), jax.tree_util.tree_leaves(source)))
  assert difference < 1e-5  # two steps at a learning rate of 1e-9 leave the imported parameters where they were


def _corpus_of(root, name, texts, tokenizer=SHIPPED_TOKENIZER):
  folder = root / f'{name}-texts'
  folder.mkdir()
  for index, text in enumerate(texts):
    (folder / f'doc{index}.txt').write_text(text, encoding='utf-8')
  code, _, last = command('experiments.prepare_corpus', f'--input={folder}', f'--output={root / name}',
                          f'--tokenizer={tokenizer}', '--heldout_fraction=0.3')
  assert code == 0, last
  return root / name


def test_a_model_imported_without_a_corpus_loads_and_is_evaluated_on_any_corpus_of_its_tokenizer(imported, tmp_path):
  """The corpus belongs to the evaluation: imported without one, the run loads with the source's logits; evaluate
  needs --corpus and takes any corpus of the model's tokenizer, each in its own directory and table row, naming
  its corpus; a corpus of another tokenizer is refused naming both."""
  source, corpus_directory, with_corpus = imported
  workdir = tmp_path / 'runs' / 'bare'  # its parent made too
  code, out, last = command('experiments.import_checkpoint', f'--source={source}', f'--workdir={workdir}')
  assert code == 0, last
  assert 'corpus: none' in out
  model, variables, tokenizer = load_run(str(workdir))
  expected_model, expected_variables, _ = load_run(str(with_corpus))
  ids = np.random.default_rng(5).integers(0, VOCABULARY, size=(1, 48))
  np.testing.assert_array_equal(np.asarray(model.apply(variables, ids)),
                                np.asarray(expected_model.apply(expected_variables, ids)))
  assert tokenizer is not None and tokenizer.get_vocab_size() == VOCABULARY
  code, _, last = command('experiments.evaluate', f'--workdir={workdir}', '--lengths=16', '--tokens=128')
  assert code == 2 and '--corpus: missing' in last and 'imported without a corpus' in last, last
  other = _corpus_of(tmp_path, 'other', [f'Chapter {i}. ' + TEXT[::-1] * (3 + i % 2) for i in range(10)])
  output = tmp_path / 'table'
  for corpus in (corpus_directory, other):
    code, out, last = command('experiments.evaluate', f'--workdir={workdir}', f'--corpus={corpus}', '--lengths=16,32',
                              '--tokens=128', '--protocol=windows', f'--output={output}-{corpus.name}')
    assert code == 0, last
  directories = sorted(path.name for path in (workdir / 'evaluations').iterdir())
  assert len(directories) == 2 and all('-on-' in name for name in directories), directories
  assert {name.split('-on-')[1].rsplit('-', 1)[0] for name in directories} == {corpus_directory.name, 'other'}
  scores = [json.loads((workdir / 'evaluations' / name / 'results.jsonl').read_text().splitlines()[0])['bits_per_byte']
            for name in directories]
  assert scores[0] != scores[1]
  code, out, last = command('experiments.evaluate', '--collect=' + ','.join(
      str(workdir / 'evaluations' / name) for name in directories), '--lengths=16,32', f'--output={output}')
  assert code == 0, last
  table = (output / 'results.md').read_text()
  rows = [line for line in table.split('\n\n')[0].splitlines() if line.startswith('| rope')]  # the means
  assert len(rows) == 2 and any(f'corpus={corpus_directory.name}-' in row for row in rows) and any(
      'corpus=other-' in row for row in rows), table
  code, _, last = command('experiments.prepare_corpus', f'--input={tmp_path / "other-texts"}',
                          f'--output={tmp_path / "bytes"}', '--tokenizer=bytes', '--heldout_fraction=0.3')
  assert code == 0, last
  code, _, last = command('experiments.evaluate', f'--workdir={workdir}', f'--corpus={tmp_path / "bytes"}',
                          '--lengths=16', '--tokens=128')
  assert code == 2 and 'was prepared with another tokenizer (bytes, 257 tokens)' in last, last
  assert 'tokenizer.json, 4096 tokens' in last, last
  assert len(list((workdir / 'evaluations').iterdir())) == 2


def test_a_second_import_to_the_same_workdir_is_refused_while_the_first_writes(imported, tmp_path):
  """The import holds WORKDIR.importing.lock while it writes: a second import to that workdir is refused in one
  line and removes nothing of the first's (two imports at once used to delete each other's folder)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  source, _, _ = imported
  workdir = tmp_path / 'run'
  with open(f'{workdir}.importing.lock', 'a+') as held:
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    (tmp_path / 'run.importing').mkdir()
    (tmp_path / 'run.importing' / 'theirs').write_text('the first import\'s')
    code, _, last = command('experiments.import_checkpoint', f'--source={source}', f'--workdir={workdir}')
    assert code == 2 and 'is in use by a running job' in last and 'one import to a workdir at a time' in last, last
    assert not workdir.exists()
    assert (tmp_path / 'run.importing' / 'theirs').read_text() == 'the first import\'s'
  code, _, last = command('experiments.import_checkpoint', f'--source={source}', f'--workdir={workdir}')
  assert code == 0, last
  assert (workdir / 'config.json').is_file() and not (tmp_path / 'run.importing').exists()
  assert not (tmp_path / 'run.importing.lock').exists()


def test_a_model_whose_vocabulary_is_padded_beyond_its_tokenizer_fine_tunes_with_model_vocab_size(imported, tmp_path):
  """A pretrained vocabulary padded past its tokenizer's (Qwen2's 151,936 rows for 151,646 tokens): its corpus has
  fewer tokens than the model has rows, so the fine-tune's model needs model.vocab_size, which the refusal names;
  with it, training starts from the imported parameters."""
  _, corpus_directory, _ = imported
  source = write_llama_folder(tmp_path / 'padded', vocabulary=VOCABULARY + 64)
  code, _, last = command('experiments.import_checkpoint', f'--source={source}', f'--corpus={corpus_directory}',
                          f'--workdir={tmp_path / "run"}')
  assert code == 0, last
  overrides = {'model.model_dim': 32, 'model.num_heads': 4, 'model.num_kv_heads': 2, 'model.feed_forward_dim': 48,
               'model.num_decoder_layers': 2, 'model.layer_norm_eps': 1e-5, 'model.tie_embeddings': False,
               'task.path': corpus_directory, 'task.max_length': 32, 'task.eval_lengths': '(32,)',
               'train.init_from': tmp_path / 'run', 'train.steps': 1, 'train.batch_size': 2, 'train.eval_every': 1,
               'train.checkpoint_every': 1}
  arguments = ['experiments.train', '--config=configs/llama.py:corpus', f'--workdir={tmp_path / "tune"}',
               *(f'--config.{name}={value}' for name, value in overrides.items())]
  code, _, last = command(*arguments)
  assert code == 2 and f'--config.model.vocab_size={VOCABULARY + 64}' in last, last
  assert not (tmp_path / 'tune').exists()
  code, _, last = command(*arguments, '--config.model.vocab_size=4000')
  assert code == 2 and 'model.vocab_size: got 4000; valid: 0 (the task\'s 4096 tokens) or at least that many' in last
  code, _, last = command(*arguments, f'--config.model.vocab_size={VOCABULARY + 64}')
  assert code == 0, last
