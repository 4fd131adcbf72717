"""XLA_FLAGS for the test process and every command a test starts (imports no JAX: conftest sets them
before JAX starts).

`--xla_cpu_use_fusion_emitters=false` compiles CPU fusions with XLA's elemental loop emitter instead of
its MLIR fusion emitters: the same operations, compiled in less time (the tests compile far more than
they run). TESTS_XLA_FUSION_EMITTERS=1 keeps XLA's default emitters.
"""

import os

FAST_COMPILE = '' if os.environ.get('TESTS_XLA_FUSION_EMITTERS') == '1' else '--xla_cpu_use_fusion_emitters=false'


def xla_flags(devices: int) -> str:
  """`devices` host (CPU) devices, compiled the tests' way."""
  return f'--xla_force_host_platform_device_count={devices} {FAST_COMPILE}'.strip()
