"""SIGTERM and SIGINT (Ctrl-C) end a command cleanly at any moment.

A command installs `STOP` first thing. Outside `STOP.deferred()` (reading the config, importing JAX,
checking a sweep, writing a table) a signal ends the process at once with exit code 0 and one line:
nothing has been trained there, and every file the commands write is written atomically, so each
is whole or absent. (Raising an exception from the handler instead would not do: it can land in a
callback, such as JAX's garbage-collection hook, that prints and swallows it.) Inside `deferred()`
(the trainer, from opening the run to its summary) a signal only sets `STOP.requested`: the loop
saves a checkpoint at its next step boundary and returns, and before the first step `check()`
raises `Interrupted`, which the command turns into the same clean exit.
"""

import contextlib
import os
import signal
import sys
import threading
from typing import Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT)
PARENT_VARIABLE = 'EXPERIMENTS_STOP_WITH_PARENT'  # a parent's pid: the child gets SIGTERM when it dies


def stop_with_parent() -> None:
  """A command started by another (experiments.compare sets PARENT_VARIABLE to its pid) gets SIGTERM
  when that parent dies, even by kill -9, so no run outlives its sweep (Linux: PR_SET_PDEATHSIG)."""
  parent = os.environ.get(PARENT_VARIABLE)
  if not parent:
    return
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    return
  if str(os.getppid()) != parent:  # the parent died before prctl took effect
    os.kill(os.getpid(), signal.SIGTERM)


class Interrupted(BaseException):
  """A stop signal arrived where there was nothing to save. BaseException, as KeyboardInterrupt, so
  that no `except Exception` swallows it."""

  def __init__(self, signal_name: str):
    super().__init__(signal_name)
    self.signal_name = signal_name


class StopSignals:
  """The process's handler of SIGTERM and SIGINT."""

  def __init__(self):
    self.requested: Optional[str] = None  # the name of the first signal received, e.g. 'SIGTERM'
    self._deferring = 0
    self._installed = False

  def install(self) -> None:
    if threading.current_thread() is not threading.main_thread():
      return  # signals are delivered to the main thread only; leave them alone
    for sig in SIGNALS:
      signal.signal(sig, self._handle)
    self._installed = True
    stop_with_parent()

  def _handle(self, signum, frame):
    del frame
    if self.requested:
      return  # already stopping: a second signal (Ctrl-C reaches a whole process group) changes nothing
    self.requested = signal.Signals(signum).name
    if not self._deferring:
      print(f'{self.requested} received: stopped; nothing was left half-written', file=sys.stderr, flush=True)
      os._exit(0)  # pylint: disable=protected-access

  def check(self) -> None:
    """Raises Interrupted if a stop was requested (for the steps before the loop, inside deferred())."""
    if self.requested:
      raise Interrupted(self.requested)

  @contextlib.contextmanager
  def deferred(self):
    """Signals only set `requested` inside; installs the handler if no command did (tests, notebooks),
    and restores the previous handlers on leaving in that case."""
    previous = {}
    if not self._installed and threading.current_thread() is threading.main_thread():
      previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
      self.install()
    self._deferring += 1
    try:
      yield self
    finally:
      self._deferring -= 1
      if previous:
        for sig, handler in previous.items():
          signal.signal(sig, handler)
        self._installed = False
        self.requested = None


STOP = StopSignals()
