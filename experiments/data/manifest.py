"""Prepared data files are checked against the sha256 in their directory's manifest.json before use."""

import hashlib
import json
import os


class DataError(RuntimeError):
  """A prepared data file is missing or corrupt: the message names it and how to rebuild it."""


def read_manifest(directory: str, rebuild: str) -> dict:
  path = os.path.join(directory, 'manifest.json')
  try:
    with open(path) as file:
      return json.load(file)
  except (OSError, json.JSONDecodeError) as error:
    raise DataError(f'{path}: missing or unreadable ({type(error).__name__}); rebuild it with: {rebuild}') from None


def read_checked(directory: str, entry: dict, rebuild: str) -> bytes:
  """The bytes of entry['file'], which must hash to entry['sha256']."""
  path = os.path.join(directory, entry['file'])
  try:
    with open(path, 'rb') as file:
      content = file.read()
  except OSError:
    raise DataError(f'{path}: missing; rebuild it with: {rebuild}') from None
  if hashlib.sha256(content).hexdigest() != entry['sha256']:
    raise DataError(f'{path}: corrupt (sha256 differs from manifest.json); rebuild it with: {rebuild}')
  return content
