"""Test set-up: 8 fake CPU devices for the parallelism tests, set before JAX starts."""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
