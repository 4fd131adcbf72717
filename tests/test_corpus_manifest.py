"""A prepared corpus's manifest cannot lie: every field training reads is checked against the files (the
tokenizer's kind, vocabulary and EOD, the dtype, the ids, the counts) or is part of the identity, and a
manifest that disagrees, or lacks a field, is refused in one line naming the field."""

import hashlib
import json
import shutil

import numpy as np
import pytest

from experiments.data import corpus as corpus_format
from experiments.data import corpus_writer, documents
from experiments.data.manifest import DataError

TEXTS = [f'document {index}: ' + ' '.join(['the quick brown fox', 'jumps over', 'a lazy dog'][index % 3:]) * (3 + index)
         for index in range(40)]


def _prepare(folder, tokenizer: str, texts=TEXTS):
  inputs = folder / 'in'
  inputs.mkdir(parents=True)
  for index, text in enumerate(texts):
    (inputs / f'{index:03d}.txt').write_text(text, encoding='utf-8')
  settings = dict(output=str(folder / 'corpus'), tokenizer=tokenizer, vocab_size=300, dtype='uint16',
                  heldout_fraction=0.25, separator='', text_field='text', errors='strict',
                  tokenizer_sample_bytes=10 ** 6, inputs=[str(inputs)])
  corpus_writer.prepare(documents.find_files([str(inputs)]), settings, 'test')
  return folder / 'corpus'


@pytest.fixture(scope='module')
def corpora(tmp_path_factory):
  folder = tmp_path_factory.mktemp('manifest')
  return {kind: _prepare(folder / kind, kind) for kind in ('bpe', 'bytes')}


def _open(directory):
  corpus_format.open_corpus.cache_clear()
  return corpus_format.open_corpus(str(directory))


def _edited(source, target, edit, reidentify: bool = False):
  """A copy of the corpus whose manifest `edit(manifest)` changed; with reidentify, its identity recomputed
  from the edited fields, as a hostile user who knows the formula would."""
  shutil.copytree(source, target)
  path = target / 'manifest.json'
  manifest = json.loads(path.read_text())
  edit(manifest)
  if reidentify:
    manifest['identity'] = corpus_format.identity(
        manifest['tokenizer']['sha256'], {s: manifest['splits'][s]['sha256'] for s in corpus_format.SPLITS},
        manifest['dtype'], manifest['eod'])
  path.write_text(json.dumps(manifest))
  return target


def _set(path: str, value):
  def edit(manifest):
    *parents, last = path.split('.')
    for key in parents:
      manifest = manifest[key]
    manifest[last] = value
  return edit


def test_the_prepared_corpora_and_the_shipped_one_pass_every_check(corpora):
  for kind, directory in corpora.items():
    corpus = _open(directory)
    assert corpus.tokenizer.kind == kind and corpus.vocab_size == (257 if kind == 'bytes' else 300)
  shipped = _open(corpus_format.os.path.join(corpus_format.os.path.dirname(corpus_format.__file__), 'corpus'))
  assert shipped.vocab_size == 4096 and shipped.eod == 0


@pytest.mark.parametrize('kind, field, value, fragments', [
    ('bpe', 'tokenizer.vocab_size', 5000, ('tokenizer.vocab_size: got 5000', 'the tokenizer (bpe) has 300')),
    ('bpe', 'tokenizer.vocab_size', 100, ('tokenizer.vocab_size: got 100', 'has 300')),
    ('bpe', 'tokenizer.kind', 'bytes', ('tokenizer.kind: got \'bytes\'', 'tokenizer.json')),
    ('bytes', 'tokenizer.kind', 'bpe', ('tokenizer.json: missing',)),
    ('bytes', 'tokenizer.vocab_size', 300, ('tokenizer.vocab_size: got 300', 'the tokenizer (bytes) has 257')),
    ('bpe', 'tokenizer.kind', 'words', ('tokenizer.kind: got \'words\'', 'valid: \'bytes\' or \'bpe\'')),
    ('bpe', 'tokenizer.vocab_size', '300', ('tokenizer.vocab_size: got \'300\'', 'valid: an integer')),
    ('bpe', 'splits.train.file', 'heldout.bin', ('splits.train.file: got \'heldout.bin\'', 'valid: train.bin')),
    ('bpe', 'splits.heldout.documents', 1, ('splits.heldout.documents: got 1', 'heldout.bin holds')),
    ('bpe', 'splits.train.tokens', 7, ('splits.train.tokens: got 7', 'train.bin holds')),
    ('bpe', 'dtype', 'int8', ('dtype: got \'int8\'', 'valid: uint16, uint32')),
])
def test_a_manifest_field_that_disagrees_with_the_files_is_refused_naming_it(corpora, tmp_path, kind, field, value,
                                                                             fragments):
  directory = _edited(corpora[kind], tmp_path / 'edited', _set(field, value))
  with pytest.raises(DataError) as refused:
    _open(directory)
  message = str(refused.value)
  assert '\n' not in message and 'prepare' in message
  assert all(fragment in message for fragment in fragments), message


@pytest.mark.parametrize('field, value, fragments', [
    ('eod', 7, ('eod: got 7', 'the tokenizer (bpe) has')),
    ('dtype', 'uint32', ('dtype',)),
])
def test_an_edit_with_its_identity_recomputed_is_still_refused(corpora, tmp_path, field, value, fragments):
  """The identity's own fields (eod, dtype) are checked against the files too, not only against the identity."""
  directory = _edited(corpora['bpe'], tmp_path / 'edited', _set(field, value), reidentify=True)
  with pytest.raises(DataError) as refused:
    _open(directory)
  assert all(fragment in str(refused.value) for fragment in fragments), refused.value


def test_ids_beyond_the_vocabulary_are_refused_even_with_every_hash_rewritten(corpora, tmp_path):
  """A train.bin holding an id the tokenizer lacks (the NaN of an out-of-range embedding row) is refused, even
  when its SHA-256 and the identity were rewritten to match."""
  source = tmp_path / 'source'
  shutil.copytree(corpora['bpe'], source)
  ids = np.fromfile(source / 'train.bin', np.uint16)
  ids[3] = 349
  ids.tofile(source / 'train.bin')
  digest = hashlib.sha256((source / 'train.bin').read_bytes()).hexdigest()
  directory = _edited(source, tmp_path / 'edited', _set('splits.train.sha256', digest), reidentify=True)
  with pytest.raises(DataError, match=r'tokenizer.vocab_size: 300 tokens, but train.bin holds id 349'):
    _open(directory)


@pytest.mark.parametrize('drop', ['tokenizer', 'tokenizer.vocab_size', 'eod', 'splits.heldout', 'identity', 'dtype'])
def test_a_manifest_lacking_a_field_is_refused_naming_it(corpora, tmp_path, drop):
  def edit(manifest):
    *parents, last = drop.split('.')
    for key in parents:
      manifest = manifest[key]
    del manifest[last]
  directory = _edited(corpora['bpe'], tmp_path / 'edited', edit)
  with pytest.raises(DataError, match=r'manifest.json: [a-z_.]+: missing; the manifest disagrees'):
    _open(directory)
  only_format = tmp_path / 'only-format'
  only_format.mkdir()
  (only_format / 'manifest.json').write_text(json.dumps({'format': corpus_format.FORMAT}))
  with pytest.raises(DataError, match='tokenizer.kind: missing'):
    _open(only_format)


def test_the_corpus_task_refuses_the_edited_manifest_in_one_line(corpora, tmp_path):
  """What train, a resume and evaluate read: the task's validate() names task.path and the field."""
  from experiments.tasks import TASKS
  from experiments.tasks.base import TaskSettings
  directory = _edited(corpora['bpe'], tmp_path / 'edited', _set('tokenizer.vocab_size', 5000))
  corpus_format.open_corpus.cache_clear()
  task = TASKS['corpus'](TaskSettings(name='corpus', model_kind='decoder_only', vocab_size=1, min_length=1,
                                      max_length=8, eval_lengths=(8,), eval_batches=1, path=str(directory)))
  problem = task.validate()
  assert problem.startswith('task.path: ') and 'tokenizer.vocab_size: got 5000' in problem


def test_text_that_spells_the_eod_token_stays_one_document(tmp_path):
  """'<|endoftext|>' inside a document is text: the BPE encodes it as characters, so the document keeps its
  place in one split and its EOD count, and decodes back to itself."""
  texts = [f'{text} <|endoftext|> and more' if index % 4 == 0 else text for index, text in enumerate(TEXTS)]
  corpus = _open(_prepare(tmp_path, 'bpe', texts))
  found = []
  for split in corpus_format.SPLITS:
    tokens = np.asarray(corpus.tokens(split))
    pieces = np.split(tokens, np.flatnonzero(tokens == corpus.eod) + 1)[:-1]
    found += [corpus.tokenizer.decode(piece[:-1]) for piece in pieces]
  assert sorted(found) == sorted(texts)
