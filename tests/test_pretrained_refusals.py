"""What the checkpoints' import refuses (experiments/pretrained/), each by name with what would be valid: these need
no PyTorch, unlike tests/test_pretrained.py's comparisons."""

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
  with pytest.raises(hugging_face.PretrainedError, match=r'sliding_window: got 4096 with max_position_embeddings=32768'):
    hugging_face.model_config({**base, 'architectures': ['MistralForCausalLM'], 'sliding_window': 4096,
                               'max_position_embeddings': 32768})
  for served in ({'sliding_window': None}, {'sliding_window': 4096, 'use_sliding_window': False},
                 {'sliding_window': 32768}):
    hugging_face.model_config({**base, 'architectures': ['MistralForCausalLM'], 'max_position_embeddings': 32768,
                               **served})
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
      (llama.replace(position=T.PositionConfig('rope', ssmax=True)), r'model.position.ssmax: got True')):
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
