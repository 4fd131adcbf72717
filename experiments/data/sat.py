"""Loads the prepared Swedish SAT responses (experiments/data/sat/), checked against the manifest's sha256."""

import functools
import lzma
import os

import numpy as np

from experiments.data.manifest import DataError, read_checked, read_manifest

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'sat')
REBUILD = 'python -m experiments.data.prepare_sat'
NO_ANSWER = -1


def parts(directory: str | None = None) -> list[str]:
  return sorted(read_manifest(directory or DIRECTORY, REBUILD)['parts'])


@functools.lru_cache(maxsize=4)
def correctness(part: str, directory: str | None = None) -> np.ndarray:
  """Test-takers x items, int8: 1 correct, 0 wrong, NO_ANSWER (-1) when the item was left blank;
  items in the order of the test, test-takers in the order of the source."""
  directory = directory or DIRECTORY
  manifest = read_manifest(directory, REBUILD)
  if part not in manifest['parts']:
    raise DataError(f'{part}: no such part in {directory}; valid: {", ".join(sorted(manifest["parts"]))}')
  entry = manifest['parts'][part]
  lines = lzma.decompress(read_checked(directory, entry, REBUILD)).decode('ascii').split()
  chosen = np.frombuffer(''.join(lines).encode('ascii'), np.uint8).reshape(len(lines), -1)
  key = np.frombuffer(entry['key'].encode('ascii'), np.uint8)
  result = (chosen == key[None]).astype(np.int8)
  result[chosen == ord('.')] = NO_ANSWER
  return result
