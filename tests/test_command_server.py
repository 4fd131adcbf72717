"""The forking server the command tests run through answers as a process of the command's own would."""

import json
import subprocess
import sys

import pytest

from tests import command_server
from tests.helpers import ROOT, subprocess_environment


def _both(command, **kwargs):
  forked = command_server.run(command, capture_output=True, text=True, timeout=300, **kwargs)
  alone = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
  return forked, alone


def test_a_refused_command_gives_the_exit_status_and_output_of_its_own_process(tmp_path):
  command = [sys.executable, '-m', 'experiments.train', '--config=configs/smoke.py', '--config.model.num_heads=3',
             f'--workdir={tmp_path / "run"}']
  forked, alone = _both(command, cwd=ROOT, env=subprocess_environment())
  assert forked.returncode == alone.returncode == 2
  assert forked.stderr == alone.stderr and forked.stdout == alone.stdout
  assert 'model.num_heads: got 3' in forked.stderr
  assert not (tmp_path / 'run').exists()


def test_the_command_runs_in_its_working_directory_and_a_traceback_exits_1(tmp_path):
  (tmp_path / 'data.json').write_text('{"b": 1, "a": [2, 3]}')
  forked, alone = _both([sys.executable, '-m', 'json.tool', '--sort-keys', 'data.json'], cwd=tmp_path,
                        env=subprocess_environment())
  assert forked.returncode == alone.returncode == 0
  assert forked.stdout == alone.stdout and json.loads(forked.stdout) == {'a': [2, 3], 'b': 1}
  (tmp_path / 'bad.json').write_text('{')
  forked, alone = _both([sys.executable, '-m', 'json.tool', 'bad.json'], cwd=tmp_path, env=subprocess_environment())
  assert forked.returncode == alone.returncode == 1 and forked.stderr == alone.stderr
  crashed = command_server.run([sys.executable, '-m', 'timeit', '-n', '1', 'raise ValueError("boom")'],
                               cwd=tmp_path, env=subprocess_environment(), capture_output=True, text=True)
  assert crashed.returncode == 1 and 'ValueError: boom' in crashed.stderr


def test_a_command_past_its_timeout_is_killed_and_raises_as_subprocess_run_does(tmp_path):
  with pytest.raises(subprocess.TimeoutExpired):
    command_server.run([sys.executable, '-m', 'timeit', '-n', '1', 'import time; time.sleep(60)'], cwd=tmp_path,
                       env=subprocess_environment(), capture_output=True, text=True, timeout=1)
  after = command_server.run([sys.executable, '-m', 'json.tool'], cwd=tmp_path, env=subprocess_environment(),
                             capture_output=True, text=True, timeout=60)
  assert after.returncode == 1  # the server serves the next command (json.tool reads an empty stdin)


def test_commands_share_a_server_only_with_one_checkout_and_one_import_time_setting(tmp_path):
  """The server has imported the project: a command that would import it from elsewhere, or that sets a variable
  read on import differently, gets another server; the working directory alone does not."""
  environment = subprocess_environment()  # PYTHONPATH is this checkout
  key = command_server.server_key(str(ROOT), environment)
  assert key[0] == str(ROOT.resolve())
  assert command_server.server_key(str(tmp_path), environment) == key
  (tmp_path / 'transformer').mkdir()
  (tmp_path / 'transformer' / '__init__.py').write_text('')
  assert command_server.server_key(str(tmp_path), environment)[0] == str(tmp_path.resolve())  # `-m` looks there first
  assert command_server.server_key(str(ROOT), dict(environment, EXPERIMENTS_KEEP_FREED_MEMORY='0')) != key
  assert command_server.server_key(str(ROOT), dict(environment, JAX_ENABLE_X64='1')) != key
  assert command_server.server_key(str(ROOT), dict(environment, TMPDIR=str(tmp_path))) == key
