"""The command line, in real subprocesses: SIGTERM and resume, two hosts on loopback; the uninterrupted runs they
are compared with, and the restarts, in forks of the command server. (The table of bad configurations is in
test_robustness.py.)"""

import json
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from experiments.runs.metrics import read_metrics, without_wall_clock

from tests import command_server
from tests.helpers import subprocess_environment

ROOT = pathlib.Path(__file__).resolve().parent.parent


_environment = subprocess_environment


def _command(workdir, *overrides, config='configs/smoke.py'):
  return [sys.executable, '-m', 'experiments.train', f'--config={config}', f'--workdir={workdir}', *overrides]


def _train(workdir, *overrides, devices=1, config='configs/smoke.py'):
  """A run to completion, in a fork of the command server (tests/command_server.py): what the signalled commands and
  the processes on loopback are compared with, and the restarts after a signal."""
  return command_server.run(_command(workdir, *overrides, config=config), cwd=ROOT, env=_environment(devices),
                            capture_output=True, text=True, timeout=300)


def test_missing_config_file_and_missing_workdir_are_one_line_errors(tmp_path):
  result = subprocess.run(_command(tmp_path / 'run', config='configs/nothere.py'), cwd=ROOT, env=_environment(),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and result.stderr.count('\n') == 1
  assert result.stderr.startswith("error: --config: got 'configs/nothere.py'; valid: a config file")
  result = subprocess.run([sys.executable, '-m', 'experiments.train', '--config=configs/smoke.py'], cwd=ROOT,
                          env=_environment(), capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and result.stderr.startswith('error: --workdir: missing')
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_sigterm_saves_and_a_restart_matches_an_uninterrupted_run(tmp_path):
  steps = ['--config.train.steps=60', '--config.train.log_every=1', '--config.train.eval_every=30',
           '--config.train.checkpoint_every=100']
  full = _train(tmp_path / 'full', *steps)
  assert full.returncode == 0, full.stderr[-2000:]

  interrupted = tmp_path / 'interrupted'
  process = subprocess.Popen(_command(interrupted, *steps), cwd=ROOT, env=_environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  metrics = interrupted / 'metrics.jsonl'
  deadline = time.time() + 120
  while not (metrics.exists() and metrics.read_text().count('\n') >= 3) and time.time() < deadline:
    time.sleep(0.05)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-2000:]
  assert 'SIGTERM received' in stderr
  stopped_at = [r['step'] for r in read_metrics(str(interrupted))][-1]
  assert 3 <= stopped_at < 60, stopped_at
  assert (interrupted / 'checkpoints' / str(stopped_at)).is_dir()

  resumed = _train(interrupted, *steps)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f'resuming from the checkpoint at step {stopped_at}' in resumed.stderr
  assert without_wall_clock(read_metrics(str(interrupted))) == without_wall_clock(read_metrics(str(tmp_path / 'full')))


def _catches(pid: int, sig) -> bool:
  """Whether the process has a handler installed for sig (Linux: SigCgt in /proc/PID/status)."""
  status = pathlib.Path(f'/proc/{pid}/status').read_text()
  caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith('SigCgt:')), 16)
  return bool(caught >> (sig - 1) & 1)


@pytest.mark.slow
@pytest.mark.parametrize('stop,when', [(signal.SIGINT, 'importing'), (signal.SIGTERM, 'compiling')])
def test_a_stop_during_start_up_exits_cleanly_and_the_rerun_is_the_uninterrupted_run(tmp_path, stop, when):
  """Ctrl-C or SIGTERM while the command imports JAX or compiles: exit code 0, no traceback, nothing
  half-written; the same command then trains the run as if nothing had happened."""
  run = tmp_path / 'run'
  process = subprocess.Popen(_command(run), cwd=ROOT, env=_environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  if when == 'importing':  # once the command's handler is in (the first thing it does), while it imports JAX
    deadline = time.time() + 60
    while not _catches(process.pid, signal.SIGTERM) and time.time() < deadline:
      time.sleep(0.005)
  else:
    deadline = time.time() + 120
    while not (run / 'config.json').exists() and time.time() < deadline:
      time.sleep(0.01)
  process.send_signal(stop)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-2000:]
  assert 'Traceback' not in stderr and f'{stop.name} received' in stderr, stderr[-2000:]
  assert not list(tmp_path.glob('**/*.tmp'))
  resumed = _train(run)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  whole = _train(tmp_path / 'whole')
  assert whole.returncode == 0, whole.stderr[-2000:]
  assert without_wall_clock(read_metrics(str(run))) == without_wall_clock(read_metrics(str(tmp_path / 'whole')))


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('localhost', 0))
    return probe.getsockname()[1]


# The shipped corpus at the smoke config's size: each process reads only its rows of every batch, and the unigram
# baseline, summed on the hosts, is added up over the processes.
SMALL_CORPUS = ['--config.task.max_length=16', '--config.task.eval_lengths=(16,32)', '--config.task.eval_batches=1',
                '--config.model.model_dim=32', '--config.model.num_heads=2', '--config.model.feed_forward_dim=64',
                '--config.model.num_decoder_layers=1', '--config.model.position.max_length=32',
                '--config.train.steps=20', '--config.train.warmup_steps=5', '--config.train.eval_every=10',
                '--config.train.checkpoint_every=10']
PROCESS_PLACEMENTS = {  # name: (config, overrides, devices per process); the single process has the same device count
    'pmap': ('configs/smoke.py', ['--config.parallel.mode=pmap'], 1),
    'mesh, corpus': ('configs/corpus.py', ['--config.parallel.mode=mesh', *SMALL_CORPUS], 1),
    # parameters split over all 8 devices of both processes: gathered across them for every checkpoint
    'mesh, fsdp=8 across 2 x 4 devices': ('configs/smoke.py', ['--config.parallel.mode=mesh',
                                                               '--config.parallel.fsdp=8'], 4),
}


@pytest.mark.slow
@pytest.mark.parametrize('placement', PROCESS_PLACEMENTS)
def test_two_processes_on_loopback_match_one_process(tmp_path, placement):
  config, overrides, per_process = PROCESS_PLACEMENTS[placement]
  common = [*overrides, '--config.train.log_every=1']
  single = _train(tmp_path / 'single', *common, devices=2 * per_process, config=config)
  assert single.returncode == 0, single.stderr[-2000:]
  address = f'localhost:{_free_port()}'
  processes = [subprocess.Popen(
      _command(tmp_path / 'multi', *common, f'--coordinator_address={address}', '--num_processes=2',
               f'--process_id={index}', config=config),
      cwd=ROOT, env=_environment(devices=per_process), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for index in range(2)]
  outputs = [p.communicate(timeout=300) for p in processes]
  for process, (_, stderr) in zip(processes, outputs):
    assert process.returncode == 0, stderr[-3000:]
  assert 'process 1 of 2' in outputs[1][1]
  multi, one = (without_wall_clock(read_metrics(str(tmp_path / run))) for run in ('multi', 'single'))
  assert len(multi) == len(one) > 20
  for got, expected in zip(multi, one):  # every metric, the evaluations' host-side sums too
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
      if isinstance(value, float):
        assert got[name] == pytest.approx(value, rel=1e-5), (name, got, expected)
      else:
        assert got[name] == value, (name, got, expected)
  started = json.loads((tmp_path / 'multi' / 'placements.jsonl').read_text().splitlines()[0])
  assert (started['processes'], started['devices']) == (2, 2 * per_process)
