"""experiments/runs/metrics.py's TensorBoard side: what the event files hold, and what writing them imports."""

import importlib.util
import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Writes two records through MetricsWriter in a fresh interpreter, then reports what it imported, and whether
# torch can still be imported afterwards.
WRITER = r'''
import json, sys
from experiments.runs.metrics import MetricsWriter
writer = MetricsWriter(sys.argv[1], primary=True)
writer.write({'split': 'train', 'step': 1, 'loss': 2.5, 'accuracy': float('nan')})
writer.write({'split': 'eval', 'length': 12, 'step': 2, 'loss': 1.25, 'accuracy': 0.5})
writer.close()
imported_by_writer = 'torch' in sys.modules
try:
  import torch
  importable_after = True
except ImportError:
  importable_after = False
print(json.dumps({'torch_imported_by_writer': imported_by_writer, 'torch_importable_after': importable_after}))
'''


def _write(workdir) -> dict:
  result = subprocess.run([sys.executable, '-c', WRITER, str(workdir)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  return json.loads(result.stdout.splitlines()[-1])


def _scalars(directory) -> dict:
  """{(tag, step): value} of every scalar in the directory's TFRecord event files (length, its CRC, the Event
  proto, its CRC), read with tensorboardX's own Event message."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  scalars = {}
  for path in directory.iterdir():
    data = path.read_bytes()
    while data:
      (length,) = struct.unpack('<Q', data[:8])
      event = event_pb2.Event.FromString(data[12:12 + length])
      data = data[12 + length + 4:]
      for value in event.summary.value:
        scalars[(value.tag, event.step)] = value.simple_value
  return scalars


def test_the_event_files_hold_every_finite_number_of_each_record_under_its_split_and_length(tmp_path):
  _write(tmp_path)
  assert _scalars(tmp_path / 'tensorboard') == {('train/loss', 1): 2.5, ('eval/length_12/loss', 2): 1.25,
                                                 ('eval/length_12/accuracy', 2): 0.5}  # NaN left out
  assert [json.loads(line)['step'] for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()] == [1, 2]


@pytest.mark.skipif(importlib.util.find_spec('torch') is None, reason='PyTorch is not installed: nothing to keep out')
def test_writing_event_files_imports_no_torch_and_leaves_it_importable(tmp_path):
  """tensorboardX's writer imports torch when it is installed (a second or more, some hundreds of MB, in every
  training process); the metrics writer keeps it out, and a later `import torch` still works."""
  assert _write(tmp_path) == {'torch_imported_by_writer': False, 'torch_importable_after': True}
