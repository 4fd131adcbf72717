"""Prepares a user's text for the `corpus` task: documents, a held-out split by document, token ids on disk.

  python -m experiments.prepare_corpus --input=my_texts/ --output=corpora/mine --tokenizer=bpe --vocab_size=8192
  python -m experiments.train --config=configs/corpus.py --config.task.path=corpora/mine --workdir=runs/mine

--input (repeatable) names files, folders (read at any depth) or globs of .txt and .jsonl files, plain or
.gz/.xz compressed. A document is a whole .txt file (or each piece between --separator's occurrences) or
each .jsonl line's --text_field. Each document goes to the held-out split when the SHA-256 of its text,
read as a fraction of 2^64, is below --heldout_fraction: adding documents never moves others.

--tokenizer=bytes needs no training; --tokenizer=bpe trains a byte-level BPE of --vocab_size tokens with
Hugging Face tokenizers on the first --tokenizer_sample_bytes of training documents. Documents are then
streamed through it (memory holds one batch of documents) into train.bin and heldout.bin with EOD after
each; manifest.json records the inputs and their SHA-256, the tokenizer's, the counts and the command
(experiments/data/corpus.py describes the folder). Everything is written to a temporary folder beside
--output and renamed to it at the end, so a stopped or failed prepare leaves no corpus behind; the same
inputs and flags give byte-identical files.
"""

import hashlib
import os
import shlex
import shutil
import sys
import time

import numpy as np
from absl import flags, logging

from experiments.data import corpus as corpus_format
from experiments.data import documents as documents_lib
from experiments.data.corpus_tokenizer import KINDS, SMALLEST_BPE, BpeTokenizer, ByteTokenizer
from experiments.shared import cli
from experiments.shared.files import write_json_atomically, write_text_atomically

_INPUT = flags.DEFINE_multi_string('input', None, 'A file, folder or glob of .txt/.jsonl (.gz/.xz) text; repeatable.')
_OUTPUT = flags.DEFINE_string('output', None, 'The folder to write (new, or empty).')
_TOKENIZER = flags.DEFINE_string('tokenizer', 'bpe', f'One of {", ".join(KINDS)}.')
_VOCAB_SIZE = flags.DEFINE_integer('vocab_size', 8192, 'BPE vocabulary size, EOD included.')
_HELDOUT = flags.DEFINE_float('heldout_fraction', 0.05, 'The fraction of documents held out, by hash of their text.')
_SEPARATOR = flags.DEFINE_string('separator', '', 'Split .txt files into documents on this string (Python escapes '
                                 'such as \\n are read); empty: one document per file.')
_TEXT_FIELD = flags.DEFINE_string('text_field', 'text', 'The field of each .jsonl line that holds its text.')
_ERRORS = flags.DEFINE_string('errors', 'strict', 'strict: refuse text that is not UTF-8; replace: replace it.')
_DTYPE = flags.DEFINE_string('dtype', 'auto', 'Token id dtype: auto (uint16 when the vocabulary fits), uint16, uint32.')
_SAMPLE = flags.DEFINE_integer('tokenizer_sample_bytes', 100_000_000, 'BPE: train on the first this many bytes of '
                               'training documents.')

BATCH_DOCUMENTS, BATCH_BYTES = 512, 8 << 20


def _separator(text: str) -> str:
  try:
    return text.encode('latin-1', 'backslashreplace').decode('unicode_escape')
  except UnicodeDecodeError as error:
    raise cli.CommandError(f'--separator: got {text!r}, whose escapes do not decode ({error.reason}); valid: text '
                           f'with Python escapes such as \\n') from None


def _dtype(requested: str, vocab_size: int) -> str:
  if requested not in ('auto', *corpus_format.DTYPES):
    raise cli.CommandError(f'--dtype: got {requested!r}; valid: auto, {", ".join(corpus_format.DTYPES)}')
  fits = vocab_size <= 1 << 16
  if requested == 'uint16' and not fits:
    raise cli.CommandError(f'--dtype: got \'uint16\', but a vocabulary of {vocab_size} tokens needs ids up to '
                           f'{vocab_size - 1} > 65535; valid: uint32 or auto (or --vocab_size at most 65536)')
  return requested if requested != 'auto' else ('uint16' if fits else 'uint32')


def check_flags() -> dict:
  """Every flag, checked before anything is read or written."""
  if not _INPUT.value:
    raise cli.CommandError('--input: missing; valid: a file, folder or glob of .txt/.jsonl text (repeatable)')
  if not _OUTPUT.value:
    raise cli.CommandError('--output: missing; valid: a new or empty folder to write the corpus to')
  output = _OUTPUT.value
  cli.check_output_path('--output', output, directory=True)
  if os.path.isdir(output) and os.listdir(output):
    raise cli.CommandError(f'--output: got {output!r}, a folder that is not empty; valid: a new or empty folder '
                           f'(a prepared corpus is never rewritten)')
  if _TOKENIZER.value not in KINDS:
    raise cli.CommandError(f'--tokenizer: got {_TOKENIZER.value!r}; valid: {", ".join(KINDS)}')
  vocab_size = ByteTokenizer.vocab_size if _TOKENIZER.value == 'bytes' else _VOCAB_SIZE.value
  if _TOKENIZER.value == 'bpe' and not SMALLEST_BPE <= vocab_size <= 1 << 32:
    raise cli.CommandError(f'--vocab_size: got {vocab_size}; valid: {SMALLEST_BPE} (the bytes and EOD) to 2^32')
  if not 0.0 < _HELDOUT.value < 1.0:
    raise cli.CommandError(f'--heldout_fraction: got {_HELDOUT.value}; valid: a fraction strictly between 0 and 1')
  if _ERRORS.value not in documents_lib.ERRORS:
    raise cli.CommandError(f'--errors: got {_ERRORS.value!r}; valid: {", ".join(documents_lib.ERRORS)}')
  if _SAMPLE.value < 1:
    raise cli.CommandError(f'--tokenizer_sample_bytes: got {_SAMPLE.value}; valid: a positive number of bytes')
  if not _TEXT_FIELD.value:
    raise cli.CommandError('--text_field: empty; valid: the name of the .jsonl field that holds the text')
  return dict(output=output, tokenizer=_TOKENIZER.value, vocab_size=vocab_size, dtype=_dtype(_DTYPE.value, vocab_size),
              heldout_fraction=_HELDOUT.value, separator=_separator(_SEPARATOR.value), text_field=_TEXT_FIELD.value,
              errors=_ERRORS.value, tokenizer_sample_bytes=_SAMPLE.value)


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

  def write(self, ids: np.ndarray, eod: int, text_bytes: int) -> None:
    data = np.append(ids, eod).astype(self.dtype).tobytes()
    self.file.write(data)
    self.digest.update(data)
    self.documents += 1
    self.tokens += len(ids) + 1
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
        writers[documents_lib.split_of(text, settings['heldout_fraction'])].write(ids, tokenizer.eod, size)
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


def prepare(files: list[str], settings: dict, command: str) -> dict:
  """Writes the corpus to settings['output'] through a temporary folder beside it; the manifest."""
  output = os.path.abspath(settings['output'])
  inputs = [documents_lib.describe(path) for path in files]
  started = time.monotonic()
  if settings['tokenizer'] == 'bpe':
    sampled = []

    def counted_sample():
      for document in _training_sample(files, settings):
        sampled.append(len(document))
        yield document

    tokenizer = BpeTokenizer.train(counted_sample(), settings['vocab_size'])
    if not sampled:
      raise cli.CommandError(f'--input: {", ".join(_INPUT.value)}: no training documents (the input holds no text, '
                             f'or --heldout_fraction holds out all of it); valid: text with documents to train on')
  else:
    tokenizer = ByteTokenizer()
  temporary = f'{output}.partial-{os.getpid()}'
  os.makedirs(temporary)
  try:
    tokenizer_text = tokenizer.to_str()
    if settings['tokenizer'] == 'bpe':
      write_text_atomically(os.path.join(temporary, corpus_format.TOKENIZER_FILE), tokenizer_text)
    splits = write_corpus(temporary, files, tokenizer, settings)
    total_documents = sum(entry['documents'] for entry in splits.values())
    if total_documents == 0:
      raise cli.CommandError(f'--input: {", ".join(_INPUT.value)}: no text (0 non-empty documents in '
                             f'{len(files)} file(s)); valid: files that hold text')
    for split, entry in splits.items():
      if entry['documents'] == 0:
        raise cli.CommandError(f'--heldout_fraction: got {settings["heldout_fraction"]}, which leaves the {split} '
                               f'split empty ({total_documents} document(s) in all); valid: a fraction that puts '
                               f'documents in both splits, or more documents')
    tokenizer_sha256 = hashlib.sha256(tokenizer_text.encode('utf-8')).hexdigest()
    manifest = dict(
        format=corpus_format.FORMAT, command=command,
        inputs=[dict(path=item.path, bytes=item.bytes, sha256=item.sha256) for item in inputs],
        reading=dict(separator=settings['separator'], text_field=settings['text_field'], errors=settings['errors'],
                       heldout_fraction=settings['heldout_fraction'], split_by='sha256 of the document text'),
        tokenizer=dict(kind=tokenizer.kind, vocab_size=tokenizer.vocab_size, sha256=tokenizer_sha256,
                       requested_vocab_size=settings['vocab_size'],
                       sample_bytes=settings['tokenizer_sample_bytes'] if tokenizer.kind == 'bpe' else 0),
        dtype=settings['dtype'], eod=tokenizer.eod, splits=splits,
        identity=corpus_format.identity(tokenizer_sha256, {s: e['sha256'] for s, e in splits.items()},
                                        settings['dtype'], tokenizer.eod))
    write_json_atomically(os.path.join(temporary, 'manifest.json'), manifest)
    if os.path.isdir(output):
      os.rmdir(output)  # empty: check_flags refused any other
    os.rename(temporary, output)
  finally:
    if os.path.exists(temporary):
      shutil.rmtree(temporary, ignore_errors=True)
  seconds = time.monotonic() - started
  text_bytes = sum(entry['text_bytes'] for entry in splits.values())
  tokens = sum(entry['tokens'] for entry in splits.values())
  logging.info('%s: %d documents, %d tokens (%s), %.1f MB of text in %.1f s: %.2f MB/s, %.0f tokens/s', output,
               sum(entry['documents'] for entry in splits.values()), tokens, settings['dtype'], text_bytes / 1e6,
               seconds, text_bytes / 1e6 / max(seconds, 1e-9), tokens / max(seconds, 1e-9))
  return manifest


def main(argv):
  if len(argv) > 1:
    raise cli.CommandError(f'unexpected arguments: {" ".join(argv[1:])}; valid: flags only (--input, --output, ...)')
  settings = check_flags()
  try:
    files = documents_lib.find_files(_INPUT.value)
  except documents_lib.InputError as error:
    raise cli.CommandError(str(error)) from None
  command = ' '.join(['python -m experiments.prepare_corpus', *map(shlex.quote, sys.argv[1:])])
  try:
    prepare(files, settings, command)
  except documents_lib.InputError as error:
    raise cli.CommandError(str(error)) from None


if __name__ == '__main__':
  cli.run(main)
