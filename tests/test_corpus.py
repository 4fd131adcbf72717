"""A user's corpus: prepare_corpus (documents, split by document, tokenizers, manifest, refusals) and the
corpus task (windows from the memory maps, bits per byte, the run's record of its data)."""

import gzip
import hashlib
import json
import lzma
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from experiments.data import corpus as corpus_format
from experiments.data import documents
from experiments.data.corpus_tokenizer import BpeTokenizer, ByteTokenizer
from experiments.data.manifest import DataError
from tests import command_server
from tests.helpers import ROOT, subprocess_environment

WORDS = ('the of and to a in is that it was for on are with as be his they at one have this from caf\u00e9 '
         'ni\u00f1o \u00fcber na\u00efve \u4e2d\u6587').split()


def _text(rng: np.random.Generator, words: int) -> str:
  lines = [' '.join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(max(1, words // 8))]
  return '\n'.join(lines) + '\n'


def _write_inputs(folder, seed: int = 0, count: int = 24) -> dict:
  """A tree of .txt, .txt.xz and .jsonl.gz documents; {document text: where it is}."""
  rng = np.random.default_rng(seed)
  written = {}
  os.makedirs(folder / 'nested', exist_ok=True)
  for index in range(count):
    text = _text(rng, int(rng.integers(10, 80)))
    path = folder / f'doc{seed}-{index}.txt'
    path.write_text(text, encoding='utf-8')
    written[text] = str(path)
  xz_text = _text(rng, 40)
  with lzma.open(folder / 'nested' / f'packed{seed}.txt.xz', 'wt', encoding='utf-8') as file:
    file.write(xz_text)
  written[xz_text] = 'xz'
  with gzip.open(folder / 'nested' / f'lines{seed}.jsonl.gz', 'wt', encoding='utf-8') as file:
    for _ in range(6):
      text = _text(rng, 20)
      file.write(json.dumps({'text': text, 'id': 1}) + '\n')
      written[text] = 'jsonl'
  (folder / 'nested' / 'ignored.csv').write_text('not,a,document\n')
  return written


def prepare(*arguments, check: bool = True) -> subprocess.CompletedProcess:
  result = command_server.run([sys.executable, '-m', 'experiments.prepare_corpus', *map(str, arguments)],
                              capture_output=True, text=True, cwd=ROOT, env=subprocess_environment(), timeout=300)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def _documents_of(directory, split: str) -> list[str]:
  corpus = corpus_format.open_corpus(str(directory))
  tokens = np.asarray(corpus.tokens(split))
  assert tokens[-1] == corpus.eod
  pieces = np.split(tokens, np.flatnonzero(tokens == corpus.eod) + 1)[:-1]
  return [corpus.tokenizer.decode(piece[:-1]) for piece in pieces]


@pytest.mark.parametrize('tokenizer', ['bytes', 'bpe'])
def test_prepare_writes_every_document_once_in_the_split_its_hash_names(tmp_path, tokenizer):
  written = _write_inputs(tmp_path / 'in')
  prepare(f'--input={tmp_path / "in"}', f'--output={tmp_path / "out"}', f'--tokenizer={tokenizer}', '--vocab_size=300',
          '--heldout_fraction=0.25')
  manifest = json.loads((tmp_path / 'out' / 'manifest.json').read_text())
  found = {split: _documents_of(tmp_path / 'out', split) for split in corpus_format.SPLITS}
  assert sorted(found['train'] + found['heldout']) == sorted(written)
  for split, texts in found.items():
    for text in texts:  # the split the SHA-256 of the text names, read as a fraction of 2^64
      fraction = int.from_bytes(hashlib.sha256(text.encode('utf-8')).digest()[:8], 'big') / 2 ** 64
      assert split == ('heldout' if fraction < 0.25 else 'train')
    entry = manifest['splits'][split]
    assert entry['documents'] == len(texts) > 0
    assert entry['text_bytes'] == sum(len(text.encode('utf-8')) for text in texts)
    assert entry['tokens'] == len(corpus_format.open_corpus(str(tmp_path / 'out')).tokens(split))
  assert len(manifest['inputs']) == len(written) - 6 + 1  # the jsonl's six documents are one file; the csv is not read
  assert manifest['dtype'] == 'uint16' and manifest['tokenizer']['kind'] == tokenizer
  assert sorted(os.listdir(tmp_path)) == ['in', 'out']


def test_a_sentencepiece_tokenizer_writes_bos_document_eod_and_counts_each_documents_bytes(tmp_path):
  """Gemma's kind of tokenizer (SentencePiece pieces with byte fallback, BOS in its template, <eos>): each document
  is BOS, its pieces, EOD; its pieces' bytes sum to its UTF-8 length, and it decodes back to its text."""
  from experiments.pretrained import sentencepiece_gguf  # pylint: disable=import-outside-toplevel
  from tests.test_sentencepiece import PIECES, TYPES  # pylint: disable=import-outside-toplevel
  (tmp_path / 'tokenizer.json').write_text(sentencepiece_gguf.tokenizer_json(PIECES, TYPES, bos=2, add_bos=True,
                                                                             add_space_prefix=False))
  written = _write_inputs(tmp_path / 'in', count=6)
  prepare(f'--input={tmp_path / "in"}', f'--output={tmp_path / "out"}', f'--tokenizer={tmp_path / "tokenizer.json"}',
          '--heldout_fraction=0.25')
  corpus = corpus_format.open_corpus(str(tmp_path / 'out'))
  manifest = json.loads((tmp_path / 'out' / 'manifest.json').read_text())
  found = []
  for split in corpus_format.SPLITS:
    tokens = np.asarray(corpus.tokens(split))
    documents_of_split = np.split(tokens, np.flatnonzero(tokens == corpus.eod) + 1)[:-1]
    for document in documents_of_split:
      assert document[0] == 2 and document[-1] == corpus.eod == 1 and 2 not in document[1:]
      text = corpus.tokenizer.decode(document)
      assert corpus.token_bytes[document[:-1]].sum() == len(text.encode('utf-8'))
      found.append(text)
    assert corpus.token_bytes[tokens].sum() == manifest['splits'][split]['text_bytes'] + len(documents_of_split)
  assert sorted(found) == sorted(written)
  task = _task(tmp_path / 'out', max_length=16, packing='documents')  # windows start with BOS, as the model saw
  assert task.bos == 2 and np.all(task.batch(0, 0, 'train', 4)['inputs'][:, 0] == 2)
  rows = task.packed_rows(np.array([[2, 7, 1, 2, 8, 9]]))  # a document's first input is its BOS
  assert rows['positions'].tolist() == [[0, 1, 2, 0, 1, 2]] and rows['segments'].tolist() == [[0, 0, 0, 1, 1, 1]]


def test_prepare_is_byte_identical_for_the_same_inputs_and_flags(tmp_path):
  _write_inputs(tmp_path / 'in')
  arguments = [f'--input={tmp_path / "in"}', f'--output={tmp_path / "out"}', '--vocab_size=320']
  prepare(*arguments)
  first = {name: (tmp_path / 'out' / name).read_bytes() for name in os.listdir(tmp_path / 'out')}
  os.rename(tmp_path / 'out', tmp_path / 'first')
  prepare(*arguments)
  second = {name: (tmp_path / 'out' / name).read_bytes() for name in os.listdir(tmp_path / 'out')}
  assert sorted(first) == ['heldout.bin', 'manifest.json', 'tokenizer.json', 'train.bin']
  assert first == second


def test_adding_documents_moves_no_document_between_splits(tmp_path):
  old = _write_inputs(tmp_path / 'in', seed=0)
  prepare(f'--input={tmp_path / "in"}', f'--output={tmp_path / "before"}', '--tokenizer=bytes', '--heldout_fraction=0.3')
  new = _write_inputs(tmp_path / 'in', seed=1)
  prepare(f'--input={tmp_path / "in"}', f'--output={tmp_path / "after"}', '--tokenizer=bytes', '--heldout_fraction=0.3')
  for split in corpus_format.SPLITS:
    before, after = _documents_of(tmp_path / 'before', split), _documents_of(tmp_path / 'after', split)
    assert set(before) <= set(after)
    assert set(after) - set(before) <= set(new) - set(old)


def test_bpe_token_bytes_add_up_to_the_utf8_length_of_any_text():
  texts = [_text(np.random.default_rng(seed), 60) for seed in range(8)]
  tokenizer = BpeTokenizer.train(iter(texts[:6]), 300)
  token_bytes = tokenizer.token_bytes()
  unseen = texts[6:] + ['\u00a1Hola!  \t tabs\n\n\u20ac 12.50 \U0001f600', 'x']
  for text, ids in zip(unseen, tokenizer.encode_batch(unseen)):
    assert token_bytes[ids].sum() == len(text.encode('utf-8'))
    assert tokenizer.decode(ids) == text
  assert token_bytes[tokenizer.eod] == 1 and tokenizer.vocab_size == 300
  assert ByteTokenizer().token_bytes().sum() == 257


def test_separator_splits_text_files_even_across_read_blocks(tmp_path, monkeypatch):
  monkeypatch.setattr(documents, 'BLOCK_BYTES', 7)
  path = tmp_path / 'book.txt'
  path.write_text('first chapter\n===\nsecond \u00e9t\u00e9\n===\n===\nthird', encoding='utf-8')
  assert list(documents.read_documents(str(path), separator='\n===\n')) == [
      'first chapter', 'second \u00e9t\u00e9', '===\nthird']
  assert list(documents.read_documents(str(path))) == [path.read_text(encoding='utf-8')]


def test_invalid_utf8_names_the_file_and_byte_offset_unless_replaced(tmp_path, monkeypatch):
  monkeypatch.setattr(documents, 'BLOCK_BYTES', 5)
  path = tmp_path / 'bad.txt'
  path.write_bytes('ab\u00e9cdef'.encode('utf-8') + b'\xff tail')
  with pytest.raises(documents.InputError, match=r'bad.txt: not valid UTF-8 at byte 8;.*--errors=replace'):
    list(documents.read_documents(str(path)))
  assert list(documents.read_documents(str(path), errors='replace')) == ['ab\u00e9cdef\ufffd tail']
  straddling = tmp_path / 'straddling.txt'
  straddling.write_bytes(b'abcd\xc3xyz')  # a sequence begun at the end of one read block, broken in the next
  with pytest.raises(documents.InputError, match=r'straddling.txt: not valid UTF-8 at byte 4;'):
    list(documents.read_documents(str(straddling)))
  lines = tmp_path / 'bad.jsonl'
  lines.write_bytes(b'{"text": "ok"}\n{"text": "\xc3"}\n')
  with pytest.raises(documents.InputError, match=r'bad.jsonl: not valid UTF-8 at byte 25'):
    list(documents.read_documents(str(lines)))


def _assert_refused(result, *fragments, output=None):
  assert result.returncode == 2, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and all(fragment in last for fragment in fragments), last
  if output is not None:
    assert not output.exists()
    assert not any(name.startswith(output.name + '.partial') for name in os.listdir(output.parent))


def test_prepare_refusals_write_nothing(tmp_path):
  empty = tmp_path / 'empty'
  empty.mkdir()
  (empty / 'a.txt').write_text('')
  (empty / 'b.jsonl').write_text('\n')
  out = tmp_path / 'out'
  for tokenizer in ('bytes', 'bpe'):
    _assert_refused(prepare(f'--input={empty}', f'--output={out}', f'--tokenizer={tokenizer}', check=False),
                    '--input', 'no ', output=out)
  _assert_refused(prepare(f'--input={tmp_path / "nothing*.txt"}', f'--output={out}', check=False),
                  '--input', 'matches no', output=out)
  bad = tmp_path / 'bad'
  bad.mkdir()
  (bad / 'good.txt').write_text('fine text\n')
  (bad / 'z.txt').write_bytes(b'caf\xe9\n')
  _assert_refused(prepare(f'--input={bad}', f'--output={out}', '--tokenizer=bytes', check=False),
                  'z.txt', 'byte 3', '--errors=replace', output=out)
  _assert_refused(prepare(f'--input={bad}', f'--output={out}', '--vocab_size=70000', '--dtype=uint16', check=False),
                  '--dtype', 'uint16', '69999', output=out)
  _assert_refused(prepare(f'--input={bad}', f'--output={out}', '--heldout_fraction=1.5', check=False),
                  '--heldout_fraction', '1.5', output=out)
  _assert_refused(prepare(f'--input={bad}', f'--output={out}', '--tokenizer=bytes', '--errors=replace',
                          '--heldout_fraction=0.01', check=False), '--heldout_fraction', 'heldout split empty',
                  output=out)
  kept = tmp_path / 'kept'
  kept.mkdir()
  (kept / 'mine.txt').write_text('keep me')
  _assert_refused(prepare(f'--input={bad}', f'--output={kept}', check=False), '--output', 'not empty')
  assert os.listdir(kept) == ['mine.txt']


@pytest.mark.parametrize('make, what', [
    (lambda path: os.mkfifo(path), 'a FIFO'),
    (lambda path: os.symlink(path.name, path), 'a link that leads to no file'),  # a loop: it names itself
    (lambda path: os.symlink('gone.txt', path), 'a link that leads to no file'),
])
def test_an_input_that_is_no_regular_file_is_refused_naming_it(tmp_path, make, what):
  """A FIFO named .txt would block the reader forever, a link loop cannot be opened: refused in one line before
  anything is written, from a folder and from a glob."""
  folder = tmp_path / 'in'
  folder.mkdir()
  (folder / 'good.txt').write_text('fine text\n')
  make(folder / 'odd.txt')
  out = tmp_path / 'out'
  for argument in (folder, folder / '*.txt'):
    _assert_refused(prepare(f'--input={argument}', f'--output={out}', '--tokenizer=bytes', check=False),
                    '--input', 'odd.txt', what, output=out)


def test_a_vocabulary_beyond_what_the_trainer_can_hold_is_refused(tmp_path):
  (tmp_path / 'in').mkdir()
  (tmp_path / 'in' / 'a.txt').write_text('fine text\n')
  out = tmp_path / 'out'
  for size in (2 ** 20 + 1, 2 ** 32):
    _assert_refused(prepare(f'--input={tmp_path / "in"}', f'--output={out}', f'--vocab_size={size}', check=False),
                    f'--vocab_size: got {size}; valid: 257', 'to 1048576', output=out)


def test_a_second_prepare_to_one_output_is_refused_and_a_killed_ones_leftovers_are_removed(tmp_path):
  from experiments.shared.files import exclusive_lock
  _write_inputs(tmp_path / 'in', count=8)
  out, partial = tmp_path / 'out', tmp_path / 'out.partial'
  partial.mkdir()
  (partial / 'train.bin').write_bytes(b'half a file')  # what a prepare killed with -9 leaves
  (partial / 'manifest.json.123-456.tmp').write_bytes(b'{"half": ')
  with exclusive_lock(str(partial / '.lock'), 'the test'):
    refused = prepare(f'--input={tmp_path / "in"}', f'--output={out}', '--tokenizer=bytes', check=False)
  assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith(
      f'error: --output: got {out}, which another prepare_corpus is writing (pid '), refused.stderr[-2000:]
  assert not out.exists() and sorted(os.listdir(partial)) == ['.lock', 'manifest.json.123-456.tmp', 'train.bin']
  prepare(f'--input={tmp_path / "in"}', f'--output={out}', '--tokenizer=bytes', '--heldout_fraction=0.3')  # it takes over
  assert sorted(os.listdir(out)) == ['heldout.bin', 'manifest.json', 'train.bin']
  assert sorted(os.listdir(tmp_path)) == ['in', 'out']
  corpus_format.open_corpus.cache_clear()
  assert corpus_format.open_corpus(str(out)).vocab_size == 257


@pytest.mark.slow
def test_two_prepares_at_once_leave_one_corpus_and_one_line(tmp_path):
  """Whichever wins, the other exits 2 with one line (the lock, or the output it finds written), never a
  traceback, and the corpus is the one a lone prepare writes."""
  _write_inputs(tmp_path / 'in', count=30)
  arguments = [sys.executable, '-m', 'experiments.prepare_corpus', f'--input={tmp_path / "in"}', '--vocab_size=300']
  prepare(*arguments[3:], f'--output={tmp_path / "alone"}')
  for attempt in range(3):
    out = tmp_path / f'out{attempt}'
    processes = [subprocess.Popen(arguments + [f'--output={out}'], cwd=ROOT, env=subprocess_environment(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(process.wait(timeout=300), process.communicate()[1]) for process in processes]
    assert sorted(code for code, _ in results) == [0, 2], results
    stderr = next(stderr for code, stderr in results if code == 2)
    assert stderr.strip().splitlines()[-1].startswith('error: --output') and 'Traceback' not in stderr, stderr
    written, alone = ({name: (folder / name).read_bytes() for name in os.listdir(folder) if name != 'manifest.json'}
                      for folder in (out, tmp_path / 'alone'))
    assert written == alone and sorted(written) == ['heldout.bin', 'tokenizer.json', 'train.bin']
    assert corpus_format.open_corpus(str(out)).identity == corpus_format.open_corpus(str(tmp_path / 'alone')).identity
  assert not any(name.endswith('.partial') for name in os.listdir(tmp_path))


def test_a_failure_while_writing_leaves_no_corpus(tmp_path, monkeypatch):
  from experiments.data import corpus_writer
  written = _write_inputs(tmp_path / 'in')
  calls = []

  class Failing(ByteTokenizer):
    def encode_batch(self, texts):
      calls.append(len(texts))
      if len(calls) > 1:
        raise OSError('disk full')
      return super().encode_batch(texts)

  monkeypatch.setattr(corpus_writer, 'ByteTokenizer', Failing)
  monkeypatch.setattr(corpus_writer, 'BATCH_DOCUMENTS', 4)
  settings = dict(output=str(tmp_path / 'out'), tokenizer='bytes', vocab_size=257, dtype='uint16', heldout_fraction=0.2,
                  separator='', text_field='text', errors='strict', tokenizer_sample_bytes=1000, inputs=['in'])
  with pytest.raises(OSError, match='disk full'):
    corpus_writer.prepare(documents.find_files([str(tmp_path / 'in')]), settings, 'test')
  assert sorted(os.listdir(tmp_path)) == ['in'] and len(written) > 4


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  folder = tmp_path_factory.mktemp('corpus')
  _write_inputs(folder / 'in', count=60)
  prepare(f'--input={folder / "in"}', f'--output={folder / "out"}', '--vocab_size=300', '--heldout_fraction=0.2')
  return folder / 'out'


def _task(path, **changes):
  from experiments.tasks import TASKS
  from experiments.tasks.base import TaskSettings
  fields = dict(name='corpus', model_kind='decoder_only', vocab_size=1, min_length=1, max_length=32,
                eval_lengths=(32, 64), eval_batches=2, path=str(path))
  return TASKS['corpus'](TaskSettings(**dict(fields, **changes)))


def test_windows_are_slices_of_their_split_from_seed_and_step(prepared):
  task = _task(prepared)
  assert task.validate() is None
  train, heldout = (np.asarray(task.stream(split)) for split in ('train', 'eval'))
  batch = task.batch(3, 7, 'train', 8)
  assert np.array_equal(batch['inputs'], task.batch(3, 7, 'train', 8)['inputs'])
  assert not np.array_equal(batch['inputs'], task.batch(3, 8, 'train', 8)['inputs'])
  for split, stream, length in (('train', train, 32), ('eval', heldout, 64)):
    batch = task.batch(0, 1, split, 4, length=None if split == 'train' else length)
    assert batch['inputs'].shape == (4, length)
    for inputs, targets in zip(batch['inputs'], batch['targets']):
      starts = [s for s in range(len(stream) - length + 1) if np.array_equal(stream[s:s + length], targets)]
      assert starts, 'a window that is not a slice of its split'
      assert inputs[0] == task.bos and np.array_equal(inputs[1:], targets[:-1])
    assert np.all(batch['weights'][:, 0] == 0) and np.all(batch['weights'][:, 1:] == 1)


def test_a_process_reads_only_its_rows_and_they_are_those_rows_of_the_whole_batch(prepared):
  """Task.batch_rows, what each of several processes reads: rows 0-2 and 3-7 of a batch of 8 are those rows of
  the whole batch (stream and packed documents, training and evaluation, and passkey rows mixed in by their
  row in the whole batch, on the shipped corpus); the corpus reads the windows of its rows only."""
  from configs import corpus as corpus_config
  plain_shipped = _task(corpus_config.SHIPPED, max_length=160)
  with_passkeys = _task(corpus_config.SHIPPED, max_length=160, passkey_fraction=0.5)
  for task in (_task(prepared), _task(prepared, packing='documents', max_length=16), with_passkeys):
    assert task.validate() is None
    for split, length in (('train', None), ('eval', 64)):
      whole = task.batch(2, 5, split, 8, length=length)
      for rows in (slice(0, 3), slice(3, 8)):
        part = task.batch_rows(2, 5, split, 8, rows, length=length)
        assert sorted(part) == sorted(whole)
        for name, array in whole.items():
          np.testing.assert_array_equal(part[name], array[rows], err_msg=f'{name}, rows {rows}, {split}')
  mixed_later = with_passkeys.batch_rows(2, 5, 'train', 8, slice(3, 8))['targets']
  assert not np.array_equal(mixed_later, plain_shipped.batch(2, 5, 'train', 8)['targets'][3:])  # some are passkey rows

  task, reads = _task(prepared), []
  stream = task.stream

  class Recorded:
    def __init__(self, tokens):
      self.tokens = tokens

    def __len__(self):
      return len(self.tokens)

    def __getitem__(self, index):
      reads.append(index)
      return self.tokens[index]
  task.stream = lambda split: Recorded(stream(split))
  part = task.batch_rows(2, 5, 'train', 8, slice(3, 5))
  assert len(reads) == 2 and part['targets'].shape == (2, 32)


def test_bits_per_byte_of_a_uniform_model_is_log2_vocab_tokens_over_bytes(prepared):
  import jax.numpy as jnp
  task = _task(prepared)
  batch = task.batch(0, 0, 'eval', 4, length=64)
  logits = jnp.zeros((*batch['targets'].shape, task.vocab_size))
  sums = {name: float(value) for name, value in task.loss_and_metrics(logits, batch).items()}
  sums.update(task.host_metrics(batch))
  summary = task.summarize(sums)
  scored = batch['weights'] > 0
  scored_bytes = task.token_bytes[batch['targets']][scored].sum()
  assert summary['bits_per_token'] == pytest.approx(math.log2(task.vocab_size), rel=1e-5)
  assert summary['bits_per_byte'] == pytest.approx(math.log2(task.vocab_size) * scored.sum() / scored_bytes, rel=1e-5)
  counts = np.bincount(np.asarray(task.stream('train')), minlength=task.vocab_size) + 1.0
  unigram = -np.log2(counts / counts.sum())[batch['targets']][scored].sum() / scored_bytes
  assert summary['unigram_bits_per_byte'] == pytest.approx(unigram, rel=1e-6)


def test_a_changed_or_missing_file_is_refused_naming_it(prepared, tmp_path):
  import shutil
  for name, damage in (('train.bin', 'change'), ('heldout.bin', 'remove'), ('tokenizer.json', 'change')):
    copy = tmp_path / f'{name}-{damage}'
    shutil.copytree(prepared, copy)
    if damage == 'remove':
      os.remove(copy / name)
    else:
      data = bytearray((copy / name).read_bytes())
      data[len(data) // 2] ^= 1
      (copy / name).write_bytes(bytes(data))
    problem = _task(copy).validate()
    assert problem.startswith('task.path: ') and name in problem
    assert ('missing' if damage == 'remove' else 'changed since it was prepared') in problem
  assert _task(tmp_path / 'nowhere').validate().startswith('task.path: ')
  with pytest.raises(DataError, match='not a prepared corpus'):
    (tmp_path / 'other').mkdir()
    (tmp_path / 'other' / 'manifest.json').write_text('{"format": "something else"}')
    corpus_format.open_corpus(str(tmp_path / 'other'))
  assert 'task.eval_lengths' in _task(prepared, eval_lengths=(10 ** 7,)).validate()
  assert 'task.packing' in _task(prepared, packing='bags').validate()


@pytest.mark.slow
def test_a_run_is_refused_on_a_corpus_prepared_again_with_other_text(tmp_path):
  _write_inputs(tmp_path / 'in', count=30)
  prepare(f'--input={tmp_path / "in"}', f'--output={tmp_path / "corpus"}', '--tokenizer=bytes', '--heldout_fraction=0.2')
  train = [sys.executable, '-m', 'experiments.train', '--config=configs/corpus.py', f'--workdir={tmp_path / "run"}',
           f'--config.task.path={tmp_path / "corpus"}', '--config.task.max_length=16', '--config.task.eval_lengths=(16,)',
           '--config.model.model_dim=16', '--config.model.feed_forward_dim=32', '--config.model.num_decoder_layers=1',
           '--config.model.position.kind=rope', '--config.train.batch_size=4', '--config.train.eval_every=2',
           '--config.train.checkpoint_every=2', '--config.train.log_every=2']
  first = command_server.run(train + ['--config.train.steps=2'], capture_output=True, text=True, cwd=ROOT,
                             env=subprocess_environment(), timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  recorded = json.loads((tmp_path / 'run' / 'config.json').read_text())['data']['identity']
  assert recorded == json.loads((tmp_path / 'corpus' / 'manifest.json').read_text())['identity']
  os.rename(tmp_path / 'corpus', tmp_path / 'old')
  _write_inputs(tmp_path / 'in', seed=5, count=3)
  prepare(f'--input={tmp_path / "in"}', f'--output={tmp_path / "corpus"}', '--tokenizer=bytes', '--heldout_fraction=0.2')
  before = sorted(os.listdir(tmp_path / 'run'))
  again = command_server.run(train + ['--config.train.steps=4'], capture_output=True, text=True, cwd=ROOT,
                             env=subprocess_environment(), timeout=600)
  assert again.returncode == 2
  assert 'data.identity' in again.stderr and recorded in again.stderr
  assert sorted(os.listdir(tmp_path / 'run')) == before
  # Another corpus of the run's tokenizer is evaluated on when named (--corpus), in a directory of its own; a corpus
  # of another tokenizer is refused naming both.
  prepare(f'--input={tmp_path / "in"}', f'--output={tmp_path / "bpe"}', '--tokenizer=bpe', '--vocab_size=300',
          '--heldout_fraction=0.2')
  evaluate = [sys.executable, '-m', 'experiments.evaluate', f'--workdir={tmp_path / "run"}', '--lengths=16',
              '--tokens=64']
  for corpus, code, fragment in ((tmp_path / 'old', 0, ''), (tmp_path / 'bpe', 2, 'was prepared with another '
                                                             'tokenizer (bpe, 300 tokens) than the model\'s')):
    done = command_server.run(evaluate + [f'--corpus={corpus}'], capture_output=True, text=True, cwd=ROOT,
                              env=subprocess_environment(), timeout=600)
    assert done.returncode == code and fragment in done.stderr, done.stderr[-3000:]
  assert [name.split('-on-')[1][:4] for name in os.listdir(tmp_path / 'run' / 'evaluations')] == ['old-']
  before = sorted(os.listdir(tmp_path / 'run'))
  # The run's own corpus back, its manifest edited: train (a resume) and evaluate refuse it in one line.
  shutil.rmtree(tmp_path / 'corpus')
  os.rename(tmp_path / 'old', tmp_path / 'corpus')
  manifest = json.loads((tmp_path / 'corpus' / 'manifest.json').read_text())
  manifest['tokenizer']['vocab_size'] = 300
  (tmp_path / 'corpus' / 'manifest.json').write_text(json.dumps(manifest))
  for command in (train + ['--config.train.steps=4'],
                  [sys.executable, '-m', 'experiments.evaluate', f'--workdir={tmp_path / "run"}', '--lengths=16',
                   '--tokens=64']):
    refused = command_server.run(command, capture_output=True, text=True, cwd=ROOT, env=subprocess_environment(),
                                 timeout=600)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-3000:]
    assert lines[0].startswith('error: ') and 'tokenizer.vocab_size: got 300, but the tokenizer (bytes) has 257' in lines[0]
    assert sorted(os.listdir(tmp_path / 'run')) == before


def test_documents_packing_restarts_positions_at_each_eod_input(prepared):
  task = _task(prepared, packing='documents', max_length=64)
  assert task.validate() is None
  batch = task.batch(0, 2, 'train', 8)
  eod = task.bos
  assert (batch['inputs'][:, 1:] == eod).any(), 'no document boundary inside a window: the check would be empty'
  for inputs, positions, segments in zip(batch['inputs'], batch['positions'], batch['segments']):
    position, segment = -1, -1
    for index, token in enumerate(inputs):  # a naive walk along the row
      if token == eod or index == 0:
        position, segment = 0, segment + 1
      else:
        position += 1
      assert positions[index] == position and segments[index] == segment
  assert 'positions' not in _task(prepared).batch(0, 2, 'train', 8)
  args, kwargs = task.model_inputs(batch)
  assert np.array_equal(kwargs['positions_BxL'], batch['positions']) and np.array_equal(args[0], batch['inputs'])


def test_documents_packing_refuses_a_window_longer_than_every_document(prepared):
  corpus = corpus_format.open_corpus(str(prepared))
  longest = int(np.diff(np.append(corpus.document_starts('train'), len(corpus.tokens('train')))).max())
  assert _task(prepared, packing='documents', max_length=longest, eval_lengths=(32,)).validate() is None
  problem = _task(prepared, packing='documents', max_length=longest + 1, eval_lengths=(32,)).validate()
  assert problem.startswith(f'task.max_length: got {longest + 1} with task.packing=\'documents\'; valid: at most '
                            f'{longest}')
  assert _task(prepared, max_length=longest + 1, eval_lengths=(32,)).validate() is None  # a stream runs on


def test_documents_packing_is_refused_where_the_model_cannot_pack(prepared):
  import jax
  from configs import corpus as corpus_config
  from experiments.runs import settings
  from tests.helpers import with_overrides
  base = {'task.path': str(prepared), 'task.packing': 'documents', 'task.max_length': 32, 'task.eval_lengths': (32,)}
  for changes, message in (({'model.architecture': 'lstm'}, 'task.packing: got \'documents\' with model.architecture'),
                           ({'model.randomized_max_length': 64}, 'model.randomized_max_length: got 64')):
    with pytest.raises(settings.ConfigError, match=message):
      settings.from_config_dict(with_overrides(corpus_config.get_config(), dict(base, **changes)), jax.device_count())
  settings.from_config_dict(with_overrides(corpus_config.get_config(), base), jax.device_count())


@pytest.mark.slow
def test_a_run_packed_by_document_trains_and_evaluates_at_longer_windows(prepared, tmp_path):
  import jax
  from configs import corpus as corpus_config
  from experiments.runs import settings, trainer
  from experiments.evaluation import long_context
  from tests.helpers import with_overrides
  changes = {'task.path': str(prepared), 'task.packing': 'documents', 'task.max_length': 32, 'task.eval_lengths': (32, 64),
             'model.model_dim': 16, 'model.feed_forward_dim': 32, 'model.num_decoder_layers': 1,
             'model.position.kind': 'alibi', 'train.steps': 4, 'train.eval_every': 4,
             'train.checkpoint_every': 4, 'train.log_every': 2, 'task.eval_batches': 1, 'train.batch_size': 8}
  experiment = settings.from_config_dict(with_overrides(corpus_config.get_config(), changes), jax.device_count())
  records = trainer.run(experiment, str(tmp_path / 'run'))
  assert sorted(records) == [32, 64]
  assert all(0 < records[n]['bits_per_byte'] < records[n]['unigram_bits_per_byte'] * 2 for n in records)
  request = long_context.Request('none', 1.0, 'sliding', 0.5, 512, 8)
  _, results = long_context.evaluate_run(str(tmp_path / 'run'), [32, 64], request, log=lambda line: None)
  assert all(np.isfinite(results[n]['bits_per_byte']) and results[n]['scored_bytes'] > 0 for n in (32, 64))


def _parquet(path, texts, row_group_size, **columns):
  import pyarrow  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet  # pylint: disable=g-import-not-at-top
  pyarrow.parquet.write_table(pyarrow.table({'id': list(range(len(texts))), 'text': texts, **columns}), str(path),
                              row_group_size=row_group_size)


@pytest.mark.parametrize('tokenizer', ['bytes', 'bpe'])
def test_parquet_gives_the_corpus_of_the_same_documents_as_jsonl_token_for_token(tmp_path, tokenizer):
  """The same documents (one empty, one null in Parquet) as a .jsonl file and as a Parquet file of several row
  groups: byte-identical token files, the same counts."""
  rng = np.random.default_rng(7)
  texts = [_text(rng, int(rng.integers(5, 60))) for _ in range(60)] + ['']
  (tmp_path / 'in').mkdir()
  with open(tmp_path / 'in' / 'docs.jsonl', 'w', encoding='utf-8') as file:
    for text in texts:
      file.write(json.dumps({'text': text}) + '\n')
  _parquet(tmp_path / 'docs.parquet', texts + [None], row_group_size=7)
  flags = [f'--tokenizer={tokenizer}', '--heldout_fraction=0.25'] + (['--vocab_size=300'] if tokenizer == 'bpe' else [])
  prepare(f'--input={tmp_path / "in" / "docs.jsonl"}', f'--output={tmp_path / "from-jsonl"}', *flags)
  prepare(f'--input={tmp_path / "docs.parquet"}', f'--output={tmp_path / "from-parquet"}', *flags)
  for name in ('train.bin', 'heldout.bin', 'tokenizer.json'):
    if (tmp_path / 'from-jsonl' / name).exists():
      assert (tmp_path / 'from-jsonl' / name).read_bytes() == (tmp_path / 'from-parquet' / name).read_bytes(), name
  manifests = [json.loads((tmp_path / folder / 'manifest.json').read_text())['splits']
               for folder in ('from-jsonl', 'from-parquet')]
  assert manifests[0] == manifests[1]
  assert sorted(_documents_of(tmp_path / 'from-parquet', 'train') + _documents_of(tmp_path / 'from-parquet', 'heldout')
                ) == sorted(text for text in texts if text)


def test_a_parquet_column_that_is_missing_or_not_text_is_refused_by_name(tmp_path):
  _parquet(tmp_path / 'docs.parquet', ['one document', 'another'], row_group_size=1, count=[1, 2])
  for field, fragment in (('body', "no column 'body' (it has id, text, count)"), ('count', "column 'count' holds "
                                                                                 'int64, not text')):
    _assert_refused(prepare(f'--input={tmp_path / "docs.parquet"}', f'--output={tmp_path / "out"}',
                            f'--text_field={field}', '--tokenizer=bytes', check=False), fragment,
                    output=tmp_path / 'out')
  (tmp_path / 'broken.parquet').write_bytes((tmp_path / 'docs.parquet').read_bytes()[:-20])
  _assert_refused(prepare(f'--input={tmp_path / "broken.parquet"}', f'--output={tmp_path / "out"}', '--tokenizer=bytes',
                          check=False), 'broken.parquet: cannot be read as Parquet', output=tmp_path / 'out')


def _peak_resident_bytes(arguments) -> int:
  """The largest resident set of `python -m experiments.prepare_corpus ARGUMENTS`, a process of its own."""
  process = subprocess.Popen([sys.executable, '-m', 'experiments.prepare_corpus', *map(str, arguments)], cwd=ROOT,
                             env=subprocess_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  _, status, usage = os.wait4(process.pid, 0)
  process.returncode = os.waitstatus_to_exitcode(status)
  assert process.returncode == 0, process.stderr.read()[-2000:]
  return usage.ru_maxrss * 1024  # kilobytes on Linux


@pytest.mark.slow
def test_a_parquet_file_is_streamed_a_row_group_at_a_time(tmp_path):
  """A Parquet file of 192 MB of text in row groups of 4 MB: the prepare's peak memory grows by less than a
  quarter of the text over a file of 4 MB (reading the whole column at once would add it all)."""
  rng = np.random.default_rng(0)
  alphabet = np.frombuffer(b'abcdefghijklmnopqrstuvwxyz     \n', np.uint8)
  block = [alphabet[rng.integers(0, len(alphabet), 64 * 1024)].tobytes().decode() for _ in range(64)]  # 4 MB
  _parquet(tmp_path / 'small.parquet', block, row_group_size=64)
  import pyarrow  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet  # pylint: disable=g-import-not-at-top
  with pyarrow.parquet.ParquetWriter(str(tmp_path / 'large.parquet'), pyarrow.schema([('text', pyarrow.string())]),
                                     compression='none') as writer:
    for group in range(48):
      writer.write_table(pyarrow.table({'text': [f'{group} {text}' for text in block]}), row_group_size=64)
  text_bytes = 48 * 64 * 64 * 1024
  assert os.path.getsize(tmp_path / 'large.parquet') > 0.9 * text_bytes
  small = _peak_resident_bytes([f'--input={tmp_path / "small.parquet"}', f'--output={tmp_path / "small"}',
                                '--tokenizer=bytes'])
  large = _peak_resident_bytes([f'--input={tmp_path / "large.parquet"}', f'--output={tmp_path / "large"}',
                                '--tokenizer=bytes'])
  assert json.loads((tmp_path / 'large' / 'manifest.json').read_text())['splits']['train']['documents'] > 2500
  assert large - small < text_bytes / 4, (small, large)
