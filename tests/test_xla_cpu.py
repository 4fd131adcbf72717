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


# One causal layer over 2,048 tokens in blocks of 128 queries and 512 keys, ALiBi's (blockwise.py's blocks, a term
# each) and RoPE's (tiled_attention.py's rolled tiles, no term): their compiled temporaries and logits.
FORWARD = '''
import json, sys
import jax, numpy as np
import transformer as T
temporaries, logits = {}, {}
for kind in ('alibi', 'rope'):
  config = T.tiny_preset(T.PositionConfig(kind), num_decoder_layers=1, attention_block_size=128,
                         attention_key_block_size=512)
  model = T.DecoderOnly(config)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 2048), 1, config.vocab_size)
  params = model.init(jax.random.PRNGKey(0), tokens[:, :8])
  compiled = jax.jit(model.apply).lower(params, tokens).compile()
  temporaries[kind] = compiled.memory_analysis().temp_size_in_bytes
  logits[kind] = np.asarray(compiled(params, tokens))
'''


@pytest.mark.slow
def test_the_schedule_bounds_the_temporaries_of_blocks_and_tiles_need_it_not():
  """The same programs compiled here (XLA's default scheduler, for concurrency) and in a process whose XLA_FLAGS
  schedule_for_memory extended, with the same logits. Blocks: every block's logits live at once in the first, one
  block's in the second (under a quarter). Tiles: a rolled loop holds one tile's either way (within 1.5x), so a
  notebook's model.apply needs no flag."""
  assert FLAG not in os.environ.get('XLA_FLAGS', ''), 'the test process compiles with XLA\'s default scheduler'
  namespace = {}
  exec(FORWARD, namespace)  # pylint: disable=exec-used
  environment = dict(os.environ, PYTHONPATH=ROOT)
  assert xla_cpu.schedule_for_memory(environment)
  done = subprocess.run([sys.executable, '-c', FORWARD + '''
np.savez(sys.stdout.buffer, **logits)
sys.stderr.write(json.dumps(temporaries))
'''], env=environment, cwd=ROOT, capture_output=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  memory_first = json.loads(done.stderr.decode().strip().splitlines()[-1])
  default = namespace['temporaries']
  assert memory_first['alibi'] < default['alibi'] / 4, (memory_first, default)
  assert default['rope'] < 1.5 * memory_first['rope'], (memory_first, default)
  saved = np.load(io.BytesIO(done.stdout))
  for kind in ('alibi', 'rope'):
    np.testing.assert_allclose(saved[kind], namespace['logits'][kind], rtol=1e-5, atol=1e-5)
