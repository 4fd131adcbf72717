"""Run a test's `python -m experiments.X ...` in a fork of a process that has already imported its libraries.

Every command a test starts would otherwise import JAX, Flax, Optax, Orbax and the rest anew, about 1.1 s
of CPU on the test machine, before it can parse a flag. `run` takes the arguments of `subprocess.run`; a
command of the form `[sys.executable, '-m', MODULE, ...]` whose output is captured runs in a child forked
from a server (one per test process) that has imported those libraries and this project's library modules
(not its commands, which define flags and run as `__main__`), with the command's environment, working
directory and arguments. The child runs MODULE as `python -m` would
(`runpy`, `__main__`, sys.argv and sys.path[0] as the command line sets them) and exits as an interpreter
does: SystemExit's code, a traceback and 1 for any other exception, non-daemon threads joined, then the
atexit handlers. The libraries only imported, not started (the server refuses to serve if an import started a
JAX backend): XLA reads XLA_FLAGS (the device count) when the command first asks for a device, in the child.

An environment whose settings read on import differ (JAX's JAX_ variables, Python's, and
EXPERIMENTS_KEEP_FREED_MEMORY, which importing `experiments` reads), or a command that would import this project
from another checkout (its working directory or PYTHONPATH), gets a server of its own;
any other command runs as a process of its own through subprocess.run. TESTS_FORK_COMMANDS=0 runs every
command as its own process.
"""

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading

ENABLED = os.environ.get('TESTS_FORK_COMMANDS', '1') != '0'

# The libraries a command imports before it can do anything, and matplotlib, which every command that draws
# imports (a third of a second each time); none of them starts a device or a thread that matters across a fork
# (NumPy's BLAS threads are re-created in the child; pyplot picks its backend at the first figure, in the child).
PRELOAD = ('jax', 'jax.numpy', 'flax.linen', 'optax', 'orbax.checkpoint', 'chex', 'ml_collections',
           'absl.app', 'absl.flags', 'absl.logging', 'numpy', 'scipy.stats', 'matplotlib.pyplot')
# What a command imports of this project before its first step (`python -X importtime` of a training command);
# found from the server's working directory and PYTHONPATH, as the command finds them, or left to the command.
PRELOAD_PROJECT = ('transformer', 'experiments.tasks', 'experiments.runs.parallel', 'experiments.runs.preflight',
                   'experiments.runs.trainer', 'experiments.runs.checkpoints', 'experiments.sweeps.results')

SERVER = r'''
import importlib, json, os, sys
libraries, project = json.loads(sys.argv[1])
for name in libraries:
  importlib.import_module(name)
sys.path[0] = os.getcwd()  # where `python -m` looks first
for name in project:
  try:
    importlib.import_module(name)
  except ImportError:  # not importable from here: the command imports what it can itself
    pass
from jax._src import xla_bridge
if getattr(xla_bridge, '_backends', None):
  sys.exit('a preloaded module started a JAX backend: its device count would be the server\'s, not the command\'s')
import runpy, signal, threading, time, traceback, atexit


def serve(request):
  """The child: become the command, then exit as the interpreter would."""
  os.setpgid(0, 0)
  stdin = os.open(os.devnull, os.O_RDONLY)
  os.dup2(stdin, 0)
  for fd, path in ((1, request['stdout']), (2, request['stderr'])):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
  os.environ.clear()
  os.environ.update(request['env'])
  os.chdir(request['cwd'])
  sys.path[0] = os.getcwd()
  sys.argv = [request['module'], *request['arguments']]
  code = 0
  try:
    runpy.run_module(request['module'], run_name='__main__', alter_sys=True)
  except SystemExit as stop:
    if stop.code is None:
      code = 0
    elif isinstance(stop.code, int):
      code = stop.code
    else:
      print(stop.code, file=sys.stderr)
      code = 1
  except BaseException:  # what the interpreter prints for an uncaught exception, and its exit status
    traceback.print_exc()
    code = 1
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and not thread.daemon:
      thread.join()
  atexit._run_exitfuncs()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):  # closed by the command, as the interpreter allows
      pass
  os._exit(code & 0xff)


for line in sys.stdin:
  request = json.loads(line)
  sys.stdout.flush()
  child = os.fork()
  if child == 0:
    try:
      serve(request)
    except BaseException:  # the server's own failure around the command, shown where the command's go
      traceback.print_exc()
    finally:
      os._exit(70)
  deadline = None if request['timeout'] is None else time.monotonic() + request['timeout']
  timed_out = False
  while True:
    done, status = os.waitpid(child, os.WNOHANG)
    if done:
      break
    if deadline is not None and time.monotonic() > deadline:
      os.killpg(child, signal.SIGKILL)
      os.waitpid(child, 0)
      timed_out, status = True, 0
      break
    time.sleep(0.01)
  try:
    os.killpg(child, signal.SIGKILL)  # what the command left running in its group
  except ProcessLookupError:
    pass
  returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
  print(json.dumps({'returncode': returncode, 'timed_out': timed_out}), flush=True)
'''


def _inherited(env: dict) -> dict:
  """The settings a process reads when Python starts and the server's modules are imported: the server's must be
  the command's."""
  return {k: v for k, v in env.items() if k.startswith(('JAX_', 'PYTHON')) or k == 'EXPERIMENTS_KEEP_FREED_MEMORY'}


def _project_checkout(cwd: str, env: dict):
  """The folder `python -m` imports this project from in `cwd` with `env`: the first of the working directory and
  PYTHONPATH's folders that holds it; None for the installed one."""
  for folder in [cwd, *env.get('PYTHONPATH', '').split(os.pathsep)]:
    if folder and os.path.isfile(os.path.join(cwd, folder, 'transformer', '__init__.py')):
      return os.path.realpath(os.path.join(cwd, folder))
  return None


def server_key(cwd: str, env: dict) -> tuple:
  """Commands with one key share a server: the same checkout of this project, the same settings read on import."""
  return _project_checkout(cwd, env), tuple(sorted(_inherited(env).items()))


class _Server:
  """One forking server per test process, started on first use, ended with the process."""

  def __init__(self, env: dict, cwd: str):
    self.process = subprocess.Popen([sys.executable, '-c', SERVER, json.dumps([PRELOAD, PRELOAD_PROJECT])], cwd=cwd,
                                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.lock = threading.Lock()
    atexit.register(self.close)

  def alive(self) -> bool:
    return self.process.poll() is None

  def run(self, module: str, arguments: list, env: dict, cwd: str, timeout) -> tuple:
    with self.lock, tempfile.TemporaryDirectory(prefix='command-') as folder:
      request = {'module': module, 'arguments': arguments, 'env': env, 'cwd': cwd, 'timeout': timeout,
                 'stdout': os.path.join(folder, 'stdout'), 'stderr': os.path.join(folder, 'stderr')}
      self.process.stdin.write(json.dumps(request) + '\n')
      self.process.stdin.flush()
      answer = json.loads(self.process.stdout.readline())
      with open(request['stdout'], errors='replace') as out, open(request['stderr'], errors='replace') as err:
        return answer, out.read(), err.read()

  def close(self):
    if self.process.poll() is None:
      self.process.stdin.close()
      self.process.wait(timeout=60)


_servers = {}


def run(command, *, cwd=None, env=None, capture_output=False, text=None, timeout=None, check=False, **kwargs):
  """subprocess.run(command, ...), a `python -m` command with captured text output in a fork of the server."""
  env = dict(os.environ if env is None else env)
  cwd = os.path.abspath(os.getcwd() if cwd is None else cwd)
  forkable = (ENABLED and not kwargs and capture_output and text and len(command) >= 3
              and command[0] == sys.executable and command[1] == '-m')
  if not forkable:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=capture_output, text=text, timeout=timeout,
                          check=check, **kwargs)
  key = server_key(cwd, env)
  server = _servers.get(key)
  if server is None or not server.alive():
    server = _servers[key] = _Server(env, cwd)
  answer, stdout, stderr = server.run(str(command[2]), [str(a) for a in command[3:]], env, cwd, timeout)
  if answer['timed_out']:
    raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
  done = subprocess.CompletedProcess(command, answer['returncode'], stdout, stderr)
  if check:
    done.check_returncode()
  return done
