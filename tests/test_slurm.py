"""compare --launcher=slurm: the unfinished runs as one job array (against a stand-in sbatch that runs
the array here), --collect, and JAX's own SLURM detection for multi-host runs."""

import json
import os
import pathlib
import shlex
import stat
import sys

import jax
import pytest

from experiments.runs import parallel
from experiments.sweeps import slurm
from tests import command_server
from tests.helpers import subprocess_environment
from tests.xla_flags import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAKE_SBATCH = '''#!/usr/bin/env bash
# A stand-in for SLURM's sbatch: records its arguments; with FAKE_SBATCH_RUN=1 runs every array task
# here, one after another, as SLURM would run them on the cluster.
echo "$@" >> "$FAKE_SBATCH_LOG"
script="${@: -1}"
if [ "${FAKE_SBATCH_RUN:-0}" = 1 ]; then
  last=$(sed -n 's/^#SBATCH --array=0-\\([0-9]*\\)$/\\1/p' "$script")
  for task in $(seq 0 "$last"); do
    SLURM_ARRAY_TASK_ID=$task SLURM_JOB_ID=4242 bash "$script" >> "$FAKE_SBATCH_LOG.tasks" 2>&1 || exit 1
  done
fi
echo "4242;cluster"
'''


@pytest.fixture
def fake_sbatch(tmp_path):
  bin_directory = tmp_path / 'bin'
  bin_directory.mkdir()
  (bin_directory / 'sbatch').write_text(FAKE_SBATCH)
  (bin_directory / 'sbatch').chmod(stat.S_IRWXU)
  log = tmp_path / 'sbatch.log'
  return dict(subprocess_environment(1), PATH=f'{bin_directory}{os.pathsep}{os.environ["PATH"]}',
              FAKE_SBATCH_LOG=str(log)), log


def _compare(sweep, *extra):
  return [sys.executable, '-m', 'experiments.compare', '--config=configs/smoke.py', '--positions=none,alibi',
          '--seeds=1', f'--workdir={sweep}', '--config.train.steps=10', *extra]


@pytest.mark.slow
def test_the_job_array_runs_each_unfinished_run_with_the_local_command(tmp_path, fake_sbatch):
  environment, log = fake_sbatch
  sweep = tmp_path / 'sweep'
  result = command_server.run(_compare(sweep, '--launcher=slurm', '--slurm_options=--partition=gpu --time=04:00:00'),
                              cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'submitted SLURM job array 4242: 2 programs of 2 runs (none-seed0, alibi-seed0)' in result.stderr
  assert log.read_text().split()[0] == '--parsable'
  script = (sweep / 'slurm' / 'sweep.sbatch').read_text()
  for line in ('#SBATCH --array=0-1', '#SBATCH --requeue', '#SBATCH --signal=B:TERM@120', '#SBATCH --partition=gpu',
               '#SBATCH --time=04:00:00', f'#SBATCH --output={sweep}/slurm/%A_%a.log'):
    assert line in script.splitlines(), line
  commands = [shlex.split(line) for line in (sweep / 'slurm' / 'commands.txt').read_text().splitlines()]
  assert [c[:3] for c in commands] == [[sys.executable, '-m', 'experiments.train']] * 2
  assert commands[1][3:] == ['--config=configs/smoke.py', f'--workdir={sweep}/alibi-seed0', '--config.train.steps=10',
                             '--config.model.position.kind=alibi', '--config.seed=0']
  submitted = json.loads((sweep / 'slurm' / 'submitted.jsonl').read_text())
  assert submitted['job'] == '4242' and submitted['runs'] == ['none-seed0', 'alibi-seed0']
  assert not (sweep / 'none-seed0').exists()  # nothing trains here: the cluster does

  early = command_server.run(_compare(sweep, '--collect'), cwd=ROOT, env=environment, capture_output=True, text=True,
                             timeout=300)
  assert early.returncode == 1 and 'not finished yet: none-seed0, alibi-seed0' in early.stderr


@pytest.mark.slow
def test_a_finished_array_is_collected_and_a_resubmission_skips_finished_runs(tmp_path, fake_sbatch):
  environment, log = fake_sbatch
  sweep = tmp_path / 'sweep'
  result = command_server.run(_compare(sweep, '--launcher=slurm'), cwd=ROOT, env=dict(environment, FAKE_SBATCH_RUN='1'),
                              capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:] + log.with_suffix('.log.tasks').read_text()[-2000:]
  assert '=== ' in log.with_suffix('.log.tasks').read_text()  # the tasks' header lines
  collected = command_server.run(_compare(sweep, '--collect'), cwd=ROOT, env=environment, capture_output=True,
                                 text=True,
                                 timeout=300)
  assert collected.returncode == 0, collected.stderr[-2000:]
  table = (sweep / 'results.md').read_text()
  for name in ('none', 'alibi'):
    final = [json.loads(line) for line in (sweep / f'{name}-seed0' / 'metrics.jsonl').read_text().splitlines()
             if json.loads(line)['split'] == 'eval'][-1]
    row = next(line for line in table.split('### sequence_accuracy')[0].splitlines() if line.startswith(f'| {name} |'))
    assert f'{final["token_accuracy"]:.3f}' in row
  again = command_server.run(_compare(sweep, '--launcher=slurm'), cwd=ROOT, env=environment, capture_output=True,
                             text=True, timeout=300)  # everything finished: nothing is submitted, the table is written
  assert again.returncode == 0 and 'submitted' not in again.stderr
  assert log.read_text().count('--parsable') == 1


@pytest.mark.slow
def test_without_sbatch_the_slurm_launcher_is_one_line(tmp_path):
  environment = dict(subprocess_environment(1), PATH=os.path.dirname(sys.executable))
  result = command_server.run(_compare(tmp_path / 'sweep', '--launcher=slurm'), cwd=ROOT, env=environment,
                              capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  assert result.stderr.startswith('error: --launcher=slurm: sbatch is not on PATH') and result.stderr.count('\n') == 1


def test_a_multi_task_slurm_job_lets_jax_find_its_cluster(monkeypatch):
  calls = []
  monkeypatch.setattr(jax.distributed, 'initialize', lambda *args, **kwargs: calls.append((args, kwargs)))
  monkeypatch.setattr(jax.config, 'update', lambda *args: None)
  for variable in ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID'):
    monkeypatch.delenv(variable, raising=False)
  monkeypatch.setenv('SLURM_JOB_ID', '4242')
  monkeypatch.setenv('SLURM_NTASKS', '1')
  parallel.initialize_distributed(None, None, None)
  assert calls == []  # one task: a single process
  monkeypatch.setenv('SLURM_NTASKS', '4')
  parallel.initialize_distributed(None, None, None)
  assert calls == [((), {})]  # no arguments: JAX reads SLURM's variables
  parallel.initialize_distributed('host0:1234', 2, 1)
  assert calls[-1] == ((), dict(coordinator_address='host0:1234', num_processes=2, process_id=1))  # flags win


def test_the_array_script_runs_line_i_plus_1_for_task_i(tmp_path):
  commands = tmp_path / 'commands.txt'
  commands.write_text('echo first\necho "second task"\n')
  script = tmp_path / 'job.sbatch'
  script.write_text(slurm.array_script(str(tmp_path), str(commands), 2, str(tmp_path), []))
  for task, expected in ((0, 'first'), (1, 'second task')):
    run = command_server.run(['bash', str(script)], env=dict(os.environ, SLURM_ARRAY_TASK_ID=str(task)),
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == expected, run.stderr


@pytest.fixture(scope='module')
def slurm_cluster(tmp_path_factory):
  """A real single-node SLURM (tests/slurm_cluster.py), or a skip saying in one line why there is none."""
  from tests import slurm_cluster as cluster_module  # pylint: disable=g-import-not-at-top
  cluster = cluster_module.Cluster(str(tmp_path_factory.mktemp('slurm')))
  try:
    environment = cluster.start()
  except cluster_module.ClusterUnavailable as error:
    pytest.skip(f'no SLURM here: {error}')
  yield dict(environment, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS='cpu',
             PYTHONPATH=str(ROOT))
  cluster.stop()


def _wait_for_job(job: str, environment: dict, timeout: float = 600) -> None:
  """Polls squeue until the job has left the queue."""
  import time  # pylint: disable=g-import-not-at-top
  deadline = time.time() + timeout
  while time.time() < deadline:
    queued = command_server.run(['squeue', '--noheader', f'--jobs={job}', '--format=%i %T'], env=environment,
                                capture_output=True, text=True, check=False)
    if queued.returncode == 0 and not queued.stdout.strip():
      return
    time.sleep(1)
  raise TimeoutError(f'SLURM job {job} still queued after {timeout} s')


@pytest.mark.slow
def test_a_real_slurm_cluster_runs_a_two_variant_sweep_and_compare_tabulates_it(tmp_path, slurm_cluster):
  sweep = tmp_path / 'sweep'
  submitted = command_server.run(_compare(sweep, '--launcher=slurm', '--seeds=2'), cwd=ROOT, env=slurm_cluster,
                                 capture_output=True, text=True, timeout=300)
  assert submitted.returncode == 0, submitted.stderr[-2000:]
  job = json.loads((sweep / 'slurm' / 'submitted.jsonl').read_text())['job']
  assert f'submitted SLURM job array {job}: 2 programs of 4 runs' in submitted.stderr  # a program per variant
  _wait_for_job(job, slurm_cluster)
  logs = {path.name: path.read_text() for path in (sweep / 'slurm').glob(f'{job}_*.log')}
  assert sorted(logs) == [f'{job}_0.log', f'{job}_1.log'], logs
  collected = command_server.run(_compare(sweep, '--collect', '--seeds=2'), cwd=ROOT, env=slurm_cluster,
                                 capture_output=True, text=True, timeout=300)
  assert collected.returncode == 0, collected.stderr[-2000:] + '\n'.join(logs.values())[-3000:]
  table = (sweep / 'results.md').read_text()
  for name in ('none', 'alibi'):
    row = next(line for line in table.split('### sequence_accuracy')[0].splitlines() if line.startswith(f'| {name} |'))
    assert row.endswith('| 2 |')  # both seeds of the variant, trained on the cluster
    for seed in (0, 1):
      assert (sweep / f'{name}-seed{seed}' / 'summary.json').exists()
