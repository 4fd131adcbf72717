"""experiments.runs.allocator: a freed large buffer is reused, not faulted in again."""

import os
import subprocess
import sys

import pytest

# A fresh process per setting (malloc's options must be set before its first large allocations):
# allocate, touch and free 50 MB twice, and count the page faults of the second time.
_SECOND_ALLOCATION_FAULTS = '''
import resource
import experiments
import numpy as np
for _ in range(2):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  buffer = np.ones(50_000_000 // 8)
  del buffer
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
'''


def _faults(setting: str) -> int:
  result = subprocess.run([sys.executable, '-c', _SECOND_ALLOCATION_FAULTS], capture_output=True, text=True,
                          check=True, env=dict(os.environ, EXPERIMENTS_KEEP_FREED_MEMORY=setting))
  return int(result.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='mallopt is glibc on Linux')
def test_a_freed_buffer_is_reused_without_page_faults():
  kept, returned = _faults('1'), _faults('0')
  assert returned > 100, returned  # the control: without the setting, glibc maps fresh pages again
  assert kept < returned / 4, (kept, returned)
