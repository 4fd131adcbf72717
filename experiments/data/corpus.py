"""A prepared corpus folder (experiments/prepare_corpus.py writes it), read without loading it whole.

  manifest.json   what was prepared and how: the inputs (sizes, SHA-256), the tokenizer and its hash, the
                  dtype, the EOD id, per split its file, SHA-256, documents, tokens and bytes, the command
  tokenizer.json  the BPE (Hugging Face tokenizers' format); absent for the byte tokenizer
  train.bin       token ids, flat, little-endian uint16 or uint32, EOD after every document
  heldout.bin     the same for the held-out documents

open_corpus checks every file against the manifest before anything reads it, so a folder with a missing
or changed file is refused, naming the file. The corpus's identity (manifest 'identity') is the SHA-256
of what training reads: the tokenizer, both token files, the dtype and the EOD id; a run records it.
"""

import dataclasses
import functools
import hashlib
import json
import os

import numpy as np

from experiments.data.corpus_tokenizer import KINDS, BpeTokenizer, ByteTokenizer
from experiments.data.manifest import DataError
from experiments.shared.files import sha256_of_file

FORMAT = 'prepared-corpus-1'
SPLITS = ('train', 'heldout')
DTYPES = {'uint16': np.dtype('<u2'), 'uint32': np.dtype('<u4')}
TOKENIZER_FILE = 'tokenizer.json'
REBUILD = 'python -m experiments.prepare_corpus'


def identity(tokenizer_sha256: str, split_sha256: dict, dtype: str, eod: int) -> str:
  """The SHA-256 that names a corpus by what training reads."""
  parts = [FORMAT, tokenizer_sha256, *(split_sha256[split] for split in SPLITS), dtype, str(eod)]
  return hashlib.sha256('\n'.join(parts).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A corpus whose manifest open_corpus checked against its files: the tokenizer is the one its file (or the
  byte kind) gives, and vocab_size and eod are what that tokenizer says, equal to the manifest's."""
  directory: str
  manifest: dict
  tokenizer: object  # ByteTokenizer or BpeTokenizer

  @property
  def identity(self) -> str:
    return self.manifest['identity']

  @property
  def vocab_size(self) -> int:
    return int(self.tokenizer.vocab_size)

  @property
  def eod(self) -> int:
    return int(self.tokenizer.eod)

  def tokens(self, split: str) -> np.ndarray:
    """The split's token ids as a read-only memory map."""
    entry = self.manifest['splits'][split]
    return np.memmap(os.path.join(self.directory, entry['file']), DTYPES[self.manifest['dtype']], mode='r')

  @functools.cached_property
  def token_bytes(self) -> np.ndarray:
    """Each token's length in UTF-8 bytes (EOD: 1), the denominator of bits per byte."""
    return self.tokenizer.token_bytes()

  @functools.cached_property
  def _starts(self) -> dict:
    return {}

  def document_starts(self, split: str) -> np.ndarray:
    """Where each document of the split begins (int64): 0, then one past each EOD but the last."""
    if split not in self._starts:
      self._starts[split] = self._find_starts(split)
    return self._starts[split]

  def _find_starts(self, split: str) -> np.ndarray:
    tokens = self.tokens(split)
    ends = [np.flatnonzero(tokens[start:start + (1 << 24)] == self.eod) + start
            for start in range(0, len(tokens), 1 << 24)]
    ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    return np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)


def read_manifest(directory: str) -> dict:
  path = os.path.join(directory, 'manifest.json')
  try:
    with open(path, encoding='utf-8') as file:
      manifest = json.load(file)
  except FileNotFoundError:
    raise DataError(f'{path}: missing; valid: a folder that {REBUILD} wrote') from None
  except (OSError, ValueError) as error:
    raise DataError(f'{path}: unreadable ({type(error).__name__}); valid: a folder that {REBUILD} '
                    f'wrote') from None
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    raise DataError(f'{path}: not a prepared corpus (format {manifest.get("format") if isinstance(manifest, dict) else None!r}); '
                    f'valid: format {FORMAT!r}, as {REBUILD} writes it')
  return manifest


class _Manifest:
  """Reads a manifest's fields, refusing a missing field or a value of the wrong kind in one line naming it."""

  def __init__(self, directory: str, manifest: dict):
    self.path = os.path.join(directory, 'manifest.json')
    self.manifest = manifest

  def refuse(self, field: str, problem: str) -> DataError:
    return DataError(f'{self.path}: {field}: {problem}; the manifest disagrees with its files: prepare the corpus '
                     f'again ({REBUILD})')

  def field(self, name: str, kind: type, valid: str):
    value = self.manifest
    for key in name.split('.'):
      if not isinstance(value, dict) or key not in value:
        raise self.refuse(name, 'missing')
      value = value[key]
    if not isinstance(value, kind) or isinstance(value, bool):
      raise self.refuse(name, f'got {value!r}; valid: {valid}')
    return value


def _load_tokenizer(directory: str, kind: str, fields: _Manifest):
  if kind == 'bytes':
    if os.path.exists(os.path.join(directory, TOKENIZER_FILE)):
      raise fields.refuse('tokenizer.kind', f'got \'bytes\', but the folder holds a {TOKENIZER_FILE} (a BPE)')
    if fields.field('tokenizer.sha256', str, 'a SHA-256') != hashlib.sha256(ByteTokenizer().to_str().encode()).hexdigest():
      raise fields.refuse('tokenizer.sha256', 'not the byte tokenizer\'s, which tokenizer.kind names')
    return ByteTokenizer()
  try:
    with open(os.path.join(directory, TOKENIZER_FILE), encoding='utf-8') as file:
      return BpeTokenizer.from_str(file.read())
  except Exception as error:  # pylint: disable=broad-except  (tokenizers raises its own exception type)
    raise fields.refuse('tokenizer.kind', f'got \'bpe\', but {TOKENIZER_FILE} is not a BPE prepare_corpus wrote '
                        f'({" ".join(str(error).split())[:120]})') from None


def _check_file_hash(path: str, expected: str, found: str) -> None:
  if found != expected:
    raise DataError(f'{path}: changed since it was prepared (SHA-256 {found[:12]}... differs from the '
                    f'manifest\'s {expected[:12]}...); prepare it again ({REBUILD})')


def _check_token_file(path: str, dtype: np.dtype, entry_name: str, entry: dict, tokenizer, fields: _Manifest) -> None:
  """One pass over the split's file: its SHA-256 against the manifest's, every id below the tokenizer's
  vocabulary, EOD last, and the token and document counts."""
  size = os.path.getsize(path)
  if size % dtype.itemsize:
    raise fields.refuse('dtype', f'{dtype.name} ids of {dtype.itemsize} bytes, but {os.path.basename(path)} holds '
                        f'{size} bytes')
  digest, largest, documents, last = hashlib.sha256(), -1, 0, None
  with open(path, 'rb') as file:
    for block in iter(lambda: file.read(1 << 22), b''):  # a multiple of every dtype's size
      digest.update(block)
      ids = np.frombuffer(block, dtype)
      largest = max(largest, int(ids.max()))
      documents += int(np.count_nonzero(ids == tokenizer.eod))
      last = ids[-1]
  _check_file_hash(path, entry['sha256'], digest.hexdigest())
  if largest >= tokenizer.vocab_size:
    raise fields.refuse('tokenizer.vocab_size', f'{tokenizer.vocab_size} tokens, but {os.path.basename(path)} holds '
                        f'id {largest}')
  if last is not None and last != tokenizer.eod:
    raise fields.refuse('eod', f'{tokenizer.eod}, but {os.path.basename(path)} does not end with it')
  for name, counted in (('tokens', size // dtype.itemsize), ('documents', documents)):
    if fields.field(f'{entry_name}.{name}', int, 'a count') != counted:
      raise fields.refuse(f'{entry_name}.{name}', f'got {entry[name]}, but {os.path.basename(path)} holds {counted}')


@functools.lru_cache(maxsize=4)
def open_corpus(directory: str) -> Corpus:
  """The corpus in `directory`, once per process, with every field training reads checked against the files: each
  file's SHA-256, the tokenizer's kind (its file, or none for bytes), its vocabulary and EOD (the manifest's must
  equal the tokenizer's, every id must be below the vocabulary), the dtype against the files' sizes, the counts,
  and the identity recomputed. A DataError names the first field or file that disagrees."""
  directory = os.path.abspath(directory)
  manifest = read_manifest(directory)
  fields = _Manifest(directory, manifest)
  kind = fields.field('tokenizer.kind', str, ' or '.join(repr(k) for k in KINDS))
  if kind not in KINDS:
    raise fields.refuse('tokenizer.kind', f'got {kind!r}; valid: {" or ".join(repr(k) for k in KINDS)}')
  dtype_name = fields.field('dtype', str, ', '.join(DTYPES))
  if dtype_name not in DTYPES:
    raise fields.refuse('dtype', f'got {dtype_name!r}; valid: {", ".join(DTYPES)}')
  tokenizer_sha256 = fields.field('tokenizer.sha256', str, 'a SHA-256')
  for split in SPLITS:
    name = fields.field(f'splits.{split}.file', str, f'{split}.bin')
    if name != f'{split}.bin':
      raise fields.refuse(f'splits.{split}.file', f'got {name!r}; valid: {split}.bin')
    fields.field(f'splits.{split}.sha256', str, 'a SHA-256')
  for name in ([TOKENIZER_FILE] if kind == 'bpe' else []) + [f'{split}.bin' for split in SPLITS]:
    if not os.path.isfile(os.path.join(directory, name)):
      raise DataError(f'{os.path.join(directory, name)}: missing; the corpus is incomplete: prepare it again ({REBUILD})')
  if kind == 'bpe':
    path = os.path.join(directory, TOKENIZER_FILE)
    _check_file_hash(path, tokenizer_sha256, sha256_of_file(path))
  tokenizer = _load_tokenizer(directory, kind, fields)
  for name, value in (('tokenizer.vocab_size', tokenizer.vocab_size), ('eod', tokenizer.eod)):
    recorded = fields.field(name, int, 'an integer')
    if recorded != value:
      raise fields.refuse(name, f'got {recorded}, but the tokenizer ({kind}) has {value}')
  for split in SPLITS:
    _check_token_file(os.path.join(directory, f'{split}.bin'), DTYPES[dtype_name], f'splits.{split}',
                      manifest['splits'][split], tokenizer, fields)
  split_sha256 = {split: manifest['splits'][split]['sha256'] for split in SPLITS}
  if identity(tokenizer_sha256, split_sha256, dtype_name, tokenizer.eod) != fields.field(
      'identity', str, 'a SHA-256'):
    raise DataError(f'{os.path.join(directory, "manifest.json")}: its identity does not match its files; '
                    f'prepare it again ({REBUILD})')
  return Corpus(directory, manifest, tokenizer)
