"""A GGUF file (llama.cpp's format) of the llama architecture as this library's decoder: its metadata mapped to
transformer.ModelConfig, its tensors read with the `gguf` package and dequantized to float32 (Q4_1, Q8_0, F16,
F32 and the other types the package knows).

llama.cpp's converter stores each head's query and key rows in interleaved order (row 2i is Hugging Face's row i,
row 2i + 1 its row i + d/2), which is this library's rotary layout (features 2i and 2i + 1 turn together): they
are taken as they are. A file without `output.weight` ties the output to the token embedding. GGUF lists a matrix's
dimensions fastest first; the package hands its rows as NumPy's (out x in), a Linear's weight.
"""

from typing import Callable

import numpy as np

import transformer
from experiments.pretrained.hugging_face import PretrainedError

SUPPORTED_ARCHITECTURES = ('llama',)


def _field(reader, name: str, default=None):
  field = reader.fields.get(name)
  if field is None:
    if default is None:
      raise PretrainedError(f'--source: the GGUF file has no {name}; valid: a llama.cpp GGUF of the llama architecture')
    return default
  return field.contents()


def model_config(reader) -> transformer.ModelConfig:
  """This library's config of the file's model; PretrainedError naming the key it cannot serve."""
  architecture = _field(reader, 'general.architecture')
  if architecture not in SUPPORTED_ARCHITECTURES:
    raise PretrainedError(f'general.architecture: got {architecture!r}; valid: {", ".join(SUPPORTED_ARCHITECTURES)}')
  width, heads = int(_field(reader, 'llama.embedding_length')), int(_field(reader, 'llama.attention.head_count'))
  head_dim = width // heads
  rotated = int(_field(reader, 'llama.rope.dimension_count', head_dim))
  if rotated != head_dim:
    raise PretrainedError(f'llama.rope.dimension_count: got {rotated}; valid: the head width {head_dim} (partial '
                          'rotary is not read from a GGUF file yet)')
  scaling = _field(reader, 'llama.rope.scaling.type', 'none')
  if scaling != 'none':
    raise PretrainedError(f'llama.rope.scaling.type: got {scaling!r}; valid here: none')
  names = {tensor.name for tensor in reader.tensors}
  vocabulary = next(tensor for tensor in reader.tensors if tensor.name == 'token_embd.weight').shape[-1]
  return transformer.ModelConfig(
      vocab_size=int(vocabulary), model_dim=width, num_heads=heads,
      num_kv_heads=int(_field(reader, 'llama.attention.head_count_kv', heads)),
      feed_forward_dim=int(_field(reader, 'llama.feed_forward_length')), num_encoder_layers=0,
      num_decoder_layers=int(_field(reader, 'llama.block_count')), dropout_rate=0.0, activation='swiglu', norm='pre',
      norm_type='rmsnorm', layer_norm_eps=float(_field(reader, 'llama.attention.layer_norm_rms_epsilon')),
      use_bias=False, tie_embeddings='output.weight' not in names, scale_embeddings=False,
      position=transformer.PositionConfig('rope', rope_base=float(_field(reader, 'llama.rope.freq_base', 10000.0))))


def tensor_reader(reader) -> Callable[[str], np.ndarray]:
  """read(name) -> the tensor dequantized to float32, NumPy's (out x in) for a matrix."""
  from gguf import quants  # pylint: disable=g-import-not-at-top
  tensors = {tensor.name: tensor for tensor in reader.tensors}

  def read(name: str) -> np.ndarray:
    if name not in tensors:
      raise PretrainedError(f'the GGUF file has no tensor {name!r}')
    tensor = tensors[name]
    return np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
  return read


def llama_params(read: Callable[[str], np.ndarray], config: transformer.ModelConfig) -> dict:
  """{'params': ...} of transformer.DecoderOnly(config) from the file's tensors (llama.cpp's names)."""
  layers = {}
  for index in range(config.num_decoder_layers):
    block = f'blk.{index}'
    layers[f'layer_{index}'] = {
        'self_attention': {ours: {'kernel': read(f'{block}.{theirs}.weight').T}
                           for ours, theirs in (('query', 'attn_q'), ('key', 'attn_k'), ('value', 'attn_v'),
                                                ('out', 'attn_output'))},
        'self_attention_residual': {'RMSNorm_0': {'scale': read(f'{block}.attn_norm.weight')}},
        'feed_forward': {'gate_kernel': read(f'{block}.ffn_gate.weight').T,
                         'hidden_kernel': read(f'{block}.ffn_up.weight').T,
                         'output_kernel': read(f'{block}.ffn_down.weight').T},
        'feed_forward_residual': {'RMSNorm_0': {'scale': read(f'{block}.ffn_norm.weight')}},
    }
  embedding = {'embedding': {'embedding': read('token_embd.weight')}}
  if not config.tie_embeddings:
    embedding['output'] = {'kernel': read('output.weight').T}
  return {'params': {'decoder': {**layers, 'final_norm': {'scale': read('output_norm.weight')}},
                     'embedding': embedding}}


def load(path: str) -> tuple[transformer.ModelConfig, dict]:
  """(the model's config, its parameters, dequantized to float32) from a GGUF file."""
  from gguf import GGUFReader  # pylint: disable=g-import-not-at-top
  reader = GGUFReader(path)
  config = model_config(reader)
  return config, llama_params(tensor_reader(reader), config)
