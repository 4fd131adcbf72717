"""Gemma 2 and Gemma 3 checkpoints (experiments/pretrained/gemma.py): tiny random models made here with transformers,
saved as safetensors and read back without PyTorch, each compared with transformers' logits on 520 tokens, more
than four of its windows: local and global layers, two RoPE bases, QK-norm, sandwich norms and the (1 + w) of
Gemma's RMSNorm, heads wider than the width divides into, the query scale, Gemma 2's soft caps."""

import json

import numpy as np
import pytest

from experiments.pretrained import hugging_face
from experiments.pretrained.tables import PretrainedError

torch = pytest.importorskip('torch', reason='the yardstick is transformers on PyTorch (pip install torch transformers)')
transformers = pytest.importorskip('transformers', reason='the yardstick is transformers (pip install transformers)')
from tests import transformers_yardstick  # pylint: disable=wrong-import-position  (after the skips: it imports torch)

LENGTH, WINDOW = 520, 128


def _tiny(architecture: str, **changes):
  """A random Gemma of 6 layers (5 sliding, 1 global for Gemma 3; alternating for Gemma 2), 4 heads of width 24 on
  a width of 64, its weights and norms far from their initialisation."""
  fields = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, head_dim=24, sliding_window=WINDOW, max_position_embeddings=2048,
                query_pre_attn_scalar=20, rms_norm_eps=1e-6)
  if architecture == 'Gemma2ForCausalLM':
    fields.update(attn_logit_softcapping=3.0, final_logit_softcapping=5.0)
  fields.update(changes)
  config_class = getattr(transformers, architecture.replace('ForCausalLM', 'Config').replace('Gemma3Config',
                                                                                             'Gemma3TextConfig'))
  torch.manual_seed(0)
  model = getattr(transformers, architecture)(config_class(**fields)).eval()
  with torch.no_grad():
    for parameter in model.parameters():
      parameter.add_(0.3 * torch.randn_like(parameter))
  return model


def _compare(model, folder, dtype=None):
  return transformers_yardstick.compare(model, folder, LENGTH, dtype)


@pytest.mark.parametrize('kv_heads', [1, 2])
@pytest.mark.parametrize('tied', [True, False])
def test_a_gemma3_checkpoint_gives_transformers_logits(tmp_path, kv_heads, tied):
  config = _compare(_tiny('Gemma3ForCausalLM', num_key_value_heads=kv_heads, tie_word_embeddings=tied), tmp_path)
  assert config.layer_types == 'sliding,sliding,sliding,sliding,sliding,full' and config.sliding_window == WINDOW
  assert config.position.settings.rope_base == 1e6 and config.local_position.settings.rope_base == 1e4
  assert (config.head_dim, config.qk_norm, config.sandwich_norm, config.query_scale) == (24, 'head', True, 20.0)
  assert config.tie_embeddings == tied


def test_a_gemma3_checkpoint_in_bfloat16_gives_transformers_logits(tmp_path):
  _compare(_tiny('Gemma3ForCausalLM'), tmp_path, torch.bfloat16)


def test_a_gemma2_checkpoint_with_soft_caps_gives_transformers_logits(tmp_path):
  config = _compare(_tiny('Gemma2ForCausalLM'), tmp_path)
  assert config.layer_types == 'sliding,full'
  assert (config.attention_softcap, config.final_logit_softcap, config.local_position) == (3.0, 5.0, None)


def test_gemma3s_older_schema_reads_as_the_newer_one(tmp_path):
  """rope_theta, rope_local_base_freq and sliding_window_pattern (transformers 4's fields) in place of layer_types and
  rope_parameters by layer type: the same config."""
  model = _tiny('Gemma3ForCausalLM')
  model.save_pretrained(tmp_path, safe_serialization=True)
  newer = hugging_face.model_config(hugging_face.read_config(str(tmp_path)))
  with open(tmp_path / 'config.json') as file:
    fields = json.load(file)
  for name in ('layer_types', 'rope_parameters', '_sliding_window_pattern'):
    fields.pop(name, None)
  fields.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=6)
  assert hugging_face.model_config(fields) == newer


@pytest.mark.parametrize('changes, message', [
    (dict(hidden_activation='gelu'), r"hidden_activation: got 'gelu'; valid: gelu_pytorch_tanh"),
    (dict(layer_types=['sliding_attention', 'chunked_attention'] * 3), r'layer_types: got .*valid: 6 entries'),
    (dict(use_bidirectional_attention=True), r'use_bidirectional_attention: got true; valid: false'),
])
def test_a_gemma_config_that_cannot_be_served_is_refused_naming_the_field(tmp_path, changes, message):
  model = _tiny('Gemma3ForCausalLM')
  model.save_pretrained(tmp_path, safe_serialization=True)
  fields = hugging_face.read_config(str(tmp_path))
  fields.update(changes)
  with pytest.raises(PretrainedError, match=message):
    hugging_face.model_config(fields)


def test_an_imported_gemma3_run_loads_with_its_local_position_and_gives_the_same_logits(tmp_path):
  """experiments.import_checkpoint records the local layers' RoPE and the head width, and load_model gives back
  transformers' logits."""
  import sys  # pylint: disable=import-outside-toplevel
  from experiments.runs import checkpoints  # pylint: disable=import-outside-toplevel
  from tests import command_server  # pylint: disable=import-outside-toplevel
  from tests.helpers import ROOT, subprocess_environment  # pylint: disable=import-outside-toplevel
  model = _tiny('Gemma3ForCausalLM')
  model.save_pretrained(tmp_path / 'source', safe_serialization=True)
  done = command_server.run([sys.executable, '-m', 'experiments.import_checkpoint', f'--source={tmp_path / "source"}',
                             f'--workdir={tmp_path / "run"}'], env=subprocess_environment(), cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  loaded, variables, _ = checkpoints.load_model(str(tmp_path / 'run'))
  assert loaded.config.local_position.settings.rope_base == 1e4 and loaded.config.head_width == 24
  ids = np.random.default_rng(2).integers(0, 97, size=(1, 300))
  with torch.no_grad():
    expected = model(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(loaded.apply(variables, ids)), expected, rtol=1e-4,
                             atol=1e-4 * np.abs(expected).max())
