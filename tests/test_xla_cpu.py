"""experiments/shared/xla_cpu.py: XLA's CPU scheduler set to save memory, as the evaluation commands ask for it."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.shared import xla_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAG = xla_cpu.SCHEDULER_FLAG


def test_the_flag_is_added_once_after_the_users_flags_and_a_users_own_setting_stands():
  environment = {}
  assert xla_cpu.schedule_for_memory(environment) and environment['XLA_FLAGS'] == f'{FLAG}=false'
  assert not xla_cpu.schedule_for_memory(environment) and environment['XLA_FLAGS'] == f'{FLAG}=false'
  environment = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
  assert xla_cpu.schedule_for_memory(environment)
  assert environment['XLA_FLAGS'] == f'--xla_force_host_platform_device_count=8 {FLAG}=false'
  environment = {'XLA_FLAGS': f'{FLAG}=true'}
  assert not xla_cpu.schedule_for_memory(environment) and environment['XLA_FLAGS'] == f'{FLAG}=true'


# One causal layer over 2,048 tokens in blocks of 128 queries and 512 keys: its compiled temporaries and logits.
FORWARD = '''
import json, sys
import jax, numpy as np
import transformer as T
config = T.tiny_preset(T.PositionConfig('rope'), num_decoder_layers=1, attention_block_size=128,
                       attention_key_block_size=512)
model = T.DecoderOnly(config)
tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 2048), 1, config.vocab_size)
params = model.init(jax.random.PRNGKey(0), tokens[:, :8])
compiled = jax.jit(model.apply).lower(params, tokens).compile()
logits = np.asarray(compiled(params, tokens))
'''


@pytest.mark.slow
def test_attention_in_blocks_compiled_for_memory_holds_under_a_quarter_of_the_temporaries_and_gives_the_same_logits():
  """The same program compiled here (XLA's default scheduler, for concurrency) and in a process whose XLA_FLAGS
  schedule_for_memory extended: every block's logits live at once in the first, one block's in the second."""
  assert FLAG not in os.environ.get('XLA_FLAGS', ''), 'the test process compiles with XLA\'s default scheduler'
  namespace = {}
  exec(FORWARD, namespace)  # pylint: disable=exec-used
  environment = dict(os.environ, PYTHONPATH=ROOT)
  assert xla_cpu.schedule_for_memory(environment)
  done = subprocess.run([sys.executable, '-c', FORWARD + '''
np.save(sys.stdout.buffer, logits)
sys.stderr.write(json.dumps(compiled.memory_analysis().temp_size_in_bytes))
'''], env=environment, cwd=ROOT, capture_output=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  memory_first = int(done.stderr.decode().strip().splitlines()[-1])
  default = namespace['compiled'].memory_analysis().temp_size_in_bytes
  assert memory_first < default / 4, (memory_first, default)
  np.testing.assert_allclose(np.load(io.BytesIO(done.stdout)), namespace['logits'], rtol=1e-5, atol=1e-5)
