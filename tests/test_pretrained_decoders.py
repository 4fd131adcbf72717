"""OLMo 2, OLMo 3, SmolLM3 and Cohere 2 checkpoints (experiments/pretrained/olmo.py, llama.py, cohere.py): tiny random
models made here with transformers, saved as safetensors and read back without PyTorch, each compared with
transformers' logits on 2 x 520 tokens, more than four of a window of 128: norms on the sublayers' outputs and QK-norm
over the projection (OLMo), sliding layers (OLMo 3, Cohere 2), layers without RoPE (SmolLM3, Cohere 2's global ones),
Cohere's parallel block with one LayerNorm, its interleaved rotary pairs and logit scale."""

import numpy as np
import pytest

from experiments.pretrained import hugging_face
from experiments.pretrained.tables import PretrainedError

torch = pytest.importorskip('torch', reason='the yardstick is transformers on PyTorch (pip install torch transformers)')
transformers = pytest.importorskip('transformers', reason='the yardstick is transformers (pip install transformers)')
from tests import transformers_yardstick  # pylint: disable=wrong-import-position  (after the skips: it imports torch)

LENGTH, WINDOW = 520, 128


def _tiny(architecture: str, **changes):
  """A random model of 4 layers, 4 heads of 16 on a width of 64, its weights and norms far from their
  initialisation."""
  fields = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False)
  if architecture in ('Olmo3ForCausalLM', 'Cohere2ForCausalLM'):
    fields['sliding_window'] = WINDOW
  if architecture == 'SmolLM3ForCausalLM':  # its default special ids are past this vocabulary
    fields.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)
  fields.update(changes)
  config_class = getattr(transformers, architecture.replace('ForCausalLM', 'Config'))
  return transformers_yardstick.random_model(architecture, config_class, 0.3, **fields)


def _compare(model, folder, dtype=None):
  return transformers_yardstick.compare(model, folder, LENGTH, dtype)


@pytest.mark.parametrize('kv_heads, tied', [(1, False), (2, True)])
def test_an_olmo2_checkpoint_gives_transformers_logits(tmp_path, kv_heads, tied):
  config = _compare(_tiny('Olmo2ForCausalLM', num_key_value_heads=kv_heads, tie_word_embeddings=tied), tmp_path)
  assert (config.norm, config.qk_norm, config.layer_types, config.tie_embeddings) == (
      'output', 'projection', 'full', tied)


@pytest.mark.parametrize('kv_heads', [1, 2])
def test_an_olmo3_checkpoint_with_its_windows_and_two_ropes_gives_transformers_logits(tmp_path, kv_heads):
  """Three sliding layers to one full (OLMo 3's default), the full layers' RoPE stretched by YaRN."""
  yarn = dict(rope_type='yarn', factor=4.0, original_max_position_embeddings=512, rope_theta=5e5)
  config = _compare(_tiny('Olmo3ForCausalLM', num_key_value_heads=kv_heads, rope_parameters=dict(
      full_attention=yarn, sliding_attention=dict(rope_type='default', rope_theta=5e5))), tmp_path)
  assert (config.layer_types, config.sliding_window) == ('sliding,sliding,sliding,full', WINDOW)
  assert config.position.settings.rope_extension == 'yarn' and config.local_position.settings.rope_extension == 'none'


@pytest.mark.parametrize('architecture', ['Olmo2ForCausalLM', 'Olmo3ForCausalLM', 'SmolLM3ForCausalLM'])
def test_a_checkpoint_in_bfloat16_gives_transformers_logits(tmp_path, architecture):
  """Weights stored in bfloat16, tied where the others above are untied (SmolLM3: untied, kv heads 2)."""
  tied = architecture != 'SmolLM3ForCausalLM'
  _compare(_tiny(architecture, tie_word_embeddings=tied), tmp_path, torch.bfloat16)


@pytest.mark.parametrize('sliding', [False, True])
def test_a_smollm3_checkpoint_without_rope_in_every_fourth_layer_gives_transformers_logits(tmp_path, sliding):
  """no_rope_layers as position.layer_pattern; with use_sliding_window, SmolLM3's NoPE layers slide."""
  windows = dict(use_sliding_window=True, sliding_window=WINDOW) if sliding else {}
  config = _compare(_tiny('SmolLM3ForCausalLM', num_key_value_heads=1, tie_word_embeddings=True, **windows), tmp_path)
  assert (config.position.kind, config.position.settings.layer_pattern) == ('layer_pattern', 'rope,rope,rope,none')
  assert config.layer_types == ('full,full,full,sliding' if sliding else 'full')


@pytest.mark.parametrize('kv_heads, tied', [(1, True), (2, False)])
def test_a_cohere2_checkpoint_gives_transformers_logits(tmp_path, kv_heads, tied):
  """Sliding RoPE layers and a global NoPE one, the parallel block, interleaved pairs, logit_scale 0.25."""
  config = _compare(_tiny('Cohere2ForCausalLM', num_key_value_heads=kv_heads, tie_word_embeddings=tied,
                          logit_scale=0.25), tmp_path)
  assert (config.layer_types, config.position.kind, config.local_position.kind) == (
      'sliding,sliding,sliding,full', 'none', 'rope')
  assert (config.parallel_residual, config.norm_type, config.logit_scale) == (True, 'layernorm', 0.25)


def test_a_cohere2_checkpoint_with_attention_biases_in_bfloat16_gives_transformers_logits(tmp_path):
  _compare(_tiny('Cohere2ForCausalLM', attention_bias=True), tmp_path, torch.bfloat16)


@pytest.mark.parametrize('architecture, changes, older', [
    ('SmolLM3ForCausalLM', dict(use_sliding_window=True, sliding_window=WINDOW), dict(no_rope_layer_interval=4)),
    ('Cohere2ForCausalLM', {}, dict(sliding_window_pattern=4)),
    ('Olmo3ForCausalLM', {}, {}),
])
def test_a_config_without_layer_types_reads_as_transformers_fills_them_in(tmp_path, architecture, changes, older):
  """transformers 4's fields (or none: OLMo 3's default pattern) in place of layer_types and no_rope_layers."""
  _tiny(architecture, **changes).save_pretrained(tmp_path, safe_serialization=True)
  fields = hugging_face.read_config(str(tmp_path))
  newer = hugging_face.model_config(fields)
  for name in ('layer_types', 'no_rope_layers'):
    fields.pop(name, None)
  assert 'sliding' in newer.layer_types and hugging_face.model_config({**fields, **older}) == newer


@pytest.mark.parametrize('architecture, changes, message', [
    ('Olmo2ForCausalLM', dict(hidden_act='gelu'), r"hidden_act: got 'gelu'; valid: silu"),
    ('Olmo2ForCausalLM', dict(layer_types=['sliding_attention'] * 4), r'sliding layers in an Olmo2ForCausalLM'),
    ('Olmo3ForCausalLM', dict(rope_parameters=dict(chunked_attention={})), r"keyed by 'chunked_attention'"),
    ('SmolLM3ForCausalLM', dict(no_rope_layers=[1, 0]), r'no_rope_layers: got \[1, 0\]; valid: 4 entries'),
    ('Cohere2ForCausalLM', dict(head_dim=32), r'head_dim: got 32; valid: hidden_size / num_attention_heads = 16'),
])
def test_a_config_that_cannot_be_served_is_refused_naming_the_field(tmp_path, architecture, changes, message):
  _tiny(architecture).save_pretrained(tmp_path, safe_serialization=True)
  fields = hugging_face.read_config(str(tmp_path))
  fields.update(changes)
  with pytest.raises(PretrainedError, match=message):
    hugging_face.model_config(fields)


def test_a_gemma3_with_its_vision_tower_is_refused_saying_the_text_backbone_alone_is_read():
  with pytest.raises(PretrainedError, match=r"got \['Gemma3ForConditionalGeneration'\], a vision tower with its text "
                                            r'model; valid: Gemma3ForCausalLM .*the text backbone alone'):
    hugging_face.model_config({'architectures': ['Gemma3ForConditionalGeneration'], 'model_type': 'gemma3'})


def test_cohere2s_shared_norm_is_one_tensor_read_into_both_branches(tmp_path):
  """The parallel block's two norms hold the one input_layernorm, offsets zero: nothing of it is dropped."""
  model = _tiny('Cohere2ForCausalLM')
  model.save_pretrained(tmp_path, safe_serialization=True)
  _, params = hugging_face.load(str(tmp_path))
  layer = params['params']['decoder']['layer_2']
  expected = model.model.layers[2].input_layernorm.weight.detach().numpy()
  for residual in ('self_attention_residual', 'feed_forward_residual'):
    np.testing.assert_array_equal(layer[residual]['LayerNorm_0']['scale'], expected)
    assert not layer[residual]['LayerNorm_0']['bias'].any()


def _ours(**changes):
  """A Llama-style decoder of ours (4 layers, RMSNorm, SwiGLU, RoPE, no biases, untied), with changes."""
  import transformer as T  # pylint: disable=import-outside-toplevel
  fields = dict(vocab_size=97, model_dim=64, num_heads=4, num_kv_heads=2, feed_forward_dim=96, num_encoder_layers=0,
                num_decoder_layers=4, dropout_rate=0.0, norm='pre', norm_type='rmsnorm', activation='swiglu',
                use_bias=False, scale_embeddings=False, tie_embeddings=False, layer_norm_eps=1e-5,
                position=T.PositionConfig('rope', rope_base=5e5))
  return T.ModelConfig(**{**fields, **changes})


def test_an_olmo2_model_of_ours_exported_gives_transformers_logits_and_reads_back_the_same(tmp_path):
  transformers_yardstick.export_round_trip(_ours(norm='output', qk_norm='projection'), tmp_path, LENGTH,
                                           'Olmo2ForCausalLM')


def test_an_olmo3_model_of_ours_with_windows_and_two_ropes_exported_gives_transformers_logits(tmp_path):
  import transformer as T  # pylint: disable=import-outside-toplevel
  config = _ours(norm='output', qk_norm='projection', layer_types='sliding,sliding,sliding,full',
                 sliding_window=WINDOW, tie_embeddings=True, local_position=T.PositionConfig('rope', rope_base=1e4))
  transformers_yardstick.export_round_trip(config, tmp_path, LENGTH, 'Olmo3ForCausalLM')


def test_configs_hybrid_smollm3s_layers_exported_give_transformers_logits(tmp_path):
  """RoPE in three layers of four (configs/hybrid.py:smollm3's position.layer_pattern) as SmolLM3's no_rope_layers."""
  import transformer as T  # pylint: disable=import-outside-toplevel
  config = _ours(tie_embeddings=True, position=T.PositionConfig('layer_pattern', layer_pattern='rope,rope,rope,none',
                                                                rope_base=5e5))
  transformers_yardstick.export_round_trip(config, tmp_path, LENGTH, 'SmolLM3ForCausalLM')


@pytest.mark.parametrize('changes, message', [
    (dict(norm='output', qk_norm='head'), r"model.qk_norm: got 'head'; valid for a Hugging Face export: 'projection' "
                                          r"\(OLMo's block\)"),
    (dict(logit_scale=0.5), r'model.logit_scale: got 0.5; valid for a Hugging Face export: 1.0'),
    (dict(layer_types='sliding', sliding_window=8), r"model.layer_types: got 'sliding'; valid for a Hugging Face "
                                                    r"export: 'full'"),
])
def test_a_run_no_export_holds_is_refused_naming_the_field(changes, message):
  from experiments.pretrained import hugging_face_export  # pylint: disable=import-outside-toplevel
  with pytest.raises(PretrainedError, match=message):
    hugging_face_export.architecture(_ours(**changes))


def test_a_gpt2_block_with_a_window_is_refused_not_exported_without_it():
  """GPT-2's config has no window: a sliding run in its block is refused by field, as the Llama block's is."""
  import transformer as T  # pylint: disable=import-outside-toplevel
  from experiments.pretrained import hugging_face_export  # pylint: disable=import-outside-toplevel
  config = T.ModelConfig(vocab_size=97, model_dim=64, num_heads=4, feed_forward_dim=96, num_encoder_layers=0,
                         num_decoder_layers=2, norm='pre', activation='gelu', scale_embeddings=False,
                         position=T.PositionConfig('learned', max_length=64))
  assert hugging_face_export.architecture(config) == 'GPT2LMHeadModel'
  with pytest.raises(PretrainedError, match=r"model.layer_types: got 'sliding,full'"):
    hugging_face_export.architecture(config.replace(layer_types='sliding,full', sliding_window=8))
