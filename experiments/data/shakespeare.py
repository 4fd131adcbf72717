"""Loads the prepared Shakespeare files, checking each against the manifest's sha256."""

import functools
import hashlib
import json
import lzma
import os

import numpy as np

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'shakespeare')
REBUILD = 'python -m experiments.data.prepare_shakespeare'


class DataError(RuntimeError):
  """A prepared data file is missing or corrupt: the message names it and how to rebuild it."""


def _manifest(directory: str) -> dict:
  path = os.path.join(directory, 'manifest.json')
  try:
    with open(path) as file:
      return json.load(file)
  except (OSError, json.JSONDecodeError) as error:
    raise DataError(f'{path}: missing or unreadable ({type(error).__name__}); rebuild it with: {REBUILD}') from None


def load(split: str, directory: str | None = None) -> tuple[np.ndarray, str]:
  """(character ids as uint8, vocabulary) of 'train' or 'heldout', from DIRECTORY by default."""
  return _load(split, directory or DIRECTORY)


@functools.lru_cache(maxsize=4)
def _load(split: str, directory: str) -> tuple[np.ndarray, str]:
  manifest = _manifest(directory)
  entry = manifest['splits'][split]
  path = os.path.join(directory, entry['file'])
  try:
    with open(path, 'rb') as file:
      compressed = file.read()
  except OSError:
    raise DataError(f'{path}: missing; rebuild it with: {REBUILD}') from None
  if hashlib.sha256(compressed).hexdigest() != entry['sha256']:
    raise DataError(f'{path}: corrupt (sha256 differs from manifest.json); rebuild it with: {REBUILD}')
  text = lzma.decompress(compressed).decode(manifest['encoding'])
  vocabulary = manifest['vocabulary']
  lookup = np.zeros(256, np.uint8)
  lookup[np.frombuffer(vocabulary.encode(manifest['encoding']), np.uint8)] = np.arange(len(vocabulary))
  ids = lookup[np.frombuffer(text.encode(manifest['encoding']), np.uint8)]
  return ids, vocabulary


def vocabulary_size(directory: str | None = None) -> int:
  return len(_manifest(directory or DIRECTORY)['vocabulary'])
