"""The hostile matrix of the corpus, the probes and the search: prepare_corpus, corpus runs on manifests that
lie, the passkey and needle probes, longrope_search and compare --jobs, each case reported as its command,
exit code, stderr's line count and last line, and what changed on disk. Not a pytest file (tests/test_corpus.py,
tests/test_corpus_manifest.py, tests/test_probes.py and tests/test_files.py hold the assertions); it takes a
few minutes and writes under the directory it is given, beside tests/hostile_matrix.py's runs:

  python tests/hostile_corpus_matrix.py /tmp/hostile > corpus_matrix.jsonl

Every case but the sequences is expected to exit 2 with one line and leave the disk unchanged.
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests import hostile_matrix  # pylint: disable=wrong-import-position
from tests.hostile_matrix import ENV, H, PY, ROOT, describe, snapshot  # pylint: disable=wrong-import-position

TEXTS, CORPUS = f'{H}/texts', f'{H}/corpus'
CORPUS_RUN = ['experiments.train', '--config=configs/corpus.py', '--config.train.steps=6',
              '--config.model.model_dim=32', '--config.model.num_heads=2', '--config.model.feed_forward_dim=64',
              '--config.task.max_length=32', '--config.task.eval_lengths=(32,64)', '--config.train.batch_size=4',
              '--config.train.eval_every=3', '--config.train.checkpoint_every=3', '--config.train.warmup_steps=1',
              '--config.task.eval_batches=1', '--config.model.position.kind=rope']
PROBE = ['experiments.evaluate', f'--workdir={H}/rope', '--trials=2']
SEARCH = ['experiments.longrope_search', f'--workdir={H}/rope', f'--output={H}/search', '--tokens=256']
COMPARE = ['experiments.compare', '--config=configs/smoke.py', f'--workdir={H}/cmp-jobs', '--positions=none,rope']


def corpus_run(corpus: str, workdir: str) -> list:
  return [*CORPUS_RUN, f'--config.task.path={corpus}', f'--workdir={workdir}']


CASES = [
    # prepare_corpus: flags and inputs
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--vocab_size=4294967296'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--vocab_size=1048577'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--vocab_size=256'],
    ['experiments.prepare_corpus', f'--input={H}/odd/fifo', f'--output={H}/c1', '--tokenizer=bytes'],
    ['experiments.prepare_corpus', f'--input={H}/odd/loop', f'--output={H}/c1', '--tokenizer=bytes'],
    ['experiments.prepare_corpus', f'--input={H}/odd/dangling', f'--output={H}/c1', '--tokenizer=bytes'],
    ['experiments.prepare_corpus', f'--input={H}/odd/fifo/pipe.txt', f'--output={H}/c1', '--tokenizer=bytes'],
    ['experiments.prepare_corpus', f'--input={H}/odd/fifo/*.txt', f'--output={H}/c1', '--tokenizer=bytes'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={CORPUS}'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', '--output=/etc/hostname/c1'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--heldout_fraction=nan'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--heldout_fraction=0'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--tokenizer=words'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--dtype=int8'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--separator=\\x'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--text_field='],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--tokenizer_sample_bytes=0'],
    ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/c1', '--errors=ignore'],
    ['experiments.prepare_corpus', f'--input={H}/odd/badjsonl', f'--output={H}/c1', '--tokenizer=bytes'],
    ['experiments.prepare_corpus', f'--output={H}/c1'],
    # corpus runs on manifests that lie
    corpus_run(f'{H}/lie/vocab5000', f'{H}/r1'),
    corpus_run(f'{H}/lie/vocab100', f'{H}/r1'),
    corpus_run(f'{H}/lie/kind-bytes', f'{H}/r1'),
    corpus_run(f'{H}/lie/only-format', f'{H}/r1'),
    corpus_run(f'{H}/lie/eod-reidentified', f'{H}/r1'),
    corpus_run(f'{H}/lie/ids-beyond', f'{H}/r1'),
    corpus_run(f'{H}/lie/dtype-uint32', f'{H}/r1'),
    corpus_run(f'{H}/nowhere', f'{H}/r1'),
    # the probes
    [*PROBE, '--probe=passkey', '--lengths=100000000', '--name=huge'],
    [*PROBE, '--probe=needle', '--lengths=1000000'],
    [*PROBE, '--probe=passkey', '--probe_filler=classic', '--lengths=10000000000'],
    [*PROBE, '--probe=passkey', '--lengths=100,100'],
    [*PROBE, '--probe=passkey', '--lengths=100', '--depths=0,0.5,0.50'],
    [*PROBE, '--probe=passkey', '--lengths=100', '--depths=-0.1'],
    [*PROBE, '--probe=passkey', '--lengths=100', '--trials=0'],
    [*PROBE, '--probe=needle', '--lengths=200', '--needles=0'],
    [*PROBE, '--probe=needle', '--lengths=200', '--needles=100'],
    [*PROBE, '--probe=needle', '--lengths=50'],
    [*PROBE, '--probe=passkey', '--lengths=100', '--extension=yarn'],
    [*PROBE, '--probe=passkey', '--lengths=100', '--extension=yarn', '--factor=inf'],
    [*PROBE, '--probe=passkey', '--lengths=100', '--batch_size=0'],
    [*PROBE, '--probe=passkey', '--lengths=100', '--name=a/b'],
    ['experiments.evaluate', f'--workdir={H}/copy', '--probe=passkey', '--lengths=100'],
    # longrope_search
    [*SEARCH, '--factor=nan'],
    [*SEARCH, '--factor=inf'],
    [*SEARCH, '--factor=1'],
    [*SEARCH, '--factor=-2'],
    ['experiments.longrope_search', f'--workdir={H}/sinus', f'--output={H}/search', '--factor=2'],
    ['experiments.longrope_search', f'--workdir={H}/rope', f'--output={H}/texts', '--factor=2'],
    [*SEARCH, '--factor=2', '--population=0'],
    # compare --jobs
    [*COMPARE, '--jobs=0'],
    [*COMPARE, '--jobs=-1'],
    [*COMPARE, '--jobs=abc'],
    [*COMPARE, '--jobs=2', '--cores_per_run=0'],
]


def _edit_manifest(source: str, target: str, edit, reidentify: bool = False) -> None:
  from experiments.data import corpus as corpus_format  # pylint: disable=import-outside-toplevel
  if os.path.exists(target):
    return
  shutil.copytree(source, target)
  path = os.path.join(target, 'manifest.json')
  with open(path) as file:
    manifest = json.load(file)
  manifest = edit(manifest) or manifest
  if reidentify:
    manifest['identity'] = corpus_format.identity(
        manifest['tokenizer']['sha256'], {s: manifest['splits'][s]['sha256'] for s in corpus_format.SPLITS},
        manifest['dtype'], manifest['eod'])
  with open(path, 'w') as file:
    json.dump(manifest, file)


def prepare() -> None:
  """The texts, the corpus, the manifests that lie and the odd inputs the cases read, made once under H (the
  Shakespeare and copy runs are tests/hostile_matrix.py's)."""
  import hashlib  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  hostile_matrix.prepare()
  if not os.path.exists(TEXTS):
    os.makedirs(TEXTS)
    words = 'the of and to a in is that it was for on are with as be his they at one have this from'.split()
    rng = np.random.default_rng(0)
    for index in range(60):
      with open(f'{TEXTS}/doc{index}.txt', 'w') as file:
        file.write(' '.join(rng.choice(words, size=int(rng.integers(200, 800)))) + '\n')
  if not os.path.exists(CORPUS):
    subprocess.run([PY, '-m', 'experiments.prepare_corpus', f'--input={TEXTS}', f'--output={CORPUS}',
                    '--vocab_size=300', '--heldout_fraction=0.2'], cwd=ROOT, env=ENV, check=True, capture_output=True)
  lie = f'{H}/lie'
  _edit_manifest(CORPUS, f'{lie}/vocab5000', lambda m: m['tokenizer'].update(vocab_size=5000))
  _edit_manifest(CORPUS, f'{lie}/vocab100', lambda m: m['tokenizer'].update(vocab_size=100))
  _edit_manifest(CORPUS, f'{lie}/kind-bytes', lambda m: m['tokenizer'].update(kind='bytes'))
  _edit_manifest(CORPUS, f'{lie}/only-format', lambda m: {'format': m['format']})
  _edit_manifest(CORPUS, f'{lie}/eod-reidentified', lambda m: m.update(eod=7), reidentify=True)
  _edit_manifest(CORPUS, f'{lie}/dtype-uint32', lambda m: m.update(dtype='uint32'), reidentify=True)
  if not os.path.exists(f'{lie}/ids-beyond'):
    ids = np.fromfile(f'{CORPUS}/train.bin', np.uint16)
    ids[5] = 299 + 40
    shutil.copytree(CORPUS, f'{lie}/ids-source')
    ids.tofile(f'{lie}/ids-source/train.bin')
    digest = hashlib.sha256(ids.tobytes()).hexdigest()
    _edit_manifest(f'{lie}/ids-source', f'{lie}/ids-beyond', lambda m: m['splits']['train'].update(sha256=digest),
                   reidentify=True)
  odd = f'{H}/odd'
  if not os.path.exists(odd):
    for name in ('fifo', 'loop', 'dangling', 'badjsonl'):
      os.makedirs(f'{odd}/{name}')
      with open(f'{odd}/{name}/good.txt', 'w') as file:
        file.write('fine text\n')
    os.mkfifo(f'{odd}/fifo/pipe.txt')
    os.symlink('loop.txt', f'{odd}/loop/loop.txt')
    os.symlink('gone.txt', f'{odd}/dangling/link.txt')
    with open(f'{odd}/badjsonl/lines.jsonl', 'w') as file:
      file.write('{"body": "no text field"}\n')
  if not os.path.exists(f'{H}/crun/summary.json'):
    subprocess.run([PY, '-m', *corpus_run(CORPUS, f'{H}/crun')], cwd=ROOT, env=ENV, check=True, capture_output=True)


def report(label: str, argv: list, watch: list, rows: list, setup=None) -> None:
  if setup:
    setup()
  before = snapshot(watch)
  done = subprocess.run([PY, '-m', *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
  after = snapshot(watch)
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  last = lines[-1] if lines else (done.stdout.strip().splitlines() or [''])[-1]
  shown = (label + ' ' if label else '') + ' '.join(a.replace(ROOT + '/', '').replace(H, '$H') for a in argv)
  rows.append((len(rows) + 1, shown, done.returncode, len(lines), last.replace(H, '$H')[:260], describe(before, after)))
  print(json.dumps(rows[-1]), flush=True)


def sequences(rows: list) -> None:
  """Orders of events: each a setup, then the command whose exit code and effect are reported."""
  from experiments.shared.files import exclusive_lock  # pylint: disable=import-outside-toplevel
  # A resume after the run's corpus manifest was edited: refused, the run untouched.
  shutil.rmtree(f'{H}/edited-corpus', ignore_errors=True)
  shutil.copytree(CORPUS, f'{H}/edited-corpus')
  shutil.rmtree(f'{H}/resumed', ignore_errors=True)
  subprocess.run([PY, '-m', *corpus_run(f'{H}/edited-corpus', f'{H}/resumed')], cwd=ROOT, env=ENV, check=True,
                 capture_output=True)

  def edit_kind():
    path = f'{H}/edited-corpus/manifest.json'
    with open(path) as file:
      manifest = json.load(file)
    manifest['tokenizer']['kind'] = 'bytes'
    with open(path, 'w') as file:
      json.dump(manifest, file)
  report('[corpus kind edited after the run]', [*corpus_run(f'{H}/edited-corpus', f'{H}/resumed'),
                                                '--config.train.steps=9'], [f'{H}/resumed'], rows, edit_kind)
  report('[the same edit]', ['experiments.evaluate', f'--workdir={H}/resumed', '--lengths=32', '--tokens=200'],
         [f'{H}/resumed'], rows)
  # A prepare while another holds the output's lock; then with the lock's holder gone and its leftovers there.
  shutil.rmtree(f'{H}/locked.partial', ignore_errors=True)
  shutil.rmtree(f'{H}/locked', ignore_errors=True)
  os.makedirs(f'{H}/locked.partial')
  with open(f'{H}/locked.partial/train.bin', 'wb') as file:
    file.write(b'half a file')
  with exclusive_lock(f'{H}/locked.partial/.lock', 'the matrix'):
    report('[another prepare holds it]', ['experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/locked',
                                          '--tokenizer=bytes'], [H], rows)
  report('[a killed prepare\'s leftovers]', ['experiments.prepare_corpus', f'--input={TEXTS}',
                                             f'--output={H}/locked', '--tokenizer=bytes'], [f'{H}/locked.partial'],
         rows)
  # Two prepares to one output at once.
  shutil.rmtree(f'{H}/twice', ignore_errors=True)
  command = [PY, '-m', 'experiments.prepare_corpus', f'--input={TEXTS}', f'--output={H}/twice', '--vocab_size=400']
  first = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  report('[while the same prepare runs]', command[2:], [], rows)
  first.wait()
  rows[-1] = rows[-1][:5] + (f'{rows[-1][5]}; the other exited {first.returncode}, the output holds '
                             f'{sorted(os.listdir(f"{H}/twice"))}',)
  print(json.dumps(rows[-1]), flush=True)
  # A probe while another holds its evaluation directory; the same probe once it is free.
  busy = f'{H}/rope/evaluations/busy-probe'
  shutil.rmtree(busy, ignore_errors=True)
  os.makedirs(busy)
  with exclusive_lock(f'{busy}/.lock', 'the matrix'):
    report('[another probe writes it]', [*PROBE, '--probe=passkey', '--lengths=100', '--name=busy-probe'], [busy], rows)
  report('[free again]', [*PROBE, '--probe=passkey', '--lengths=100', '--name=busy-probe'], [busy], rows)
  # The refused huge probe left its name free: the valid command under it runs.
  shutil.rmtree(f'{H}/rope/evaluations/huge', ignore_errors=True)
  report('[after the refused huge probe]', [*PROBE, '--probe=passkey', '--lengths=100', '--name=huge'],
         [f'{H}/rope/evaluations'], rows)
  # Two identical probes at once.
  shutil.rmtree(f'{H}/rope/evaluations/twin', ignore_errors=True)
  command = [PY, '-m', *PROBE, '--probe=passkey', '--lengths=100,128', '--name=twin', '--trials=4']
  first = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  time.sleep(2)
  report('[while the same probe runs]', command[2:], [], rows)
  _, first_stderr = first.communicate()
  last = ([line for line in first_stderr.splitlines() if line.strip()] or [''])[-1]
  rows[-1] = rows[-1][:5] + (f'{rows[-1][5]}; the other exited {first.returncode} ({last[:80]!r})',)
  print(json.dumps(rows[-1]), flush=True)


def main() -> None:
  prepare()
  rows = []
  for argv in CASES:
    report('', argv, [H], rows)
  sequences(rows)


if __name__ == '__main__':
  main()
