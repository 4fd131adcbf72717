"""experiments.compare: one command over variants and seeds; failures reported; kill and rerun."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from experiments.results import error_line

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _environment() -> dict:
  return dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1', JAX_PLATFORMS='cpu',
              PYTHONPATH=str(ROOT))


def _compare(workdir, *extra):
  return [sys.executable, '-m', 'experiments.compare', '--config=configs/smoke.py', '--positions=none,alibi',
          '--seeds=1', f'--workdir={workdir}', '--config.train.steps=10', '--config.train.eval_every=10', *extra]


def test_a_failing_variant_is_reported_and_the_others_finish(tmp_path):
  (tmp_path / 'failures.json').write_text(json.dumps({'rope-seed3': 'exit code 1: from another sweep'}))
  command = [sys.executable, '-m', 'experiments.compare', '--config=configs/smoke.py', '--positions=learned,none',
             '--seeds=1', f'--workdir={tmp_path}', '--config.train.steps=10', '--config.model.position.max_length=8']
  result = subprocess.run(command, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  table = (tmp_path / 'results.md').read_text()
  assert '| none | ' in table and '### Failed runs' in table
  assert '`learned-seed0`: exit code 2: error: model.position.max_length: got 8' in table
  assert (tmp_path / 'results.csv').read_text().count('failed: exit code 2') == 1
  assert 'rope-seed3' not in table  # a failure outside this sweep's runs is not this table's
  for name in ('plot_token_accuracy.png', 'plot_sequence_accuracy.png', 'training_curves.png'):
    assert (tmp_path / name).stat().st_size > 1000


def test_killed_sweep_resumes_without_retraining_and_gives_the_same_table(tmp_path):
  uninterrupted = subprocess.run(_compare(tmp_path / 'whole'), cwd=ROOT, env=_environment(), capture_output=True,
                                 text=True, timeout=900)
  assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]

  sweep = tmp_path / 'killed'
  process = subprocess.Popen(_compare(sweep), cwd=ROOT, env=_environment(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
  deadline = time.time() + 600
  while not (sweep / 'none-seed0' / 'summary.json').exists() and time.time() < deadline:
    time.sleep(0.1)
  os.killpg(process.pid, signal.SIGKILL)  # compare and the run it was training, mid-sweep
  process.wait()
  finished_before = {p.parent.name: p.stat().st_mtime_ns for p in sweep.glob('*/summary.json')}
  assert 'none-seed0' in finished_before and 'alibi-seed0' not in finished_before
  assert not (sweep / 'results.md').exists()

  rerun = subprocess.run(_compare(sweep), cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=900)
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  for name, mtime in finished_before.items():
    assert f'{name}: finished earlier, skipped' in rerun.stderr
    assert (sweep / name / 'summary.json').stat().st_mtime_ns == mtime
  assert (sweep / 'results.md').read_text() == (tmp_path / 'whole' / 'results.md').read_text()
  assert (sweep / 'results.csv').read_text() == (tmp_path / 'whole' / 'results.csv').read_text()


def test_a_forecast_sweep_tabulates_errors_beside_its_baselines_and_an_lstm_row(tmp_path):
  command = [sys.executable, '-m', 'experiments.compare', '--config=configs/forecast.py:sunspots',
             '--positions=rope', '--baselines=lstm', '--seeds=1', f'--workdir={tmp_path}', '--config.train.steps=4',
             '--config.train.eval_every=4', '--config.model.model_dim=16', '--config.model.feed_forward_dim=32',
             '--config.task.eval_lengths=(16,32)']
  result = subprocess.run(command, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  table = (tmp_path / 'results.md').read_text()
  assert '### mae by evaluation length (lower is better' in table and '### mse by evaluation length' in table
  recorded = [json.loads(line) for line in (tmp_path / 'rope-seed0' / 'metrics.jsonl').read_text().splitlines()]
  final = next(r for r in recorded if r['split'] == 'eval' and r['length'] == 32)
  for baseline in ('naive', 'seasonal_naive'):
    row = next(line for line in table.split('### mse')[0].splitlines() if line.startswith(f'| {baseline} (baseline)'))
    assert f'{final[baseline + "_mae"]:.3f}' in row.split('|')[3]  # the column of length 32
  assert (tmp_path / 'plot_mae.png').stat().st_size > 1000
  lstm = json.loads((tmp_path / 'lstm-seed0' / 'config.json').read_text())
  assert lstm['model']['architecture'] == 'lstm'
  recorded = [json.loads(line) for line in (tmp_path / 'lstm-seed0' / 'metrics.jsonl').read_text().splitlines()]
  final = next(r for r in recorded if r['split'] == 'eval' and r['length'] == 32)
  row = next(line for line in table.splitlines() if line.startswith('| lstm |'))
  assert f'{final["mae"]:.3f}' in row.split('|')[3]


def test_an_unknown_baseline_is_named_before_anything_trains(tmp_path):
  result = subprocess.run(_compare(tmp_path, '--baselines=lstm,gru'), cwd=ROOT, env=_environment(),
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 2
  assert "--baselines: got 'lstm,gru'; valid: empty, or a comma-separated list of lstm, rnn" in result.stderr
  assert not list(tmp_path.iterdir())


def test_the_reported_error_is_the_exception_not_the_traceback_around_it():
  traceback = ['I1130 step 100 loss 0.1', 'Traceback (most recent call last):', '  File "x.py", line 3',
               'ValueError: sequence length 513 is longer than the learned position table (512 rows)',
               '--------------------', 'For simplicity, JAX has removed its internal frames from the traceback.']
  assert error_line(traceback).startswith('ValueError: sequence length 513')
  assert error_line(['W warning', 'error: model.num_heads: got 3', '']) == 'error: model.num_heads: got 3'
  assert error_line(['Killed']) == 'Killed' and error_line([]) == 'no output'
