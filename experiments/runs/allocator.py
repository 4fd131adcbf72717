"""Keep freed memory in the process, so that XLA's CPU buffers are not handed back to the kernel
after every step and faulted in again, page by page, in the next.

XLA's CPU runtime allocates each execution's temporary buffer with malloc (about 540 MB for the
reference benchmark step) and frees it at the end. glibc serves an allocation that large with a
fresh mmap (and, from a pool thread's own arena, always does), so every step starts by zeroing
and faulting in 130,000 pages: on a 2-core machine a fifth of the CPU time went to the kernel.
With one arena, no mmap and no trimming, a freed buffer stays mapped and the next step reuses it:
the benchmark's reference step (no positions, length 256, batch 16), timed with getrusage around
its steps, went from 138,000 minor page faults and 0.24 CPU-s of system time per step to 16,500
and 0.03.

The cost: memory freed by the process is not returned to the system until it exits; the peak is
unchanged. Set EXPERIMENTS_KEEP_FREED_MEMORY=0 to leave malloc as it is.
"""

import ctypes
import ctypes.util
import os
import sys

# mallopt parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory() -> bool:
  """On Linux with glibc: one malloc arena, no mmap for large blocks, no trimming of the heap's top.
  Call before the first large allocation (before jax starts its threads). Returns whether it took
  effect (False on other systems, other C libraries, or when switched off)."""
  if os.environ.get('EXPERIMENTS_KEEP_FREED_MEMORY', '1') == '0' or not sys.platform.startswith('linux'):
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
    mallopt = libc.mallopt
  except (OSError, AttributeError):  # not glibc (musl has no mallopt)
    return False
  mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
  mallopt.restype = ctypes.c_int
  return all(mallopt(parameter, value) == 1 for parameter, value in (
      (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1)))
