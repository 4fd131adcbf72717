"""experiments/shared/files.py: atomic writes whose writers never share a temporary name, and the lock that
keeps a second writer out in one line."""

import os
import subprocess
import sys
import threading

import pytest

from experiments.shared import files


def test_writers_of_one_file_at_once_each_finish_and_leave_one_whole_version(tmp_path):
  """Two threads (and so two processes) replacing one file hundreds of times: with a shared temporary name one
  writer's rename takes the other's file away (FileNotFoundError) or publishes a mix; with its own, every write
  completes and the file is always one writer's whole bytes."""
  path = str(tmp_path / 'results.json')
  payloads = [bytes([65 + writer]) * 200_000 for writer in range(2)]
  errors = []

  def write(payload: bytes):
    try:
      for _ in range(150):
        files.write_bytes_atomically(path, payload)
    except OSError as error:
      errors.append(error)

  threads = [threading.Thread(target=write, args=(payload,)) for payload in payloads]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors, errors[:3]
  with open(path, 'rb') as file:
    assert file.read() in payloads
  assert os.listdir(tmp_path) == ['results.json']


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
  path = tmp_path / 'kept.json'
  path.write_bytes(b'old')
  monkeypatch.setattr(files.os, 'replace', lambda *_: (_ for _ in ()).throw(OSError('disk full')))
  with pytest.raises(OSError, match='disk full'):
    files.write_bytes_atomically(str(path), b'new')
  assert path.read_bytes() == b'old' and os.listdir(tmp_path) == ['kept.json']


def test_the_lock_refuses_a_second_holder_naming_the_first_and_outlives_no_holder(tmp_path):
  lock_path = str(tmp_path / '.lock')
  with files.exclusive_lock(lock_path, 'the folder'):
    other = subprocess.run([sys.executable, '-c', (
        'import sys; from experiments.shared import files\n'
        'try:\n'
        f'  files.exclusive_lock({lock_path!r}, "the folder").__enter__()\n'
        'except files.Busy as error:\n'
        '  print(error, "|", error.holder); sys.exit(3)\n')], capture_output=True, text=True, timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert other.returncode == 3, other.stderr
  assert other.stdout.startswith(f'the folder is in use by a running job (pid {os.getpid()} on ')
  killed = subprocess.Popen([sys.executable, '-c', (
      'import sys, time; from experiments.shared import files\n'
      f'lock = files.exclusive_lock({lock_path!r}, "the folder").__enter__()\n'
      'print("held", flush=True); time.sleep(600)\n')],
      stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert killed.stdout.readline().strip() == 'held'
  with pytest.raises(files.Busy):
    files.exclusive_lock(lock_path, 'the folder').__enter__()
  killed.kill()
  killed.wait(timeout=60)
  with files.exclusive_lock(lock_path, 'the folder'):  # the kernel released a holder killed with -9
    pass


def _png_width(path) -> int:
  with open(path, 'rb') as file:
    header = file.read(24)
  assert header[:8] == b'\x89PNG\r\n\x1a\n'
  return int.from_bytes(header[16:20], 'big')


def test_a_legend_beside_the_axes_is_saved_whole_however_long_its_labels(tmp_path):
  """A row's label of a hundred characters widens the picture instead of running off its edge."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  widths = {}
  for name, label in (('short', 'rope'), ('long', 'rope (' + 'sliding,' * 12 + 'full window 32; QK-norm)')):
    figure, axes = plt.subplots(figsize=(4, 3))
    axes.plot([0, 1], [0, 1], label=label)
    axes.legend(loc='center left', bbox_to_anchor=(1.01, 0.5))
    files.save_figure_atomically(figure, str(tmp_path / f'{name}.png'), dpi=50)
    plt.close(figure)
    widths[name] = _png_width(tmp_path / f'{name}.png')
  assert widths['long'] > widths['short'] + 200
