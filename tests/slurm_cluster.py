"""A real single-node SLURM cluster on localhost, for tests: munged, slurmctld and slurmd (Debian's
slurm-wlm) started in a temporary directory with their own configuration, ports and state, and
stopped afterwards. Nothing outside that directory is touched.

  python -m tests.slurm_cluster DIRECTORY   starts one and prints the SLURM_CONF to export (Ctrl-C stops it)

`start` returns the environment that points sbatch, squeue and sacct at the cluster, or raises
ClusterUnavailable with one line saying why (SLURM not installed, a daemon that would not start).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

DAEMONS = ('munged', 'slurmctld', 'slurmd')


class ClusterUnavailable(RuntimeError):
  """SLURM cannot run here: one line."""


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


def _find(name: str) -> str:
  found = shutil.which(name) or next((p for p in (f'/usr/sbin/{name}', f'/usr/bin/{name}') if os.path.exists(p)), None)
  if found is None:
    raise ClusterUnavailable(f'{name} is not installed (Debian: apt-get install slurm-wlm)')
  return found


class Cluster:
  """One node (this host, all its CPUs) in one partition, `debug`."""

  def __init__(self, directory: str):
    self.directory = os.path.abspath(directory)
    self.processes = []
    self.environment = None

  def start(self) -> dict:
    binaries = {name: _find(name) for name in DAEMONS + ('sbatch', 'sinfo')}
    if os.geteuid() != 0:
      raise ClusterUnavailable('slurmd must run as root to start jobs as their user; this test runs as '
                               f'uid {os.geteuid()}')
    for sub in ('state', 'spool', 'munge'):
      os.makedirs(os.path.join(self.directory, sub), exist_ok=True)
    os.chmod(os.path.join(self.directory, 'munge'), 0o700)
    key = os.path.join(self.directory, 'munge', 'munge.key')
    with open(key, 'wb') as file:
      file.write(os.urandom(1024))
    os.chmod(key, 0o400)
    munge_socket = os.path.join(self.directory, 'munge', 'munge.socket')
    host = socket.gethostname().split('.')[0]
    config = os.path.join(self.directory, 'slurm.conf')
    lines = [
        'ClusterName=tests', f'SlurmctldHost={host}', 'SlurmUser=root', 'SlurmdUser=root',
        f'SlurmctldPort={_free_port()}', f'SlurmdPort={_free_port()}',
        f'StateSaveLocation={self.directory}/state', f'SlurmdSpoolDir={self.directory}/spool',
        f'SlurmctldPidFile={self.directory}/slurmctld.pid', f'SlurmdPidFile={self.directory}/slurmd.pid',
        f'SlurmctldLogFile={self.directory}/slurmctld.log', f'SlurmdLogFile={self.directory}/slurmd.log',
        'AuthType=auth/munge', 'CredType=cred/munge', f'AuthInfo=socket={munge_socket}',
        'ProctrackType=proctrack/linuxproc', 'TaskPlugin=task/none', 'JobAcctGatherType=jobacct_gather/none',
        'SelectType=select/cons_tres', 'SelectTypeParameters=CR_Core', 'MpiDefault=none', 'ReturnToService=2',
        'SchedulerType=sched/builtin', 'SlurmctldTimeout=30', 'SlurmdTimeout=30', 'InactiveLimit=0', 'KillWait=5',
        f'NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN',
        'PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO']
    with open(config, 'w') as file:
      file.write('\n'.join(lines) + '\n')
    self.environment = dict(os.environ, SLURM_CONF=config)
    self._daemon([binaries['munged'], '--foreground', '--force', f'--key-file={key}', f'--socket={munge_socket}',
                  f'--pid-file={self.directory}/munge/munged.pid', f'--log-file={self.directory}/munge/munged.log',
                  f'--seed-file={self.directory}/munge/munged.seed'], 'munged')
    self._wait(lambda: os.path.exists(munge_socket), 'munged', 'its socket never appeared')
    self._daemon([binaries['slurmctld'], '-D', '-i', '-f', config], 'slurmctld')
    self._daemon([binaries['slurmd'], '-D', '-f', config], 'slurmd')
    self._wait(lambda: self._node_idle(binaries['sinfo']), 'slurmd', 'the node never became idle')
    return self.environment

  def _daemon(self, command: list, name: str) -> None:
    log = open(os.path.join(self.directory, f'{name}.out'), 'w')
    self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.environment,
                                           start_new_session=True))

  def _node_idle(self, sinfo: str) -> bool:
    result = subprocess.run([sinfo, '--noheader', '--format=%t'], env=self.environment, capture_output=True,
                            text=True, check=False)
    return result.returncode == 0 and result.stdout.strip() in ('idle', 'mix', 'alloc')

  def _wait(self, condition, name: str, what: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
      if condition():
        return
      dead = [p for p in self.processes if p.poll() is not None]
      if dead:
        break
      time.sleep(0.5)
    self.stop()
    log = os.path.join(self.directory, f'{name}.out')
    tail = open(log).read().strip().splitlines()[-1:] if os.path.exists(log) else []
    raise ClusterUnavailable(f'{name} did not start ({what}): {tail[0] if tail else "no output"}')

  def stop(self) -> None:
    for process in reversed(self.processes):
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    for process in reversed(self.processes):
      try:
        process.wait(timeout=20)
      except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    self.processes = []


if __name__ == '__main__':
  cluster = Cluster(sys.argv[1])
  try:
    environment = cluster.start()
  except ClusterUnavailable as error:
    print(f'error: {error}', file=sys.stderr)
    sys.exit(2)
  print(f'export SLURM_CONF={environment["SLURM_CONF"]}', flush=True)
  signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the daemons too
  try:
    signal.pause()
  except KeyboardInterrupt:
    pass
  finally:
    cluster.stop()
