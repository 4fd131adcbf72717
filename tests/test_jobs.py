"""experiments/sweeps/local.py: a sweep's programs N at once, each in its own share of the machine."""

import json
import os
import sys
import textwrap

import pytest

from experiments.sweeps import local

# A stand-in for a training program: records when it ran, what it could use, and whether it was
# stopped; it waits (up to a minute) until `--barrier` programs have started, so that programs run
# one after another, not side by side, are seen to time out.
PROGRAM = textwrap.dedent('''
    import json, os, pathlib, signal, sys, time
    directory, name, barrier = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    record = dict(name=name, start=time.time(), cores=sorted(os.sched_getaffinity(0)),
                  gpus=os.environ.get('CUDA_VISIBLE_DEVICES'), signal=None, alone=False)
    def stop(number, frame):
      record['signal'] = signal.Signals(number).name
    signal.signal(signal.SIGTERM, stop)
    (directory / f'started-{name}').touch()
    deadline = time.time() + 60
    while len(list(directory.glob('started-*'))) < barrier and record['signal'] is None:
      if time.time() > deadline:
        record['alone'] = True
        break
      time.sleep(0.01)
    while (directory / 'hold').exists() and record['signal'] is None and time.time() < deadline:
      time.sleep(0.01)
    record['end'] = time.time()
    (directory / f'record-{name}.json').write_text(json.dumps(record))
    (pathlib.Path(sys.argv[4]) / 'summary.json').write_text('{}')
''')


def _programs(tmp_path, count, barrier):
  script = tmp_path / 'program.py'
  script.write_text(PROGRAM)
  programs = []
  for index in range(count):
    workdir = tmp_path / f'run{index}'
    programs.append(local.Program((sys.executable, str(script), str(tmp_path), str(index), str(barrier),
                                   str(workdir)), (str(workdir),), f'program {index}'))
  return programs


class _Stop:
  """experiments.shared.signals.STOP's `requested`, set to 'SIGTERM' once `when()` holds."""

  def __init__(self, when=lambda: False):
    self._when = when
    self._requested = None

  @property
  def requested(self):
    if self._requested is None and self._when():
      self._requested = 'SIGTERM'
    return self._requested


def _two_shares():
  cores = sorted(os.sched_getaffinity(0))
  second = cores[1:2] or cores[:1]  # one core: both shares name it (the split itself is tested below)
  return [local.Share(0, 2, tuple(cores[:1]), ('0',)), local.Share(1, 2, tuple(second), ('1',))]


def test_two_jobs_run_side_by_side_never_three_each_with_its_cores_and_devices(tmp_path):
  machine = _two_shares()
  started, ended = [], {}
  own_affinity = os.sched_getaffinity(0)
  local.run_programs(_programs(tmp_path, 5, barrier=2), machine, _Stop(),
                     on_start=lambda program, share: started.append((program.label, share.index)),
                     on_end=lambda program, outcomes: ended.update({program.label: outcomes}),
                     poll_seconds=0.01)
  assert os.sched_getaffinity(0) == own_affinity  # this process's own threads keep theirs
  records = [json.loads((tmp_path / f'record-{index}.json').read_text()) for index in range(5)]
  assert not any(record['alone'] for record in records[:2])  # the first two waited for each other: side by side
  assert [label for label, _ in started] == [f'program {index}' for index in range(5)]
  for (label, share), record in zip(started, records):
    assert record['cores'] == list(machine[share].cores) and record['gpus'] == machine[share].gpus[0], record
    header = (tmp_path / f'run{record["name"]}' / 'train.log').read_text().splitlines()[0]
    assert header.endswith(f'({machine[share].describe()})')
  events = sorted([(r['start'], 1) for r in records] + [(r['end'], -1) for r in records])
  running = [sum(step for _, step in events[:i + 1]) for i in range(len(events))]
  assert max(running) == 2
  assert all(outcome == {str(tmp_path / f'run{label.split()[-1]}'): ('ok', '')} for label, outcome in ended.items())


def test_a_stop_reaches_every_running_program_and_starts_no_other(tmp_path):
  (tmp_path / 'hold').touch()  # the programs keep running until they are stopped
  stop = _Stop(when=lambda: len(list(tmp_path.glob('started-*'))) == 2)
  ended = {}
  local.run_programs(_programs(tmp_path, 4, barrier=2), _two_shares(), stop, on_start=lambda *_: None,
                     on_end=lambda program, outcomes: ended.update(outcomes), poll_seconds=0.01)
  records = [json.loads(path.read_text()) for path in sorted(tmp_path.glob('record-*.json'))]
  assert [record['name'] for record in records] == ['0', '1']
  assert all(record['signal'] == 'SIGTERM' for record in records)
  assert ended == {str(tmp_path / 'run0'): ('stopped', ''), str(tmp_path / 'run1'): ('stopped', '')}
  assert not (tmp_path / 'run2').exists() and not (tmp_path / 'run3').exists()


def test_a_failed_program_names_its_error_and_the_next_one_takes_its_share(tmp_path):
  failing = local.Program((sys.executable, '-c', 'import sys; print("error: something named"); sys.exit(3)'),
                          (str(tmp_path / 'bad'),), 'bad')
  programs = [failing] + _programs(tmp_path, 1, barrier=1)
  ended = {}
  local.run_programs(programs, _two_shares()[:1], _Stop(), on_start=lambda *_: None,
                     on_end=lambda program, outcomes: ended.update(outcomes), poll_seconds=0.01)
  assert ended[str(tmp_path / 'bad')] == ('failed', 'exit code 3: error: something named')
  assert ended[str(tmp_path / 'run0')] == ('ok', '')


def test_shares_give_each_run_its_own_cores_or_gpus_whatever_the_number_of_jobs():
  assert [s.cores for s in local.shares(2, [0, 1])] == [(0,), (1,)]
  assert [s.cores for s in local.shares(1, [1, 0])] == [(0,)]  # one core per run by default, not the machine
  assert [s.cores for s in local.shares(3, [7, 0, 1, 2, 3, 4, 5, 6], cores_per_run=2)] == [(0, 1), (2, 3), (4, 5)]
  assert [s.cores for s in local.shares(1, [3, 1], cores_per_run=2)] == [(1, 3)]
  eight = [str(i) for i in range(8)]
  gpus = local.shares(4, range(16), eight, 'gpu', gpus_per_run=2)
  assert [s.gpus for s in gpus] == [('0', '1'), ('2', '3'), ('4', '5'), ('6', '7')]
  assert [s.cores for s in gpus] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
  assert [s.gpus for s in local.shares(2, range(4), ['5', '7'], 'gpu')] == [('5',), ('7',)]
  assert [s.gpus for s in local.shares(1, range(4), eight, 'gpu')] == [('0',)]
  assert local.devices_per_job(gpus[0], 8) == 2
  assert local.devices_per_job(local.shares(2, [0, 1])[1], 8) == 8  # host devices are not split
  assert local.shares(2, [0, 1])[1].describe() == 'job 2 of 2: cores 1'
  assert gpus[3].describe() == 'job 4 of 4: cores 12,13,14,15; GPUs 6,7'


@pytest.mark.parametrize('jobs,cores,gpus,platform,per_run,expected', [
    (0, [0, 1], None, 'cpu', {}, '--jobs: got 0; valid: a positive integer'),
    (1, [0, 1], None, 'cpu', {'cores_per_run': 0}, '--cores_per_run: got 0; valid: a positive integer'),
    (3, [0, 1], None, 'cpu', {}, '--jobs: got 3 with --cores_per_run=1, 3 cores; valid: --jobs x --cores_per_run '
     'at most 2, the CPU cores this process may use'),
    (2, [0, 1], None, 'cpu', {'cores_per_run': 2}, '--jobs: got 2 with --cores_per_run=2, 4 cores; valid: --jobs x '
     '--cores_per_run at most 2, the CPU cores this process may use'),
    (3, range(16), [str(i) for i in range(8)], 'gpu', {'gpus_per_run': 3},
     '--jobs: got 3 with --gpus_per_run=3, 9 GPUs; valid: --jobs x --gpus_per_run at most 8, the GPUs here'),
    (4, range(2), [str(i) for i in range(8)], 'gpu', {},
     '--jobs: got 4; valid: at most 2, the CPU cores this process may use (each job needs one)'),
    (2, range(8), None, 'tpu', {}, '--jobs: got 2; valid: 1 on tpu (jobs split CPU cores or GPUs only)'),
])
def test_a_split_the_machine_cannot_make_is_refused_naming_what_would_do(jobs, cores, gpus, platform, per_run,
                                                                        expected):
  with pytest.raises(local.JobsError) as error:
    local.shares(jobs, cores, gpus, platform, **per_run)
  assert str(error.value) == expected


def test_this_machine_splits_into_its_own_cores():
  cores = os.sched_getaffinity(0)
  machine = local.machine_shares(len(cores))  # one core each
  assert sorted(core for share in machine for core in share.cores) == sorted(cores)
  assert all(len(share.cores) == 1 and share.gpus is None for share in machine)
