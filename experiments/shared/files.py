"""Durable file writes. An atomic write leaves a reader (or a restart after a kill or a power loss) the
old file or the new one, never half of one: written to a temporary name of its own (PATH.PID-THREAD.tmp,
so two writers of one file never share one), fsynced, renamed over PATH, and the rename fsynced through
the directory. An appended line is fsynced before the call returns. exclusive_lock keeps a second writer
out of a directory in one line."""

import hashlib
import io
import json
import lzma
import os
import socket
import threading


def _sync_directory(path: str) -> None:
  descriptor = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
  try:
    os.fsync(descriptor)
  finally:
    os.close(descriptor)


def write_bytes_atomically(path: str, data: bytes) -> None:
  temporary = f'{path}.{os.getpid()}-{threading.get_ident()}.tmp'
  try:
    with open(temporary, 'wb') as file:
      file.write(data)
      file.flush()
      os.fsync(file.fileno())
    os.replace(temporary, path)
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)
  _sync_directory(path)


def write_text_atomically(path: str, text: str) -> None:
  write_bytes_atomically(path, text.encode('utf-8'))


def write_json_atomically(path: str, payload, sort_keys: bool = True, allow_nan: bool = False) -> None:
  """Strict JSON unless allow_nan: a NaN or an infinity is then a ValueError before anything is written (JSON
  has neither). allow_nan is for records where NaN means undefined (an AUC without positives), which
  Python's json reads back."""
  write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=sort_keys, allow_nan=allow_nan))


def write_xz_atomically(path: str, text: str, encoding: str) -> None:
  """text, encoded and xz-compressed (preset 9: the same bytes lzma.open(path, 'wt', preset=9) writes)."""
  write_bytes_atomically(path, lzma.compress(text.encode(encoding), format=lzma.FORMAT_XZ, preset=9))


def save_figure_atomically(figure, path: str, dpi: int) -> None:
  """A matplotlib figure as a PNG, written as write_bytes_atomically writes: never half a picture. The picture is
  cut to what the figure draws (bbox_inches='tight'), so a legend beside the axes is whole however long its labels."""
  buffer = io.BytesIO()
  figure.savefig(buffer, format='png', dpi=dpi, bbox_inches='tight')
  write_bytes_atomically(path, buffer.getvalue())


def append_line_durably(path: str, line: str) -> None:
  with open(path, 'a') as file:
    file.write(line.rstrip('\n') + '\n')
    file.flush()
    os.fsync(file.fileno())


def sha256_of_file(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as file:
    for block in iter(lambda: file.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def describe_files(folder: str, paths: list) -> dict:
  """{path relative to folder: {'bytes', 'mtime_ns', 'sha256'}}: what changed_files later compares against."""
  described = {}
  for path in paths:
    status = os.stat(path)
    described[os.path.relpath(path, folder)] = dict(bytes=status.st_size, mtime_ns=status.st_mtime_ns,
                                                    sha256=sha256_of_file(path))
  return described


def changed_files(folder: str, described: dict) -> list:
  """The files describe_files recorded whose bytes differ now (by SHA-256, computed only when the size or the
  modification time moved); a file that is gone is not listed."""
  changed = []
  for name, recorded in sorted(described.items()):
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
      continue
    status = os.stat(path)
    if (status.st_size, status.st_mtime_ns) == (recorded['bytes'], recorded['mtime_ns']):
      continue
    if status.st_size != recorded['bytes'] or sha256_of_file(path) != recorded['sha256']:
      changed.append(name)
  return changed


class Busy(OSError):
  """Another live process holds the lock: the message names it and what to do; holder is 'pid N on HOST'."""

  def __init__(self, message: str, holder: str):
    super().__init__(message)
    self.holder = holder


class exclusive_lock:  # pylint: disable=invalid-name  (used as a context manager, like open)
  """An exclusive flock on `path` (created if missing) while the block runs, released by the kernel when the
  holder dies, even by kill -9. A second holder gets Busy at once: '{what} is in use by pid N on HOST; ...'."""

  def __init__(self, path: str, what: str):
    self.path, self.what, self.file = path, what, None

  def __enter__(self):
    import fcntl  # pylint: disable=g-import-not-at-top
    handle = open(self.path, 'a+')
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      holder = handle.read().strip() or 'another process'
      handle.close()
      raise Busy(f'{self.what} is in use by a running job ({holder}); wait for it to finish or stop it',
                 holder) from None
    handle.truncate(0)
    handle.write(f'pid {os.getpid()} on {socket.gethostname()}')
    handle.flush()
    self.file = handle
    return self

  def __exit__(self, *exc):
    self.file.close()
