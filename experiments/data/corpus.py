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

from experiments.data.corpus_tokenizer import BpeTokenizer, ByteTokenizer
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
  directory: str
  manifest: dict

  @property
  def identity(self) -> str:
    return self.manifest['identity']

  @property
  def vocab_size(self) -> int:
    return int(self.manifest['tokenizer']['vocab_size'])

  @property
  def eod(self) -> int:
    return int(self.manifest['eod'])

  def tokens(self, split: str) -> np.ndarray:
    """The split's token ids as a read-only memory map."""
    entry = self.manifest['splits'][split]
    return np.memmap(os.path.join(self.directory, entry['file']), DTYPES[self.manifest['dtype']], mode='r')

  @functools.cached_property
  def tokenizer(self):
    if self.manifest['tokenizer']['kind'] == 'bytes':
      return ByteTokenizer()
    with open(os.path.join(self.directory, TOKENIZER_FILE), encoding='utf-8') as file:
      return BpeTokenizer.from_str(file.read())

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


@functools.lru_cache(maxsize=4)
def open_corpus(directory: str) -> Corpus:
  """The corpus in `directory`, every file checked against its manifest (SHA-256 and size), once per process."""
  directory = os.path.abspath(directory)
  manifest = read_manifest(directory)
  checked = {}
  tokenizer = manifest['tokenizer']
  files = [(TOKENIZER_FILE, tokenizer['sha256'])] if tokenizer['kind'] == 'bpe' else []
  files += [(manifest['splits'][split]['file'], manifest['splits'][split]['sha256']) for split in SPLITS]
  for name, expected in files:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      raise DataError(f'{path}: missing; the corpus is incomplete: prepare it again ({REBUILD})')
    checked[name] = sha256_of_file(path)
    if checked[name] != expected:
      raise DataError(f'{path}: changed since it was prepared (SHA-256 {checked[name][:12]}... differs from the '
                      f'manifest\'s {expected[:12]}...); prepare it again ({REBUILD})')
  split_sha256 = {split: manifest['splits'][split]['sha256'] for split in SPLITS}
  if identity(tokenizer['sha256'], split_sha256, manifest['dtype'], manifest['eod']) != manifest['identity']:
    raise DataError(f'{os.path.join(directory, "manifest.json")}: its identity does not match its files; '
                    f'prepare it again ({REBUILD})')
  return Corpus(directory, manifest)
