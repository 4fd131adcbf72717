"""XLA_FLAGS for the test process and every command a test starts (imports no JAX: conftest sets them
before JAX starts).

The tests compile far more than they run, so both flags trade a program's speed for its compile time; neither
changes what a program computes (tests/test_conftest.py compiles with each at XLA's default too):
- `xla_cpu_use_fusion_emitters=false` compiles CPU fusions with XLA's elemental loop emitter instead of its
  MLIR fusion emitters.
- `xla_cpu_parallel_codegen_split_count=1` hands LLVM each program as one module. XLA's default splits it into
  parts compiled on several threads, and each part pays LLVM's fixed costs: on the suite's two cores, where two
  workers compile at once, the split costs more than its threads save.
TESTS_XLA_FUSION_EMITTERS=1 keeps XLA's defaults for both.
"""

import os

# flag: (the tests' value, XLA's default)
FAST_COMPILE_FLAGS = {'xla_cpu_use_fusion_emitters': (False, True), 'xla_cpu_parallel_codegen_split_count': (1, 32)}

FAST_COMPILE = ('' if os.environ.get('TESTS_XLA_FUSION_EMITTERS') == '1' else ' '.join(
    f'--{flag}={str(ours).lower()}' for flag, (ours, _) in FAST_COMPILE_FLAGS.items()))


def xla_flags(devices: int) -> str:
  """`devices` host (CPU) devices, compiled the tests' way."""
  return f'--xla_force_host_platform_device_count={devices} {FAST_COMPILE}'.strip()
