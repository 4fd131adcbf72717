"""Loads the prepared verse-aligned Bible (experiments/data/bible/), checked against the manifest's sha256."""

import functools
import hashlib
import lzma
import os

import numpy as np

from experiments.data.manifest import DataError, read_checked, read_manifest

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'bible')
REBUILD = 'python -m experiments.data.prepare_bible (see its docstring for the two packages)'
WORD_START = '\u2581'


@functools.lru_cache(maxsize=2)
def load(directory: str | None = None) -> tuple[dict, list[str]]:
  """({split: list of (book, chapter, verse, spanish ids, english ids)}, the vocabulary's pieces)."""
  directory = directory or DIRECTORY
  manifest = read_manifest(directory, REBUILD)
  pieces = manifest['pieces']
  if hashlib.sha256('\n'.join(pieces).encode('utf-8')).hexdigest() != manifest['pieces_sha256']:
    raise DataError(f'{os.path.join(directory, "manifest.json")}: corrupt (pieces differ from their sha256); '
                    f'rebuild it with: {REBUILD}')
  split_of = {book: split for split, books in manifest['splits'].items() for book in books}
  verses = {'train': [], 'eval': [], 'test': []}
  text = lzma.decompress(read_checked(directory, manifest['verses_file'], REBUILD)).decode('utf-8')
  for line in text.splitlines():
    book, chapter, verse, spanish, english = line.split('\t')
    verses[split_of.get(book, 'train')].append(
        (book, int(chapter), int(verse), np.asarray(spanish.split(), np.int32), np.asarray(english.split(), np.int32)))
  return verses, pieces


def detokenize(ids, pieces: list[str]) -> str:
  """Subword ids -> text: the pieces joined, each word-start mark a space."""
  return ''.join(pieces[i] for i in ids).replace(WORD_START, ' ').strip()
