"""Documents from a user's text, streamed: files, folder trees and globs of `.txt` and `.jsonl` files,
either of them compressed as `.gz` or `.xz`, and Parquet files (`.parquet`, compressed inside).

A document is a whole `.txt` file, or each piece of one between occurrences of a separator, the text
field of each `.jsonl` line, or the text column of each Parquet row (the column --text_field names; null
rows are skipped, as empty documents are). Files are read in blocks and decoded incrementally, so memory
holds one document (and one block) at a time; a Parquet file is read one row group at a time, its text
column only (pyarrow), so memory holds one group. A file that is not valid UTF-8 is an InputError naming
the file and the byte offset (of the decompressed text), unless errors='replace'; a Parquet file without
that column, or whose column is not text, is refused naming the column and the columns it has.
"""

import codecs
import dataclasses
import glob
import gzip
import hashlib
import json
import lzma
import os
import stat
from typing import Iterator, Optional

TEXT_SUFFIXES = ('.txt', '.jsonl', '.parquet')
COMPRESSED_SUFFIXES = ('.gz', '.xz')
PARQUET = '.parquet'
BLOCK_BYTES = 1 << 20
ERRORS = ('strict', 'replace')


class InputError(ValueError):
  """The input cannot be read as documents: the message names the file and what would be valid."""


@dataclasses.dataclass(frozen=True)
class InputFile:
  path: str    # as found from the --input argument (relative when it was)
  bytes: int   # on disk
  sha256: str  # of the bytes on disk


def _kind(path: str) -> Optional[str]:
  """'.txt' or '.jsonl' for a readable file name (a compressed one by the name inside), else None."""
  name = path.lower()
  if name.endswith(PARQUET):
    return PARQUET  # compressed inside, never wrapped
  for suffix in COMPRESSED_SUFFIXES:
    if name.endswith(suffix):
      name = name[:-len(suffix)]
  return next((suffix for suffix in TEXT_SUFFIXES if name.endswith(suffix) and suffix != PARQUET), None)


def _valid_names() -> str:
  return (f'.txt or .jsonl files, optionally {" or ".join(COMPRESSED_SUFFIXES)} compressed, or {PARQUET} files')


def _not_regular(path: str) -> Optional[str]:
  """What `path` is when it is not a regular file to read (a FIFO would block the reader forever, a link loop
  cannot be opened), or None."""
  try:
    mode = os.stat(path).st_mode
  except OSError as error:
    return f'a link that leads to no file ({error.strerror})'
  kinds = ((stat.S_ISREG, None), (stat.S_ISFIFO, 'a FIFO'), (stat.S_ISSOCK, 'a socket'),
           (stat.S_ISCHR, 'a character device'), (stat.S_ISBLK, 'a block device'))
  return next((name for test, name in kinds if test(mode)), 'not a regular file')


def _refuse_irregular(argument: str, matches: list[str]) -> None:
  for path in matches:
    why = _not_regular(path)
    if why:
      raise InputError(f'--input: {argument!r} names {path}, {why}; valid: regular {_valid_names()} (move it out '
                       f'of the input, or name the files to read)')


def find_files(arguments: list[str]) -> list[str]:
  """The files the --input arguments name, in sorted order without repeats: a file, a folder (every
  readable file under it, at any depth) or a glob. An argument that names nothing readable, or a text name
  that is no regular file (a FIFO, a socket, a device, a broken or looping link), is refused."""
  found = set()
  for argument in arguments:
    if os.path.isdir(argument):
      matches = [os.path.join(root, name) for root, _, names in os.walk(argument) for name in names]
      matches = [path for path in matches if _kind(path)]
      _refuse_irregular(argument, matches)
      if not matches:
        raise InputError(f'--input: got {argument!r}, a folder with no {_valid_names()} under it; valid: a '
                         f'folder that holds some')
    elif os.path.isfile(argument):
      if not _kind(argument):
        raise InputError(f'--input: got {argument!r}; valid: {_valid_names()}')
      matches = [argument]
    else:
      matches = [path for path in glob.glob(argument, recursive=True) if not os.path.isdir(path) and _kind(path)]
      _refuse_irregular(argument, matches)
      if not matches:
        raise InputError(f'--input: got {argument!r}, which matches no {_valid_names()}; valid: a file, a '
                         f'folder or a glob that names some')
    found.update(os.path.normpath(path) for path in matches)
  return sorted(found)


def describe(path: str) -> InputFile:
  digest = hashlib.sha256()
  with open(path, 'rb') as file:
    for block in iter(lambda: file.read(BLOCK_BYTES), b''):
      digest.update(block)
  return InputFile(path, os.path.getsize(path), digest.hexdigest())


def is_compressed(path: str) -> bool:
  return path.lower().endswith(COMPRESSED_SUFFIXES)


def _open(path: str):
  name = path.lower()
  if name.endswith('.gz'):
    return gzip.open(path, 'rb')
  if name.endswith('.xz'):
    return lzma.open(path, 'rb')
  return open(path, 'rb')


def _not_utf8(path: str, offset: int) -> InputError:
  return InputError(f'{path}: not valid UTF-8 at byte {offset}; valid: UTF-8 text, or --errors=replace to '
                    f'replace what does not decode')


def _text_blocks(path: str, errors: str) -> Iterator[str]:
  """The file's decompressed text, decoded block by block."""
  decoder = codecs.getincrementaldecoder('utf-8')(errors)
  consumed = 0
  try:
    with _open(path) as file:
      while True:
        block = file.read(BLOCK_BYTES)
        pending = len(decoder.getstate()[0])
        try:
          text = decoder.decode(block, final=not block)
        except UnicodeDecodeError as error:
          raise _not_utf8(path, consumed - pending + error.start) from None
        consumed += len(block)
        if text:
          yield text
        if not block:
          return
  except (OSError, EOFError, lzma.LZMAError) as error:
    raise InputError(f'{path}: cannot be read ({type(error).__name__}: {error}); valid: a readable file, '
                     f'whole if compressed') from None


def _jsonl_documents(path: str, text_field: str, errors: str) -> Iterator[str]:
  offset = 0
  try:
    with _open(path) as file:
      for number, line in enumerate(file, 1):
        try:
          decoded = line.decode('utf-8', errors)
        except UnicodeDecodeError as error:
          raise _not_utf8(path, offset + error.start) from None
        offset += len(line)
        if not decoded.strip():
          continue
        try:
          record = json.loads(decoded)
        except json.JSONDecodeError as error:
          raise InputError(f'{path}: line {number} is not JSON ({error.msg}); valid: one JSON object per '
                           f'line') from None
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
          raise InputError(f'{path}: line {number} has no string field {text_field!r}; valid: --text_field '
                           f'naming the field that holds each document\'s text')
        yield text
  except (OSError, EOFError, lzma.LZMAError) as error:
    raise InputError(f'{path}: cannot be read ({type(error).__name__}: {error}); valid: a readable file, '
                     f'whole if compressed') from None


def _parquet_documents(path: str, text_field: str) -> Iterator[str]:
  """The text column of each row, a row group at a time (that column only); null rows skipped."""
  import pyarrow  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet  # pylint: disable=g-import-not-at-top
  try:
    file = pyarrow.parquet.ParquetFile(path)
  except (OSError, pyarrow.ArrowException) as error:
    raise InputError(f'{path}: cannot be read as Parquet ({" ".join(str(error).split())[:160]}); valid: a whole '
                     'Parquet file') from None
  with file:
    schema = file.schema_arrow
    if text_field not in schema.names:
      raise InputError(f'{path}: no column {text_field!r} (it has {", ".join(schema.names[:8]) or "none"}); valid: '
                       f'--text_field naming the column that holds each document\'s text')
    kind = schema.field(text_field).type
    if not (pyarrow.types.is_string(kind) or pyarrow.types.is_large_string(kind)
            or getattr(pyarrow.types, 'is_string_view', lambda _: False)(kind)):
      raise InputError(f'{path}: column {text_field!r} holds {kind}, not text; valid: --text_field naming a string '
                       'column')
    for group in range(file.num_row_groups):
      try:
        column = file.read_row_group(group, columns=[text_field]).column(0)
      except (OSError, pyarrow.ArrowException) as error:
        raise InputError(f'{path}: row group {group} cannot be read ({" ".join(str(error).split())[:160]}); valid: '
                         'a whole Parquet file') from None
      for text in column.to_pylist():
        if text:
          yield text
      del column


def read_documents(path: str, separator: str = '', text_field: str = 'text', errors: str = 'strict') -> Iterator[str]:
  """The non-empty documents of one file, in order."""
  if errors not in ERRORS:
    raise InputError(f'--errors: got {errors!r}; valid: {", ".join(ERRORS)}')
  if _kind(path) == '.jsonl':
    yield from (text for text in _jsonl_documents(path, text_field, errors) if text)
    return
  if _kind(path) == PARQUET:
    yield from _parquet_documents(path, text_field)
    return
  buffer = ''
  for text in _text_blocks(path, errors):
    search_from = max(0, len(buffer) - len(separator) + 1)  # a separator may straddle two blocks
    buffer += text
    if separator:
      cut = 0
      while (found := buffer.find(separator, search_from)) >= 0:
        if found > cut:
          yield buffer[cut:found]
        cut = search_from = found + len(separator)
      buffer = buffer[cut:]
  if buffer:
    yield buffer


def split_of(document: str, heldout_fraction: float) -> str:
  """'heldout' or 'train', from the SHA-256 of the document's UTF-8 text: the same document always lands
  in the same split whatever else the corpus holds, and equal documents land together."""
  digest = hashlib.sha256(document.encode('utf-8', 'surrogatepass')).digest()
  return 'heldout' if int.from_bytes(digest[:8], 'big') < heldout_fraction * 2.0 ** 64 else 'train'
