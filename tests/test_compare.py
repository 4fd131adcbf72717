"""experiments.compare: one command over variants and seeds; failures reported; kill and rerun."""

import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from experiments.shared import plots
from experiments.sweeps import results
from experiments.sweeps.results import error_line

from tests import command_server
from tests.helpers import subprocess_environment

ROOT = pathlib.Path(__file__).resolve().parent.parent


_environment = subprocess_environment


def _compare(workdir, *extra):
  return [sys.executable, '-m', 'experiments.compare', '--config=configs/smoke.py', '--positions=none,alibi',
          '--seeds=1', f'--workdir={workdir}', '--config.train.steps=10', '--config.train.eval_every=10', *extra]


@pytest.mark.slow
def test_a_failing_variant_is_reported_and_the_others_finish(tmp_path):
  (tmp_path / 'failures.json').write_text(json.dumps({'rope-seed3': 'exit code 1: from another sweep'}))
  (tmp_path / 'alibi-seed0').mkdir()
  with open(tmp_path / 'alibi-seed0' / '.lock', 'a') as holder:  # another job holds this run's workdir
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    command = [sys.executable, '-m', 'experiments.compare', '--config=configs/smoke.py', '--positions=alibi,none',
               '--seeds=1', f'--workdir={tmp_path}', '--config.train.steps', '10']  # the space form of an override
    result = command_server.run(command, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=600)
  assert result.returncode == 1, result.stderr[-2000:]
  assert 'sweep done in' in result.stderr and 'with 1 of 2 runs failed' in result.stderr
  table = (tmp_path / 'results.md').read_text()
  assert table.startswith('Every run: `--config.train.steps=10`\n\n### ')  # the override the rows all had
  assert '| none | ' in table and '### Failed runs' in table
  assert '`alibi-seed0`: exit code 2: error: workdir' in table and 'is in use by a running job' in table
  assert (tmp_path / 'results.csv').read_text().count('failed: exit code 2') == 1
  assert 'rope-seed3' not in table  # a failure outside this sweep's runs is not this table's
  assert json.loads((tmp_path / 'none-seed0' / 'config.json').read_text())['train']['steps'] == 10
  for name in ('plot_token_accuracy.png', 'plot_sequence_accuracy.png', 'training_curves.png'):
    assert (tmp_path / name).stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize('extra,expected', [
    (['--positions=learned,none', '--config.model.position.max_length=8'],
     'error: learned-seed0: model.position.max_length: got 8; valid: at least 26'),
    (['--config.seed=3'], 'error: --config.seed: set per run by --seeds in a sweep; valid: drop it and use --seeds'),
    (['--config.train.stpes=3'], 'error: --config.train.stpes: unknown config field (did you mean train.steps?)'),
    (['--positions=none,none'], "error: --positions: got 'none,none'; valid: all, or a comma-separated list (each once)"),
    (['--reference=rope'], "error: --reference: got 'rope'; valid: one of the sweep's rows, none, alibi"),
    (['--jobs=0'], 'error: --jobs: got 0; valid: a positive integer'),
    (['--jobs=1', f'--cores_per_run={len(os.sched_getaffinity(0)) + 1}'],
     f'error: --jobs: got 1 with --cores_per_run={len(os.sched_getaffinity(0)) + 1}, '
     f'{len(os.sched_getaffinity(0)) + 1} cores; valid: --jobs x --cores_per_run at most '
     f'{len(os.sched_getaffinity(0))}, the CPU cores this process may use'),
    (['--jobs=2', '--launcher=slurm'],
     "error: --jobs: got 2; valid: 1 with --launcher=slurm (the array's tasks run at once already)"),
])
def test_a_bad_sweep_is_refused_in_one_line_before_any_run_starts(tmp_path, extra, expected):
  result = command_server.run(_compare(tmp_path / 'sweep', *extra), cwd=ROOT, env=_environment(), capture_output=True,
                              text=True, timeout=300)
  assert result.returncode == 2
  assert result.stderr.splitlines() == [result.stderr.splitlines()[0]] and result.stderr.startswith(expected), \
      result.stderr
  assert not (tmp_path / 'sweep').exists()


@pytest.mark.slow
def test_killed_sweep_resumes_without_retraining_and_gives_the_table_of_an_uninterrupted_one_in_two_jobs(tmp_path):
  """One uninterrupted sweep in two jobs side by side; one in one job, killed mid-sweep and rerun: the rerun
  trains only what had not finished, and both give the same table."""
  uninterrupted = command_server.run(_compare(tmp_path / 'whole', '--jobs=2'), cwd=ROOT, env=_environment(),
                                     capture_output=True, text=True, timeout=900)
  assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]
  second_started = uninterrupted.stderr.index('[program 2/2] alibi-seed0: training in job 2 of 2')
  assert second_started < uninterrupted.stderr.index('none-seed0: finished (')  # side by side, not in turn
  for run in ('none-seed0', 'alibi-seed0'):
    assert (tmp_path / 'whole' / run / 'train.log').read_text().splitlines()[0].endswith(')')

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

  rerun = command_server.run(_compare(sweep), cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=900)
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  assert 'job 2 of 2' not in rerun.stderr
  for name, mtime in finished_before.items():
    assert f'{name}: finished earlier with this configuration, skipped' in rerun.stderr
    assert (sweep / name / 'summary.json').stat().st_mtime_ns == mtime
  assert (sweep / 'results.md').read_text() == (tmp_path / 'whole' / 'results.md').read_text()
  assert (sweep / 'results.csv').read_text() == (tmp_path / 'whole' / 'results.csv').read_text()

  before = {str(p): p.stat().st_mtime_ns for p in sweep.glob('**/*') if p.is_file()}
  other = command_server.run(_compare(sweep, '--config.task.max_length=5'), cwd=ROOT, env=_environment(),
                             capture_output=True, text=True, timeout=300)  # a sweep of another configuration
  assert other.returncode == 2
  assert other.stderr.splitlines() == [
      f"error: {name}: task.max_length: the run in {sweep / name} has 6, this command asks for 5 (this field may not "
      f"change in a run); use a new --workdir, or the run's own configuration (config.json there)"
      for name in ('none-seed0', 'alibi-seed0')]
  assert {str(p): p.stat().st_mtime_ns for p in sweep.glob('**/*') if p.is_file()} == before


@pytest.mark.slow
def test_a_forecast_sweep_tabulates_errors_beside_its_baselines_and_an_lstm_row(tmp_path):
  command = [sys.executable, '-m', 'experiments.compare', '--config=configs/forecast.py:sunspots',
             '--positions=rope', '--baselines=lstm', '--seeds=1', f'--workdir={tmp_path}', '--config.train.steps=4',
             '--config.train.eval_every=4', '--config.model.model_dim=16', '--config.model.feed_forward_dim=32',
             '--config.task.eval_lengths=(16,32)']
  result = command_server.run(command, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=600)
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


@pytest.mark.slow
def test_an_unknown_baseline_is_named_before_anything_trains(tmp_path):
  result = command_server.run(_compare(tmp_path, '--baselines=lstm,gru'), cwd=ROOT, env=_environment(),
                              capture_output=True, text=True, timeout=600)
  assert result.returncode == 2
  assert "--baselines: got 'lstm,gru'; valid: empty, or a comma-separated list (each once) of lstm, rnn" in result.stderr
  assert not list(tmp_path.iterdir())


def test_the_reported_error_is_the_exception_not_the_traceback_around_it():
  traceback = ['I1130 step 100 loss 0.1', 'Traceback (most recent call last):', '  File "x.py", line 3',
               'ValueError: sequence length 513 is longer than the learned position table (512 rows)',
               '--------------------', 'For simplicity, JAX has removed its internal frames from the traceback.']
  assert error_line(traceback).startswith('ValueError: sequence length 513')
  assert error_line(['W warning', 'error: model.num_heads: got 3', '']) == 'error: model.num_heads: got 3'
  assert error_line(['Killed']) == 'Killed' and error_line([]) == 'no output'


def _wait_for(condition, timeout=300):
  deadline = time.time() + timeout
  while not condition():
    assert time.time() < deadline, 'timed out'
    time.sleep(0.05)


def _pid_of_run(workdir) -> int:
  return int((workdir / '.lock').read_text().split()[1])


def _alive(pid) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return not open(f'/proc/{pid}/stat').read().split(') ')[1].startswith('Z')


@pytest.mark.slow
def test_stopping_a_sweep_stops_its_run_cleanly_and_a_rerun_resumes(tmp_path):
  """SIGTERM to compare is passed on: the run checkpoints and exits, compare exits 0. kill -9 of compare
  leaves no run behind either (its child is sent SIGTERM when it dies). A rerun resumes the run."""
  sweep = tmp_path / 'sweep'
  command = _compare(sweep, '--positions=none', '--config.train.steps=100000', '--config.train.log_every=1')
  run = sweep / 'none-seed0'
  for stop in (signal.SIGTERM, signal.SIGKILL):
    logged = (run / 'metrics.jsonl').read_text().count('\n') if run.exists() else 0
    process = subprocess.Popen(command, cwd=ROOT, env=_environment(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (run / 'metrics.jsonl').exists() and (run / 'metrics.jsonl').read_text().count('\n') > logged + 2)
    child = _pid_of_run(run)
    process.send_signal(stop)
    _, stderr = process.communicate(timeout=120)
    if stop == signal.SIGTERM:
      assert process.returncode == 0, stderr[-2000:]
      assert 'SIGTERM received: none-seed0 stopped at its checkpoint; rerun the same command to resume' in stderr
      assert not _alive(child)
    else:
      _wait_for(lambda: not _alive(child), timeout=120)
    assert not (sweep / 'failures.json').exists() or 'none-seed0' not in (sweep / 'failures.json').read_text()
  log = (run / 'train.log').read_text()
  assert log.count('=== ') == 2 and log.count('SIGTERM received: saved a checkpoint at step') == 2
  assert 'resuming from the checkpoint at step' in log.split('=== ')[2]
  stopped_at = [r['step'] for r in results._records(str(run))][-1]
  assert stopped_at >= 6 and max(int(n) for n in os.listdir(run / 'checkpoints')) == stopped_at


def _fake_run(sweep, name, config, metrics_text):
  workdir = sweep / name
  workdir.mkdir(parents=True)
  (workdir / 'config.json').write_text(json.dumps(config))
  (workdir / 'metrics.jsonl').write_text(metrics_text)
  (workdir / 'summary.json').write_text(json.dumps({'step': config['train']['steps'], 'evaluation': {}}))


def test_the_table_refuses_a_run_of_another_configuration_and_names_damaged_metrics(tmp_path):
  config = {'seed': 0, 'task': {'max_length': 6}, 'train': {'steps': 10}, 'model': {'position': {'kind': 'none'}}}
  record = json.dumps({'step': 10, 'split': 'eval', 'length': 6, 'token_accuracy': 0.5}) + '\n'
  _fake_run(tmp_path, 'none-seed0', config, record)
  assert results.aggregate(str(tmp_path), ['none'], 1, expected={'none-seed0': config}).values == {
      'none': {6: {'token_accuracy': [0.5]}}}
  other = json.loads(json.dumps(config))
  other['train']['steps'] = 20
  with pytest.raises(results.ResultsError, match="none-seed0: its configuration differs from the sweep's "
                                                 r"\(train.steps: 10 there, 20 asked for\)"):
    results.aggregate(str(tmp_path), ['none'], 1, expected={'none-seed0': other})
  (tmp_path / 'none-seed0' / 'metrics.jsonl').write_text('{"step": 5, "spl\n' + record)
  with pytest.raises(results.ResultsError, match='none-seed0/metrics.jsonl: line 1 is not a JSON record'):
    results.aggregate(str(tmp_path), ['none'], 1)


def test_every_row_of_a_sweep_of_up_to_twenty_variants_is_drawn_its_own_way():
  styles = [tuple(sorted(plots.line_style(index).items())) for index in range(20)]
  assert len(set(styles)) == 20
