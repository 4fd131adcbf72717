"""The hostile matrix behind issue 37's closing note: every command given bad flags, bad runs and bad orders
of events, each reported as its exit code, its stderr's line count and last line, and what changed on disk.
Not a pytest file (tests/test_commands.py holds the assertions); it takes several minutes and writes under
the directory it is given:

  python tests/hostile_matrix.py /tmp/hostile > matrix.jsonl

First it trains the small runs the cases read (RoPE, sinusoidal, a copy run, learned, an LSTM, one with a
checkpoint byte flipped, one with a corrupt results file, a sweep), then runs the cases, then the sequences.
Every case but the sequences is expected to exit 2 with one line and leave the disk unchanged.
"""
import hashlib, json, os, shutil, subprocess, sys
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else '/tmp/hostile'
PY = sys.executable
ENV = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=ROOT)

def snapshot(paths):
  found = {}
  for base in paths:
    if os.path.isfile(base):
      found[base] = hashlib.sha256(open(base, 'rb').read()).hexdigest(); continue
    for root, _, names in os.walk(base):
      for n in names:
        p = os.path.join(root, n)
        if n == '.lock' or not os.path.isfile(p): continue  # a FIFO or a link loop cannot be read
        found[p] = hashlib.sha256(open(p, 'rb').read()).hexdigest()
  return found

def describe(before, after):
  added = sorted(set(after) - set(before)); removed = sorted(set(before) - set(after))
  changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
  if not (added or removed or changed): return 'unchanged'
  parts = []
  for label, items in (('added', added), ('removed', removed), ('changed', changed)):
    if items: parts.append(f'{label} {len(items)}: ' + ', '.join(os.path.relpath(i, H) for i in items[:3]) + (' ...' if len(items) > 3 else ''))
  return '; '.join(parts)

SH = ('--config=configs/shakespeare.py --config.train.steps=10 --config.model.model_dim=32 --config.model.num_heads=2 '
      '--config.model.feed_forward_dim=64 --config.task.eval_lengths=32,64 --config.task.max_length=32 '
      '--config.train.batch_size=4 --config.train.eval_every=10 --config.train.checkpoint_every=10 '
      '--config.train.warmup_steps=2 --config.task.eval_batches=1').split()
SMOKE = ['--config=configs/smoke.py']
NEW = f'{H}/new'
CASES = [
  # train
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--seeds=0'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--seeds=3'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.train.steps=0'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.train.batch_size=-1'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.task.eval_lengths=()'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.attention_implementation=flash'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.attention_implementation=pallas', '--config.model.position.kind=fire'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.attention_implementation=pallas', '--config.model.attention_dropout_rate=0.1'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.position.kind=shaw', '--config.model.position.clip_distance=1000000000'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.position.kind=cope', '--config.model.position.max_positions=2000000000'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.position.kind=learned', '--config.model.position.max_length=4'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', f'--config.train.init_from={NEW}'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', f'--config.train.init_from={H}/copy/config.json'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', f'--config.train.init_from={H}/rope'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={H}/copy', '--config.model.attention_implementation=xla'], [H]),
  ('train', ['experiments.train', *SMOKE, '--workdir=/proc/forbidden/run'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.position.kind=fire', '--config.model.position.fire_threshold=nan'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.position.kind=rope', '--config.model.position.rope_base=inf'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.compute_dtype=float16'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.position.kind=xpos', '--config.task.model_kind=encoder_decoder'], [H]),
  ('train', ['experiments.train', *SMOKE, f'--workdir={NEW}', '--config.model.attention_implementation=cudnn', '--config.model.compute_dtype=bfloat16'], [H]),
  # evaluate
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/nothing-here'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/copy'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--extension=yarn'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--extension=pi', '--factor=0.5'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--extension=pi', '--factor=nan'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--stride=1.5'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--protocol=bogus'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--tokens=0'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--batch_size=0'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--lengths=100000'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--tokens=99999999'], [H]),
  ('evaluate', ['experiments.evaluate', f'--collect={H}/nothing', '--lengths=32', f'--output={H}/collected'], [H]),
  ('evaluate', ['experiments.evaluate', f'--collect={H}/nothing', '--lengths=32'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope,{H}/copy', '--lengths=32', '--tokens=500'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--lengths=32', '--tokens=600', '--name=taken'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--position=interpolation_factor=2'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/sinus', '--position=interpolation_factor=0'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/sinus', '--position=interpolation_factor=2,interpolation_factor=3'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/rope', '--output=/etc/hostname/x'], [H]),
  ('evaluate', ['experiments.evaluate', f'--workdir={H}/damaged'], [H]),
  # exact_match
  ('exact_match', ['experiments.exact_match', f'--workdir={H}/rope'], [H]),
  ('exact_match', ['experiments.exact_match', f'--workdir={H}/copy', '--lengths=0-3'], [H]),
  ('exact_match', ['experiments.exact_match', f'--workdir={H}/copy', '--lengths=3-1'], [H]),
  ('exact_match', ['experiments.exact_match', f'--workdir={H}/learned', '--lengths=1-100'], [H]),
  ('exact_match', ['experiments.exact_match', f'--workdir={H}/copy', '--output=/nonexistent-dir/x.json'], [H]),
  ('exact_match', ['experiments.exact_match', f'--workdir={H}/corrupt-result'], [H]),
  ('exact_match', ['experiments.exact_match', f'--workdir={H}/damaged'], [H]),
  # analyze
  ('analyze', ['experiments.analyze', f'--workdir={H}/nothing-here'], [H]),
  ('analyze', ['experiments.analyze', f'--workdir={H}/damaged'], [H]),
  ('analyze', ['experiments.analyze', f'--workdir={H}/copy', '--text=hello'], [H]),
  ('analyze', ['experiments.analyze', f'--workdir={H}/lstm'], [H]),
  ('analyze', ['experiments.analyze', f'--workdir={H}/learned', '--length=500'], [H]),
  ('analyze', ['experiments.analyze'], [H]),
  # rank
  ('rank', ['experiments.rank', f'--sweeps={H}/nothing-here'], [H]),
  ('rank', ['experiments.rank', f'--sweeps={H}/empty'], [H]),
  ('rank', ['experiments.rank', f'--sweeps={H}/sweep', '--metric=bogus'], [H]),
  ('rank', ['experiments.rank', f'--sweeps={H}/sweep', '--output=/proc/forbidden.md'], [H]),
  # benchmark
  ('benchmark', ['experiments.benchmark', 'step', '--positions=bogus'], [H]),
  ('benchmark', ['experiments.benchmark', 'step', '--lengths=abc'], [H]),
  ('benchmark', ['experiments.benchmark', 'step', '--num_heads=3'], [H]),
  ('benchmark', ['experiments.benchmark', 'step', '--peak_flops=nan'], [H]),
  ('benchmark', ['experiments.benchmark', 'attention', '--num_heads=0'], [H]),
  ('benchmark', ['experiments.benchmark', 'matmul', '--length=1'], [H]),
  ('benchmark', ['experiments.benchmark', 'seeds', '--seeds=0'], [H]),
  ('benchmark', ['experiments.benchmark', 'nonsense'], [H]),
  # compare
  ('compare', ['experiments.compare', *SMOKE, f'--workdir={H}/cmp', '--seeds=0'], [H]),
  ('compare', ['experiments.compare', *SMOKE, f'--workdir={H}/cmp', '--positions=bogus'], [H]),
  ('compare', ['experiments.compare', *SMOKE, f'--workdir={H}/cmp', '--positions=none,rope', '--reference=alibi'], [H]),
  ('compare', ['experiments.compare', *SMOKE, f'--workdir={H}/cmp', '--positions=none,shaw', '--config.model.attention_implementation=pallas'], [H]),
  # translate
  ('translate', ['experiments.translate', f'--workdir={H}/copy'], [H]),
  ('translate', ['experiments.translate', f'--workdir={H}/copy', '--beam=1'], [H]),
]


def prepare():
  """The runs and files the cases read, made once under H."""
  def train(name, *arguments):
    if not os.path.exists(os.path.join(H, name, 'summary.json')):
      subprocess.run([PY, '-m', 'experiments.train', *arguments, f'--workdir={H}/{name}'], cwd=ROOT, env=ENV,
                     check=True, capture_output=True)
  os.makedirs(H, exist_ok=True)
  shakespeare = [a.replace('configs/', os.path.join(ROOT, 'configs') + '/') for a in SH]
  train('rope', *shakespeare, '--config.model.position.kind=rope')
  train('sinus', *shakespeare, '--config.model.position.kind=sinusoidal')
  train('copy', *SMOKE)
  train('learned', *SMOKE, '--config.model.position.kind=learned')
  train('lstm', *SMOKE, '--config.model.architecture=lstm')
  if not os.path.exists(f'{H}/damaged'):
    shutil.copytree(f'{H}/rope', f'{H}/damaged')
    import glob
    victim = max((p for p in glob.glob(f'{H}/damaged/checkpoints/10/**/*', recursive=True) if os.path.isfile(p)),
                 key=os.path.getsize)
    data = bytearray(open(victim, 'rb').read())
    data[len(data) // 2] ^= 1
    open(victim, 'wb').write(bytes(data))
  if not os.path.exists(f'{H}/corrupt-result'):
    shutil.copytree(f'{H}/copy', f'{H}/corrupt-result')
    with open(f'{H}/corrupt-result/greedy_exact_match.json', 'w') as file:
      file.write('{"examples": 100, "exact_ma')
  os.makedirs(f'{H}/empty', exist_ok=True)
  for name, run in (('sinusoidal-seed0', 'copy'), ('learned-seed0', 'learned')):
    if not os.path.exists(f'{H}/sweep/{name}'):
      shutil.copytree(f'{H}/{run}', f'{H}/sweep/{name}')
  subprocess.run([PY, '-m', 'experiments.evaluate', f'--workdir={H}/rope', '--lengths=32', '--tokens=500',
                  '--name=taken'], cwd=ROOT, env=ENV, capture_output=True, check=True)


def main():
  rows = []
  for number, (name, argv, watch) in enumerate(CASES, 1):
    before = snapshot(watch)
    done = subprocess.run([PY, '-m', *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    after = snapshot(watch)
    lines = [l for l in done.stderr.splitlines() if l.strip()]
    last = lines[-1] if lines else (done.stdout.strip().splitlines() or [''])[-1]
    shown = ' '.join(a.replace(ROOT + '/', '') for a in argv)
    rows.append((number, shown, done.returncode, len(lines), last[:230], describe(before, after)))
    print(json.dumps(rows[-1]), flush=True)



def sequences():
  """Other orders of events: each a setup, then the command whose exit code and effect are reported."""
  import time
  rows = []
  def run(argv, watch, setup=None, label=''):
    if setup: setup()
    before = snapshot(watch)
    done = subprocess.run([PY, '-m', *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    after = snapshot(watch)
    lines = [l for l in done.stderr.splitlines() if l.strip()]
    last = lines[-1] if lines else (done.stdout.strip().splitlines() or [''])[-1]
    rows.append((f'S{len(rows) + 1}', label + ' ' + ' '.join(a.replace(ROOT + '/', '') for a in argv), done.returncode,
                 len(lines), last[:230], describe(before, after)))
    print(json.dumps(rows[-1]), flush=True)
  # 1. a torn results.jsonl tail (evaluate killed while appending), then the same evaluate with one more length
  ev = f'{H}/rope/evaluations/none-windows-800'
  def tear():
    subprocess.run([PY, '-m', 'experiments.evaluate', f'--workdir={H}/rope', '--lengths=32', '--tokens=800', '--protocol=windows'], cwd=ROOT, env=ENV, capture_output=True)
    with open(f'{ev}/results.jsonl', 'a') as f: f.write('{"length": 64, "bits_per_charac')
  run(['experiments.evaluate', f'--workdir={H}/rope', '--lengths=32,64', '--tokens=800', '--protocol=windows'], [ev], tear, '[torn tail]')
  # 2. kill -9 inside an evaluate, then the same command
  def killed():
    p = subprocess.Popen([PY, '-m', 'experiments.evaluate', f'--workdir={H}/sinus', '--lengths=32,64,128,256', '--tokens=20000'], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(9); p.kill(); p.wait()
  run(['experiments.evaluate', f'--workdir={H}/sinus', '--lengths=32,64,128,256', '--tokens=20000'], [f'{H}/sinus'], killed, '[after kill -9 at 9 s]')
  # 3. exact_match, the run trained further, exact_match again: another checkpoint, refused, the file kept
  shutil.rmtree(f'{H}/further', ignore_errors=True)
  shutil.copytree(f'{H}/copy', f'{H}/further'); shutil.rmtree(f'{H}/further/analysis', ignore_errors=True)
  def further():
    subprocess.run([PY, '-m', 'experiments.exact_match', f'--workdir={H}/further', '--lengths=1-2', '--examples=8'], cwd=ROOT, env=ENV, capture_output=True)
    subprocess.run([PY, '-m', 'experiments.train', '--config=configs/smoke.py', f'--workdir={H}/further', '--config.train.steps=30'], cwd=ROOT, env=ENV, capture_output=True)
  run(['experiments.exact_match', f'--workdir={H}/further', '--lengths=1-2', '--examples=8'], [f'{H}/further/greedy_exact_match.json'], further, '[after training on to step 30]')
  # 4. the same with --output elsewhere: measured, the old file kept
  run(['experiments.exact_match', f'--workdir={H}/further', '--lengths=1-2', '--examples=8', f'--output={H}/further/at30.json'], [f'{H}/further'], None, '[--output elsewhere]')
  # 5. fine-tune started (init_from.json written, killed before its first checkpoint), source then trained on
  shutil.rmtree(f'{H}/src', ignore_errors=True); shutil.rmtree(f'{H}/tuned', ignore_errors=True)
  shutil.copytree(f'{H}/copy', f'{H}/src'); shutil.rmtree(f'{H}/src/analysis', ignore_errors=True)
  def moved_on():
    os.makedirs(f'{H}/tuned')
    with open(f'{H}/tuned/init_from.json', 'w') as f: json.dump(dict(workdir=f'{H}/src', step=20, finished_step=20), f)
    subprocess.run([PY, '-m', 'experiments.train', '--config=configs/smoke.py', f'--workdir={H}/src', '--config.train.steps=30'], cwd=ROOT, env=ENV, capture_output=True)
  run(['experiments.train', '--config=configs/smoke.py', f'--workdir={H}/tuned', f'--config.train.init_from={H}/src'], [f'{H}/tuned', f'{H}/src'], moved_on, '[source trained on after the fine-tune started]')
  # 6. seeds in one program killed inside a save: seed 1's step 20 missing, no summaries
  shutil.rmtree(f'{H}/seeds', ignore_errors=True)
  def cut():
    subprocess.run([PY, '-m', 'experiments.train', '--config=configs/smoke.py', f'--workdir={H}/seeds/s{{seed}}', '--seeds=2'], cwd=ROOT, env=ENV, capture_output=True)
    shutil.rmtree(f'{H}/seeds/s1/checkpoints/20'); os.remove(f'{H}/seeds/s1/checkpoints.digests/20.json')
    for s in (0, 1): os.remove(f'{H}/seeds/s{s}/summary.json')
  run(['experiments.train', '--config=configs/smoke.py', f'--workdir={H}/seeds/s{{seed}}', '--seeds=2'], [f'{H}/seeds'], cut, '[seeds cut inside a save]')
  # 7. a second train on a workdir while the first runs
  shutil.rmtree(f'{H}/busy', ignore_errors=True)
  holder = {}
  def busy():
    holder['p'] = subprocess.Popen([PY, '-m', 'experiments.train', '--config=configs/smoke.py', f'--workdir={H}/busy', '--config.train.steps=400'], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(12)
  run(['experiments.train', '--config=configs/smoke.py', f'--workdir={H}/busy', '--config.train.steps=400'], [], busy, '[while another holds it]')
  holder['p'].terminate(); holder['p'].wait()
  # 8. evaluate on a run whose config.json was removed after training
  shutil.rmtree(f'{H}/norecord', ignore_errors=True); shutil.copytree(f'{H}/sinus', f'{H}/norecord'); os.remove(f'{H}/norecord/config.json')
  run(['experiments.evaluate', f'--workdir={H}/norecord', '--lengths=32', '--tokens=500'], [f'{H}/norecord'], None, '[config.json removed]')
  # 9. two evaluations asked under one --name in two commands (the second another method)
  run(['experiments.evaluate', f'--workdir={H}/rope', '--lengths=32', '--tokens=500', '--extension=pi', '--factor=2', '--name=taken'], [f'{H}/rope'], None, '[name taken by another evaluation]')
  return rows

if __name__ == '__main__':
  prepare()
  main()
  sequences()
