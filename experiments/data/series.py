"""Loads the prepared time series (experiments/data/series/), checking each against the manifest's sha256."""

import csv
import functools
import io
import lzma
import os

import numpy as np

from experiments.data.manifest import DataError, read_checked, read_manifest

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'series')
REBUILD = 'python -m experiments.data.prepare_series'


def names(directory: str | None = None) -> list[str]:
  return sorted(read_manifest(directory or DIRECTORY, REBUILD)['series'])


@functools.lru_cache(maxsize=8)
def load(name: str, directory: str | None = None) -> tuple[list[str], np.ndarray, list[str]]:
  """(time labels, values T x C as float64, the C column names) of one series, oldest first."""
  directory = directory or DIRECTORY
  manifest = read_manifest(directory, REBUILD)
  if name not in manifest['series']:
    raise DataError(f'{name}: no such series in {directory}; valid: {", ".join(sorted(manifest["series"]))}')
  content = read_checked(directory, manifest['series'][name], REBUILD)
  rows = list(csv.reader(io.StringIO(lzma.decompress(content).decode('utf-8'))))
  header, rows = rows[0], rows[1:]
  values = np.asarray([[float(v) for v in row[1:]] for row in rows], np.float64)
  return [row[0] for row in rows], values, header[1:]
