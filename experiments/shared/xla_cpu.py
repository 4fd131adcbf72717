"""XLA's CPU scheduler set to save memory, for the commands that evaluate long sequences.

By default XLA's CPU compiler orders a program for concurrency (its flag
--xla_cpu_enable_concurrency_optimized_scheduler): operations that do not depend on each other are placed side
by side so that its runtime may run them at once, and their buffers are live together. Attention computed in
blocks (transformer/blockwise.py) is then computed breadth first, every block's logits of a layer before any
block's softmax, and the blocks bound no memory: the temporaries grow with the square of the length, as without
blocks. Scheduled for memory, each block's temporaries are freed before the next block's are made. The program
computes the same operations in another order and fusion; its results agree with the default's to float32
rounding, not bit for bit. BENCHMARKS.md has the memory and the time it changes.
"""

import os

SCHEDULER_FLAG = '--xla_cpu_enable_concurrency_optimized_scheduler'


def schedule_for_memory(environ=os.environ) -> bool:
  """Adds SCHEDULER_FLAG=false to environ's XLA_FLAGS unless they already set it (the user's choice stands).
  XLA reads XLA_FLAGS when JAX starts its backend, so call it before the first computation; only the CPU
  compiler reads the flag. Returns whether it added the flag."""
  flags = environ.get('XLA_FLAGS', '')
  if SCHEDULER_FLAG in flags:
    return False
  environ['XLA_FLAGS'] = f'{flags} {SCHEDULER_FLAG}=false'.strip()
  return True
