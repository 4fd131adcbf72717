"""Test set-up, before JAX starts: 8 fake CPU devices for the parallelism tests, one compilation cache, and
compiles without most of XLA's optimisations.

Many tests compile the same training step more than once: a run and its restart, one process and two,
a sweep and its resumption, each in a fresh process. JAX's persistent compilation cache lets the second
compile of the same program load the first one's executable from disk. The cache lives in a temporary
folder made once per `pytest` invocation (the xdist workers and every subprocess a test starts inherit
the environment) and removed when that invocation ends. Executables are deterministic functions of the
program and the compile options, so a hit gives the results a fresh compile gives.

The tests' programs are tiny: compiling them takes far longer than running them. With
JAX_DISABLE_MOST_OPTIMIZATIONS, XLA compiles at backend optimisation level 0 without LLVM's expensive passes, which
change how fast a program runs, not what it computes; every process the tests start inherits it. Set it
to 0 to test the optimised programs (BENCHMARKS.md has what it saves). For the same reason XLA compiles CPU
fusions with its elemental loop emitter, not its MLIR fusion emitters, each program as one LLVM module
(tests/xla_flags.py), and the suite's own process lowers its programs into MLIR contexts it reuses
(`reuse_mlir_contexts`).
"""

import atexit
import gc
import os
import shutil
import tempfile

from tests.xla_flags import xla_flags

os.environ.setdefault('XLA_FLAGS', xla_flags(8))
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')

if 'PYTEST_XDIST_WORKER' not in os.environ and 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _cache = tempfile.mkdtemp(prefix='jax-compilation-cache-')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
# Every program, the eager operations' too: the two workers and the commands they start compile many of the same
# small programs, and loading them beats compiling them again (BENCHMARKS.md has the timings).
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')


def reuse_mlir_contexts(uses: int = 256):
  """JAX lowers every program, each eager operation's too, in an MLIR context of its own, and loading the
  dialects into a fresh context is a fifth of the time of the eager suites (py-spy); here one context serves
  `uses` lowerings before the next is made. A context holds the types and attributes it has uniqued; the
  lowered text does not depend on which context it was built in (tests/test_conftest.py checks it).
  TESTS_FRESH_MLIR_CONTEXTS=1 leaves JAX's own function in place; so does a JAX without it."""
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top  (after the environment above)
  fresh = getattr(mlir, 'make_ir_context', None)
  if fresh is None or os.environ.get('TESTS_FRESH_MLIR_CONTEXTS') == '1':
    return
  state = {'context': None, 'uses': 0}

  def reused():
    if state['context'] is None or state['uses'] >= uses:
      state['context'], state['uses'] = fresh(), 0
    state['uses'] += 1
    return state['context']
  reused.fresh, reused.state = fresh, state
  mlir.make_ir_context = reused


reuse_mlir_contexts()

# The fast tier (-m 'not slow') runs the suite every variant gets for a few variants that between them use
# every hook: rope (rotate), shaw (logits and values terms, the causal band), t5 (a bias shared across
# layers, a kernel term), tupe_a (untied embedding terms, the scale, [CLS]) and cope (reads q.k, all keys at
# once, causal only). The whole suite runs every variant.
FAST_TIER_VARIANTS = ('rope', 'shaw', 't5', 'tupe_a', 'cope')


def pytest_collection_modifyitems(config, items):
  del config
  import pytest  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top  (after the environment above is set)
  for item in items:
    kind = getattr(item, 'callspec', None) and item.callspec.params.get('kind')
    if isinstance(kind, str) and kind in transformer.VARIANTS and kind not in FAST_TIER_VARIANTS:
      item.add_marker(pytest.mark.slow)


def collect_garbage_less_often(threshold: int = 50000):
  """Python's cycle collector runs each time 700 more objects have been made than freed (its default), and
  tracing, lowering and eager dispatch make objects by the million: the collections cost a few per cent of the
  suite. The libraries imported by now are frozen out of every collection (`gc.freeze`) and the youngest
  generation is collected after `threshold` objects; objects are freed as before, cycles later."""
  gc.freeze()
  gc.set_threshold(threshold, 20, 100)


collect_garbage_less_often()
