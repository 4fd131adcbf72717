"""Writes a prepared corpus (experiments/data/corpus.py describes the folder): documents streamed through a
tokenizer into train.bin and heldout.bin, split by the SHA-256 of their text, with the manifest written last,
all inside OUTPUT.partial/, a folder beside the output that is renamed to it at the end (a failure or a stop
removes it). A lock inside that folder keeps a second prepare to the same output out in one line, and the
leftovers of a prepare killed with -9 (which nothing could remove) are removed by the next one.
experiments/prepare_corpus.py is the command; `settings` holds its checked flags.
"""

import contextlib
import hashlib
import os
import shutil
import time

from typing import Optional

import numpy as np
from absl import logging

from experiments.data import corpus as corpus_format
from experiments.data import documents as documents_lib
from experiments.data.corpus_tokenizer import BpeTokenizer, ByteTokenizer
from experiments.data.documents import InputError
from experiments.shared.files import Busy, exclusive_lock, write_json_atomically, write_text_atomically

BATCH_DOCUMENTS, BATCH_BYTES = 512, 8 << 20
LOCK_FILE = '.lock'


def _documents(files: list[str], settings: dict):
  for path in files:
    yield from documents_lib.read_documents(path, settings['separator'], settings['text_field'], settings['errors'])


def _training_sample(files: list[str], settings: dict):
  """The training split's documents, in order, until tokenizer_sample_bytes of text."""
  taken = 0
  for document in _documents(files, settings):
    if documents_lib.split_of(document, settings['heldout_fraction']) == 'train':
      yield document
      taken += len(document.encode('utf-8'))
      if taken >= settings['tokenizer_sample_bytes']:
        return


class _SplitWriter:
  """One split's token file, appended batch by batch and hashed as written."""

  def __init__(self, directory: str, split: str, dtype: str):
    self.file_name = f'{split}.bin'
    self.file = open(os.path.join(directory, self.file_name), 'wb')
    self.dtype = corpus_format.DTYPES[dtype]
    self.digest = hashlib.sha256()
    self.documents = self.tokens = self.bytes = 0

  def write(self, ids: np.ndarray, eod: int, text_bytes: int, bos: Optional[int] = None) -> None:
    """The document's ids, then EOD; BOS before them where the tokenizer starts its sequences with one."""
    tokens = np.concatenate([[] if bos is None else [bos], ids, [eod]])
    data = tokens.astype(self.dtype).tobytes()
    self.file.write(data)
    self.digest.update(data)
    self.documents += 1
    self.tokens += len(tokens)
    self.bytes += text_bytes

  def close(self) -> dict:
    self.file.flush()
    os.fsync(self.file.fileno())
    self.file.close()
    return dict(file=self.file_name, sha256=self.digest.hexdigest(), documents=self.documents, tokens=self.tokens,
                text_bytes=self.bytes)


def _progress(total: int | None):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(total=total, unit='B', unit_scale=True, unit_divisor=1024, desc='prepare', disable=None,
              dynamic_ncols=True)


def write_corpus(directory: str, files: list[str], tokenizer, settings: dict) -> dict:
  """train.bin and heldout.bin in `directory`; their manifest entries."""
  writers = {split: _SplitWriter(directory, split, settings['dtype']) for split in corpus_format.SPLITS}
  compressed = any(documents_lib.is_compressed(path) for path in files)
  started, tokens = time.monotonic(), 0
  with _progress(None if compressed else sum(os.path.getsize(path) for path in files)) as bar:
    batch, batch_bytes = [], 0

    def flush():
      nonlocal tokens
      for (text, size), ids in zip(batch, tokenizer.encode_batch([text for text, _ in batch])):
        writers[documents_lib.split_of(text, settings['heldout_fraction'])].write(ids, tokenizer.eod, size,
                                                                                  tokenizer.bos)
        tokens += len(ids) + 1
      bar.update(batch_bytes)
      bar.set_postfix_str(f'{tokens / max(time.monotonic() - started, 1e-9):,.0f} tokens/s', refresh=False)
      batch.clear()

    for document in _documents(files, settings):
      size = len(document.encode('utf-8'))
      batch.append((document, size))
      batch_bytes += size
      if len(batch) >= BATCH_DOCUMENTS or batch_bytes >= BATCH_BYTES:
        flush()
        batch_bytes = 0
    if batch:
      flush()
  return {split: writer.close() for split, writer in writers.items()}


def _train_tokenizer(files: list[str], settings: dict) -> BpeTokenizer:
  """A byte-level BPE vocabulary trained on the sample of the training split; InputError if it holds nothing."""
  sampled = []

  def counted_sample():
    for document in _training_sample(files, settings):
      sampled.append(len(document))
      yield document

  tokenizer = BpeTokenizer.train(counted_sample(), settings['vocab_size'])
  if not sampled:
    raise InputError(f'--input: {", ".join(settings["inputs"])}: no training documents (the input holds no text, '
                     f'or --heldout_fraction holds out all of it); valid: text with documents to train on')
  return tokenizer


def _manifest(inputs: list, settings: dict, command: str, tokenizer, tokenizer_text: str, splits: dict) -> dict:
  """What the corpus is and how it was made: its inputs, reading, tokenizer, splits and identity."""
  tokenizer_sha256 = hashlib.sha256(tokenizer_text.encode('utf-8')).hexdigest()
  return dict(
      format=corpus_format.FORMAT, command=command,
      inputs=[dict(path=item.path, bytes=item.bytes, sha256=item.sha256) for item in inputs],
      reading=dict(separator=settings['separator'], text_field=settings['text_field'], errors=settings['errors'],
                   heldout_fraction=settings['heldout_fraction'], split_by='sha256 of the document text'),
      tokenizer=dict(kind=tokenizer.kind, vocab_size=tokenizer.vocab_size, sha256=tokenizer_sha256,
                     requested_vocab_size=settings['vocab_size'],
                     sample_bytes=settings['tokenizer_sample_bytes'] if settings['tokenizer'] == 'bpe' else 0,
                     **({'pretrained': {key: settings['pretrained'][key] for key in ('path', 'sha256')}}
                        if settings.get('pretrained') else {})),
      dtype=settings['dtype'], eod=tokenizer.eod, splits=splits,
      identity=corpus_format.identity(tokenizer_sha256, {s: e['sha256'] for s, e in splits.items()},
                                      settings['dtype'], tokenizer.eod))


@contextlib.contextmanager
def _claimed(temporary: str, output: str):
  """OUTPUT.partial/ under its lock while the block runs, anything else in it (a killed prepare's files) removed
  first, and the folder removed after unless the block renamed it. InputError if another prepare holds it, or
  has just renamed it to the output."""
  os.makedirs(temporary, exist_ok=True)
  with contextlib.ExitStack() as held:
    try:
      held.enter_context(exclusive_lock(os.path.join(temporary, LOCK_FILE), temporary))
    except Busy as error:
      raise InputError(f'--output: got {output}, which another prepare_corpus is writing ({error.holder}, in '
                       f'{temporary}); valid: wait for it to finish, or another --output') from None
    except FileNotFoundError:
      raise InputError(f'--output: got {output}, which another prepare_corpus has just written; valid: a new or '
                       f'empty folder') from None
    leftovers = sorted(name for name in os.listdir(temporary) if name != LOCK_FILE)
    if leftovers:
      logging.warning('%s: removing what a stopped prepare left there (%s)', temporary, ', '.join(leftovers))
      for name in leftovers:
        path = os.path.join(temporary, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    try:
      yield
    finally:
      if os.path.exists(temporary):
        shutil.rmtree(temporary, ignore_errors=True)


def prepare(files: list[str], settings: dict, command: str) -> dict:
  """Writes the corpus to settings['output'] through OUTPUT.partial/ beside it, under its lock; the manifest."""
  output = os.path.abspath(settings['output'])
  inputs = [documents_lib.describe(path) for path in files]
  started = time.monotonic()
  temporary = f'{output}.partial'
  with _claimed(temporary, output):
    if settings['tokenizer'] == 'pretrained':
      tokenizer = BpeTokenizer.from_str(settings['pretrained']['text'])
    else:
      tokenizer = _train_tokenizer(files, settings) if settings['tokenizer'] == 'bpe' else ByteTokenizer()
    tokenizer_text = tokenizer.to_str()
    if tokenizer.kind == 'bpe':
      write_text_atomically(os.path.join(temporary, corpus_format.TOKENIZER_FILE), tokenizer_text)
    splits = write_corpus(temporary, files, tokenizer, settings)
    total_documents = sum(entry['documents'] for entry in splits.values())
    if total_documents == 0:
      raise InputError(f'--input: {", ".join(settings["inputs"])}: no text (0 non-empty documents in '
                       f'{len(files)} file(s)); valid: files that hold text')
    for split, entry in splits.items():
      if entry['documents'] == 0:
        raise InputError(f'--heldout_fraction: got {settings["heldout_fraction"]}, which leaves the {split} '
                         f'split empty ({total_documents} document(s) in all); valid: a fraction that puts '
                         f'documents in both splits, or more documents')
    manifest = _manifest(inputs, settings, command, tokenizer, tokenizer_text, splits)
    write_json_atomically(os.path.join(temporary, 'manifest.json'), manifest)
    try:
      os.rename(temporary, output)  # onto an empty folder too: check_flags refused any other
    except OSError:
      raise InputError(f'--output: got {output}, which another prepare_corpus wrote meanwhile; valid: a new or '
                       f'empty folder') from None
    os.remove(os.path.join(output, LOCK_FILE))  # still held through its open file until the lock is released
  seconds = time.monotonic() - started
  text_bytes = sum(entry['text_bytes'] for entry in splits.values())
  tokens = sum(entry['tokens'] for entry in splits.values())
  logging.info('%s: %d documents, %d tokens (%s), %.1f MB of text in %.1f s: %.2f MB/s, %.0f tokens/s', output,
               sum(entry['documents'] for entry in splits.values()), tokens, settings['dtype'], text_bytes / 1e6,
               seconds, text_bytes / 1e6 / max(seconds, 1e-9), tokens / max(seconds, 1e-9))
  return manifest
