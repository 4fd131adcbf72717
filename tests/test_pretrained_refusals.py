"""What the checkpoints' import refuses (experiments/pretrained/), each by name with what would be valid: these need
no PyTorch, unlike tests/test_pretrained.py's comparisons."""

import json
import re

import numpy as np
import pytest

from experiments.pretrained import gguf_file, hugging_face


def test_unsupported_sources_are_refused_by_name(tmp_path):
  with pytest.raises(hugging_face.PretrainedError, match=r'has no config.json'):
    hugging_face.load(str(tmp_path))
  base = dict(num_attention_heads=4, hidden_size=64, intermediate_size=96, vocab_size=10, num_hidden_layers=1,
              rms_norm_eps=1e-5)
  with pytest.raises(hugging_face.PretrainedError,
                     match=r"architectures: got \['BertModel'\]; valid: one of LlamaForCausalLM, MistralForCausalLM"):
    hugging_face.model_config({**base, 'architectures': ['BertModel']})
  with pytest.raises(hugging_face.PretrainedError, match=r"rope scaling type 'su'; valid: default, linear"):
    hugging_face.model_config({**base, 'architectures': ['LlamaForCausalLM'], 'rope_scaling': {'rope_type': 'su'}})
  with pytest.raises(hugging_face.PretrainedError, match=r"rope scaling type 'mrope'; valid: default, linear, dynamic"):
    hugging_face.model_config({**base, 'architectures': ['LlamaForCausalLM'], 'rope_scaling': {'type': 'mrope'}})
  with pytest.raises(hugging_face.PretrainedError, match=r'max_position_embeddings: missing; valid: .* dynamic'):
    hugging_face.model_config({**base, 'architectures': ['LlamaForCausalLM'],
                               'rope_scaling': {'type': 'dynamic', 'factor': 2.0}})
  with pytest.raises(hugging_face.PretrainedError, match=r"layer_types: got \['full_attention', 'chunked'\]; valid: 2"):
    hugging_face.model_config({**base, 'architectures': ['MistralForCausalLM'], 'num_hidden_layers': 2,
                               'layer_types': ['full_attention', 'chunked']})
  for served, kinds in (({'sliding_window': None}, 'full'), ({'sliding_window': 4096, 'use_sliding_window': False},
                                                             'full'),
                        ({'sliding_window': 32768}, 'full'), ({'sliding_window': 4096}, 'sliding')):
    assert hugging_face.model_config({**base, 'architectures': ['MistralForCausalLM'], 'max_position_embeddings': 32768,
                                      **served}).layer_types == kinds
  with pytest.raises(hugging_face.PretrainedError, match=r"hidden_act: got 'gelu'"):
    hugging_face.model_config({**base, 'architectures': ['LlamaForCausalLM'], 'hidden_act': 'gelu'})


def test_a_gguf_file_of_another_architecture_or_with_rope_scaling_read_otherwise_is_refused_by_name():
  class Field:
    def __init__(self, value):
      self.value = value

    def contents(self):
      return self.value

  class Reader:
    def __init__(self, **fields):
      self.fields = {name.replace('__', '.'): Field(value) for name, value in fields.items()}
      self.tensors = []

  with pytest.raises(hugging_face.PretrainedError, match=r"general.architecture: got 'gemma'; valid: llama"):
    gguf_file.model_config(Reader(general__architecture='gemma'))
  llama = dict(general__architecture='llama', llama__embedding_length=64, llama__attention__head_count=4)
  with pytest.raises(hugging_face.PretrainedError, match=r"llama.rope.scaling.type: got 'longrope'; valid here: "
                                                          r"none, linear, yarn"):
    gguf_file.model_config(Reader(**llama, llama__rope__scaling__type='longrope'))
  yarn = dict(llama, llama__rope__scaling__type='yarn', llama__rope__scaling__factor=4.0)
  with pytest.raises(hugging_face.PretrainedError, match=r"the GGUF file has no llama.rope.scaling."
                                                          r"original_context_length"):
    gguf_file.model_config(Reader(**yarn))
  with pytest.raises(hugging_face.PretrainedError, match=r"llama.rope.scaling.attn_factor: got 1.3; valid here: 1.0"):
    gguf_file.model_config(Reader(**yarn, llama__rope__scaling__original_context_length=128,
                                  llama__rope__scaling__attn_factor=1.3))


def test_an_export_transformers_cannot_hold_is_refused_naming_the_field():
  """experiments/pretrained/hugging_face_export.py: another variant, another block, an extension transformers
  computes otherwise, and the Llama block with RoPE accepted (LlamaForCausalLM; Qwen2ForCausalLM with qkv biases)."""
  import transformer as T  # pylint: disable=g-import-not-at-top
  from experiments.pretrained import hugging_face_export  # pylint: disable=g-import-not-at-top
  llama = T.ModelConfig(vocab_size=50, model_dim=32, num_heads=4, num_kv_heads=2, feed_forward_dim=48,
                        num_encoder_layers=0, num_decoder_layers=1, activation='swiglu', norm='pre',
                        norm_type='rmsnorm', use_bias=False, scale_embeddings=False, position=T.PositionConfig('rope'))
  assert hugging_face_export.architecture(llama) == 'LlamaForCausalLM'
  assert hugging_face_export.architecture(llama.replace(qkv_bias=True)) == 'Qwen2ForCausalLM'
  for changed, message in (
      (llama.replace(position=T.PositionConfig('alibi')), r"model.position.kind: got 'alibi'; valid .*: rope"),
      (llama.replace(norm_type='layernorm'), r"model.norm_type: got 'layernorm'; valid .*: 'rmsnorm'"),
      (llama.replace(activation='gelu'), r"model.activation: got 'gelu'"),
      (llama.replace(use_bias=True), r'model.use_bias: got True'),
      (llama.replace(position=T.PositionConfig('rope', rope_extension='yarn', extension_factor=2.0,
                                               original_length=64)),
       r"model.position.yarn_ramp: got 'rotations'; valid .*: dimensions or exact_dimensions"),
      (llama.replace(position=T.PositionConfig('rope', rope_extension='ntk', extension_factor=2.0)),
       r"model.position.rope_extension: got 'ntk'"),
      (llama.replace(position=T.PositionConfig('rope', ssmax=True)), r'model.position.ssmax: got True'),
      (llama.replace(qk_norm='head'), r"model.qk_norm: got 'head'; valid .*: 'none'"),
      (llama.replace(position=T.PositionConfig('rope', temperature_scale=0.1)),
       r'model.position.temperature_scale: got 0.1; valid .*: 0'),
      (llama.replace(layer_types='sliding,full', sliding_window=8), r"model.layer_types: got 'sliding,full'"),
      (llama.replace(attention_sinks=True), r'model.attention_sinks: got True'),
      (llama.replace(sandwich_norm=True), r"model.activation: got 'swiglu'; valid .*: 'geglu' \(Gemma 3's block\)")):
    with pytest.raises(hugging_face.PretrainedError, match=message):
      hugging_face_export.architecture(changed)


def test_a_gguf_tensor_of_a_quantization_the_package_cannot_dequantize_is_refused_naming_it():
  """Q8_1 is one of the types the gguf package does not dequantize: the tensor and its type are named."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from gguf import GGMLQuantizationType, quants  # pylint: disable=g-import-not-at-top

  class Tensor:
    name, tensor_type = 'blk.0.attn_q.weight', GGMLQuantizationType.Q8_1
    data = np.zeros(quants.GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1][1], np.uint8)

  class Reader:
    tensors = [Tensor()]

  read = gguf_file.tensor_reader(Reader())
  with pytest.raises(hugging_face.PretrainedError, match=r'blk.0.attn_q.weight: quantization type Q8_1, which the '
                     r'gguf package cannot dequantize'):
    read('blk.0.attn_q.weight')


LLAMA = dict(architectures=['LlamaForCausalLM'], num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
             intermediate_size=48, vocab_size=50, num_hidden_layers=1, rms_norm_eps=1e-5, max_position_embeddings=64)


@pytest.mark.parametrize('changes, message', [
    ({'rope_scaling': {'rope_type': 'linear', 'factor': -2}}, r'rope_scaling: factor: got -2; valid: a finite number > 0'),
    ({'rope_scaling': {'rope_type': 'linear', 'factor': 0}}, r'factor: got 0; valid'),
    ({'rope_scaling': {'rope_type': 'linear', 'factor': float('nan')}}, r'factor: got nan; valid'),
    ({'rope_scaling': {'rope_type': 'linear', 'factor': 0.5}}, r'position.extension_factor: got 0.5; valid: a finite '
                                                                r'number >= 1'),
    ({'rope_scaling': {'rope_type': 'linear'}}, r'rope_scaling: factor: missing'),
    ({'rope_scaling': {'rope_type': 'llama3', 'factor': 8.0, 'high_freq_factor': 4.0}}, r'low_freq_factor: missing'),
    ({'rope_theta': 0}, r'rope_theta: got 0; valid: a finite number > 1'),
    ({'rope_theta': -5.0}, r'rope_theta: got -5.0'),
    ({'num_key_value_heads': 3}, r'num_kv_heads: got 3; valid: a divisor of num_heads=4'),
    ({'num_attention_heads': 0}, r'num_attention_heads: got 0; valid: an integer > 0'),
    ({'num_attention_heads': '4'}, r"num_attention_heads: got '4'"),
    ({'rms_norm_eps': None}, r'rms_norm_eps: missing'),
    ({'rope_scaling': {'rope_type': 'linear', 'factor': 2.0}, 'rope_parameters': {'rope_type': 'linear', 'factor': 4.0}},
     r'rope_scaling and rope_parameters disagree \(factor\)'),
    ({'rope_scaling': {'rope_type': 'linear', 'factor': 2.0}, 'rope_parameters': {'rope_type': 'yarn', 'factor': 2.0}},
     r"disagree \(type 'linear' against 'yarn'\)"),
    ({'rope_parameters': {'full_attention': {'rope_theta': 1e6}, 'sliding_attention': {'rope_theta': 1e4}}},
     r'rope_parameters: keyed by full_attention, sliding_attention'),
    ({'rope_scaling': [2.0]}, r'rope_scaling: got \[2.0\]; valid: null or an object'),
    ({'tie_word_embeddings': 'yes'}, r"tie_word_embeddings: got 'yes'; valid: true or false"),
])
def test_a_config_field_out_of_range_is_refused_in_one_line_naming_it(changes, message):
  """Each case raised KeyError, ZeroDivisionError or the library's own ValueError (a traceback) before; now one
  PretrainedError that the command prints as one line."""
  fields = {**LLAMA, **changes}
  fields = {name: value for name, value in fields.items() if value is not None}
  with pytest.raises(hugging_face.PretrainedError, match=message) as raised:
    hugging_face.model_config(fields)
  assert '\n' not in str(raised.value)


def test_gpt_neox_rotating_more_than_its_heads_is_refused():
  neox = dict(architectures=['GPTNeoXForCausalLM'], num_attention_heads=4, hidden_size=64, intermediate_size=96,
              vocab_size=50, num_hidden_layers=1)
  with pytest.raises(hugging_face.PretrainedError, match=r'rotary_pct: got 1.5, which rotates 24 of 16 features'):
    hugging_face.model_config({**neox, 'rotary_pct': 1.5})
  assert hugging_face.model_config({**neox, 'rotary_pct': 0.5}).position.kind == 'p_rope'


def _llama_folder(folder, extra=None, config=None):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  from experiments.pretrained import llama  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  fields = config or LLAMA
  tensors = {row.name: rng.normal(size=row.shape).astype(np.float32)
             for row in llama.table(hugging_face.model_config(fields))}
  save_file({**tensors, **(extra or {})}, str(folder / 'model.safetensors'))
  (folder / 'config.json').write_text(json.dumps(fields))
  return folder


def test_a_tensor_the_config_does_not_describe_is_refused_by_name(tmp_path):
  """A layer beyond num_hidden_layers, or a bias the config does not turn on, was dropped without a word."""
  _llama_folder(tmp_path)
  hugging_face.load(str(tmp_path))
  for extra in ({'model.layers.1.mlp.up_proj.weight': np.zeros((48, 32), np.float32)},
                {'model.layers.0.self_attn.o_proj.bias': np.zeros(32, np.float32)}):
    _llama_folder(tmp_path, extra)
    with pytest.raises(hugging_face.PretrainedError, match=r'holds 1 tensor\(s\) this import does not read \('
                                                           + re.escape(next(iter(extra)))):
      hugging_face.load(str(tmp_path))
  _llama_folder(tmp_path, {'model.layers.0.self_attn.rotary_emb.inv_freq': np.ones(4, np.float32)})
  hugging_face.load(str(tmp_path))  # a buffer transformers recomputes too


def test_files_that_are_not_what_they_claim_are_refused_in_one_line(tmp_path):
  from experiments.pretrained import source  # pylint: disable=g-import-not-at-top
  _llama_folder(tmp_path)
  weights = tmp_path / 'model.safetensors'
  data = weights.read_bytes()
  length = int.from_bytes(data[:8], 'little')
  header = json.loads(data[8:8 + length])
  cases = []
  cases.append(((10 ** 9).to_bytes(8, 'little') + data[8:], r'its header claims 1000000000 bytes'))
  name = 'model.norm.weight'
  lying = json.dumps({**header, name: {**header[name], 'shape': [64]}}, separators=(',', ':')).encode()
  assert len(lying) <= length
  lying += b' ' * (length - len(lying))
  cases.append((data[:8] + lying + data[8 + length:], r'model.norm.weight: shape \[64\] of F32 is 256 bytes, and its '
                                                      r'data_offsets span 128'))
  cases.append((data[:8] + b'[' + b' ' * (length - 2) + b']' + data[8 + length:], r'its header is a JSON list'))
  for content, message in cases:
    weights.write_bytes(content)
    with pytest.raises(hugging_face.PretrainedError, match=message):
      source.read_source(str(tmp_path))
  weights.write_bytes(data)
  for file, content, message in (('config.json', '{"architectures": [', r'config.json: does not read as JSON'),
                                 ('config.json', '[1, 2]', r'config.json: holds a JSON list'),
                                 ('tokenizer.json', 'not json', r'tokenizer.json: does not read as JSON')):
    original = (tmp_path / file).read_text() if (tmp_path / file).exists() else None
    (tmp_path / file).write_text(content)
    with pytest.raises(hugging_face.PretrainedError, match=message):
      source.read_source(str(tmp_path))
    if original is None:
      (tmp_path / file).unlink()
    else:
      (tmp_path / file).write_text(original)
  source.read_source(str(tmp_path))
