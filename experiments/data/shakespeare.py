"""Loads the prepared Shakespeare files, checking each against the manifest's sha256."""

import functools
import lzma
import os

import numpy as np

from experiments.data.manifest import read_checked, read_manifest

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'shakespeare')
REBUILD = 'python -m experiments.data.prepare_shakespeare'


def load(split: str, directory: str | None = None) -> tuple[np.ndarray, str]:
  """(character ids as uint8, vocabulary) of 'train' or 'heldout', from DIRECTORY by default."""
  return _load(split, directory or DIRECTORY)


@functools.lru_cache(maxsize=4)
def _load(split: str, directory: str) -> tuple[np.ndarray, str]:
  manifest = read_manifest(directory, REBUILD)
  compressed = read_checked(directory, manifest['splits'][split], REBUILD)
  text = lzma.decompress(compressed).decode(manifest['encoding'])
  vocabulary = manifest['vocabulary']
  lookup = np.zeros(256, np.uint8)
  lookup[np.frombuffer(vocabulary.encode(manifest['encoding']), np.uint8)] = np.arange(len(vocabulary))
  ids = lookup[np.frombuffer(text.encode(manifest['encoding']), np.uint8)]
  return ids, vocabulary


def vocabulary_size(directory: str | None = None) -> int:
  return len(read_manifest(directory or DIRECTORY, REBUILD)['vocabulary'])


def works(split: str, directory: str | None = None) -> dict[str, np.ndarray]:
  """Each work of a split as character ids, by name, cut at the spans the manifest records."""
  directory = directory or DIRECTORY
  ids, _ = load(split, directory)
  spans = read_manifest(directory, REBUILD)['splits'][split]['spans']
  return {name: ids[start:end] for name, start, end in spans}
