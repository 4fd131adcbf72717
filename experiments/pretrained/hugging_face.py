"""A Hugging Face model folder (config.json and model.safetensors, or shards with model.safetensors.index.json)
as this library's decoder (GPT2LMHeadModel's layout: gpt2.py; GPTNeoXForCausalLM's: gpt_neox.py): the config mapped to transformer.ModelConfig, the weights to its parameters, read
tensor by tensor with safetensors' NumPy API (bfloat16 through ml_dtypes), never needing PyTorch.

The Llama layout (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM): pre-RMSNorm, SwiGLU, grouped-query
attention, RoPE (with its rope_scaling as a context extension), no biases but Qwen2's on the query, key and value
projections, tied or untied embeddings. A
Linear's weight (out x in) is this library's kernel transposed. Hugging Face rotates each head's feature i with
feature i + d/2 (rotate_half); this library rotates features 2i and 2i + 1 (the RoFormer paper's pairs), at the
same frequency base^(-2i/d). So the query and key projections' output features (and Qwen2's biases) are
permuted per head, feature 2i taking Hugging Face's i and 2i + 1 its i + d/2: the rotated products, and every
logit, are then the same.
"""

import json
import math
import os
from typing import Callable

import ml_dtypes
import numpy as np

import transformer

LLAMA_LAYOUT = ('LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM')
SUPPORTED_ARCHITECTURES = (*LLAMA_LAYOUT, 'GPT2LMHeadModel', 'GPTNeoXForCausalLM')
CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'


class PretrainedError(ValueError):
  """A source this importer cannot read or serve, named with what would be valid."""


def read_config(folder: str) -> dict:
  path = os.path.join(folder, CONFIG_FILE)
  if not os.path.isfile(path):
    raise PretrainedError(f'--source: {folder} has no {CONFIG_FILE}; valid: a Hugging Face model folder (config.json '
                          f'with {WEIGHTS_FILE} or {INDEX_FILE})')
  with open(path, encoding='utf-8') as file:
    return json.load(file)


def architecture(hf_config: dict) -> str:
  names = hf_config.get('architectures') or []
  if len(names) != 1 or names[0] not in SUPPORTED_ARCHITECTURES:
    raise PretrainedError(f'config.json: architectures: got {names}; valid: one of '
                          f'{", ".join(SUPPORTED_ARCHITECTURES)}')
  return names[0]


ROPE_TYPES = ('default', 'linear', 'dynamic', 'llama3', 'longrope', 'yarn')


def yarn_scale(factor: float, mscale: float = 1.0) -> float:
  """0.1 mscale ln s + 1 (1 for s <= 1): YaRN's attention factor, and DeepSeek's mscale ratio's terms."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_position(hf_config: dict) -> transformer.PositionConfig:
  """RoPE with the checkpoint's base and its rope_scaling (or transformers 5's rope_parameters) as this library's
  context extension: linear -> pi, llama3, longrope (its factor lists, the set chosen by the sequence's length,
  as transformers does), yarn (its ramp over pair indices, beta_fast, beta_slow, truncate, attention_factor or
  mscale), each with its original_max_position_embeddings; dynamic -> dynamic_ntk_sequence, whose L is
  max_position_embeddings (transformers' dynamic reads that one). Any other type is refused by name, never
  dropped."""
  scaling = {**(hf_config.get('rope_scaling') or {}), **(hf_config.get('rope_parameters') or {})}
  kind = scaling.get('rope_type') or scaling.get('type') or 'default'
  fields = {'rope_base': float(scaling.get('rope_theta', hf_config.get('rope_theta', 10000.0)))}
  longest = hf_config.get('max_position_embeddings')
  original = int(scaling.get('original_max_position_embeddings') or longest or 0)
  if kind == 'linear':
    fields.update(rope_extension='pi', extension_factor=float(scaling['factor']))
  elif kind == 'yarn':
    factor = float(scaling.get('factor') or (longest / original))
    attention = scaling.get('attention_factor')
    if attention is None and scaling.get('mscale') and scaling.get('mscale_all_dim'):
      attention = yarn_scale(factor, scaling['mscale']) / yarn_scale(factor, scaling['mscale_all_dim'])
    fields.update(rope_extension='yarn', extension_factor=factor, original_length=original,
                  yarn_alpha=float(scaling.get('beta_slow') or 1.0), yarn_beta=float(scaling.get('beta_fast') or 32.0),
                  yarn_ramp='dimensions' if scaling.get('truncate', True) else 'exact_dimensions',
                  yarn_attention_factor=float(attention or 0.0))
  elif kind == 'dynamic':
    if not longest:
      raise PretrainedError('config.json: max_position_embeddings: missing; valid: the context length, which '
                            'transformers\' dynamic scaling reads as its original length')
    fields.update(rope_extension='dynamic_ntk_sequence', extension_factor=float(scaling['factor']),
                  original_length=int(longest))
  elif kind == 'llama3':
    fields.update(rope_extension='llama3', extension_factor=float(scaling['factor']), original_length=original,
                  llama3_low_frequency_factor=float(scaling['low_freq_factor']),
                  llama3_high_frequency_factor=float(scaling['high_freq_factor']))
  elif kind == 'longrope':
    fields.update(rope_extension='longrope', extension_factor=max(1.0, (longest or original) / original),
                  original_length=original,
                  longrope_short_factors=' '.join(str(float(f)) for f in scaling['short_factor']),
                  longrope_long_factors=' '.join(str(float(f)) for f in scaling['long_factor']),
                  longrope_attention_factor=float(scaling.get('attention_factor') or 0.0), longrope_by_length=True)
  elif kind != 'default':
    raise PretrainedError(f'config.json: rope scaling type {kind!r}; valid: {", ".join(ROPE_TYPES)}')
  return transformer.PositionConfig('rope', **fields)


def model_config(hf_config: dict) -> transformer.ModelConfig:
  """This library's config of the checkpoint's model; PretrainedError naming the field it cannot serve."""
  name = architecture(hf_config)
  if name == 'GPT2LMHeadModel':
    from experiments.pretrained import gpt2  # pylint: disable=g-import-not-at-top
    return gpt2.model_config(hf_config)
  if name == 'GPTNeoXForCausalLM':
    from experiments.pretrained import gpt_neox  # pylint: disable=g-import-not-at-top
    return gpt_neox.model_config(hf_config)
  heads = hf_config['num_attention_heads']
  width = hf_config['hidden_size']
  head_dim = hf_config.get('head_dim') or width // heads
  if head_dim * heads != width:
    raise PretrainedError(f'config.json: head_dim: got {head_dim} with hidden_size={width} and {heads} heads; valid: '
                          f'hidden_size / num_attention_heads = {width // heads}')
  if hf_config.get('hidden_act', 'silu') != 'silu':
    raise PretrainedError(f'config.json: hidden_act: got {hf_config["hidden_act"]!r}; valid: silu (SwiGLU)')
  for field in ('attention_dropout', 'mlp_bias'):
    if hf_config.get(field):
      raise PretrainedError(f'config.json: {field}: got {hf_config[field]!r}; valid: 0 or false')
  window, longest = hf_config.get('sliding_window'), hf_config.get('max_position_embeddings') or 0
  if window and hf_config.get('use_sliding_window', True) and window < longest:
    raise PretrainedError(f'config.json: sliding_window: got {window} with max_position_embeddings={longest}; valid: '
                          'null, or at least max_position_embeddings (every query here reads every earlier key, so '
                          'beyond the window the logits would not be the model\'s)')
  qkv_bias = name == 'Qwen2ForCausalLM' or bool(hf_config.get('attention_bias', False))
  return transformer.ModelConfig(
      vocab_size=hf_config['vocab_size'], model_dim=width, num_heads=heads,
      num_kv_heads=hf_config.get('num_key_value_heads') or heads, feed_forward_dim=hf_config['intermediate_size'],
      num_encoder_layers=0, num_decoder_layers=hf_config['num_hidden_layers'], dropout_rate=0.0, activation='swiglu',
      norm='pre', norm_type='rmsnorm', layer_norm_eps=float(hf_config['rms_norm_eps']), use_bias=False,
      qkv_bias=qkv_bias, tie_embeddings=bool(hf_config.get('tie_word_embeddings', False)), scale_embeddings=False,
      position=rope_position(hf_config))


def weight_files(folder: str) -> list:
  """The folder's safetensors files: model.safetensors, or the shards its index names."""
  single, index = os.path.join(folder, WEIGHTS_FILE), os.path.join(folder, INDEX_FILE)
  if os.path.isfile(single):
    return [single]
  if os.path.isfile(index):
    with open(index, encoding='utf-8') as file:
      shards = sorted(set(json.load(file)['weight_map'].values()))
    return [os.path.join(folder, shard) for shard in shards]
  raise PretrainedError(f'--source: {folder} has neither {WEIGHTS_FILE} nor {INDEX_FILE}; valid: a Hugging Face model '
                        'folder of safetensors')


def _header(path: str) -> tuple[dict, int]:
  """A safetensors file's header (name: dtype, shape, data_offsets) and where its data start."""
  with open(path, 'rb') as file:
    size = int.from_bytes(file.read(8), 'little')
    return json.loads(file.read(size)), 8 + size


class Tensors:
  """The tensors of a folder's safetensors files, each read when asked for, as float32 NumPy arrays: safetensors'
  NumPy API, and bfloat16 (which NumPy lacks) from the file's own bytes through ml_dtypes."""

  def __init__(self, folder: str):
    self.where = {}
    for path in weight_files(folder):
      try:
        header, start = _header(path)
      except (ValueError, UnicodeDecodeError) as error:
        raise PretrainedError(f'{path}: its header does not read ({" ".join(str(error).split())[:120]}); valid: a '
                              'complete safetensors file') from None
      entries = {name: entry for name, entry in header.items() if name != '__metadata__'}
      needed = start + max((entry['data_offsets'][1] for entry in entries.values()), default=0)
      if os.path.getsize(path) < needed:
        raise PretrainedError(f'{path}: truncated ({os.path.getsize(path)} bytes, its header describes {needed}); '
                              'valid: the complete file')
      for name, entry in entries.items():
        self.where[name] = (path, start, entry)

  def names(self) -> list:
    return sorted(self.where)

  def stored_dtype(self, name: str) -> str:
    """The tensor's dtype in the file ('F32', 'F16', 'BF16', ...)."""
    return self.where[name][2]['dtype']

  def __call__(self, name: str) -> np.ndarray:
    if name not in self.where:
      raise PretrainedError(f'the checkpoint has no tensor {name!r}; it has {len(self.where)} others')
    path, start, entry = self.where[name]
    if entry['dtype'] == 'BF16':
      begin, end = entry['data_offsets']
      raw = np.fromfile(path, dtype=np.uint16, count=(end - begin) // 2, offset=start + begin)
      return raw.view(ml_dtypes.bfloat16).reshape(entry['shape']).astype(np.float32)
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    with safe_open(path, framework='np') as file:
      return np.asarray(file.get_tensor(name), dtype=np.float32)


def rotary_order(head_dim: int) -> np.ndarray:
  """The permutation of one head's features from Hugging Face's rotate_half layout to this library's pairs:
  feature 2i is Hugging Face's i, feature 2i + 1 its i + d/2."""
  half = head_dim // 2
  return np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)


def _per_head(rows_NxI: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
  """A query or key projection's output rows (heads x head width first) in this library's rotary order."""
  order = rotary_order(head_dim)
  return rows_NxI.reshape(heads, head_dim, *rows_NxI.shape[1:])[:, order].reshape(rows_NxI.shape)


def halves_per_head(rows_NxI: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
  """A query or key projection's output rows from this library's rotary pairs back to Hugging Face's halves (the
  inverse of _per_head)."""
  inverse = np.argsort(rotary_order(head_dim))
  return rows_NxI.reshape(heads, head_dim, *rows_NxI.shape[1:])[:, inverse].reshape(rows_NxI.shape)


def checked(read: Callable[[str], np.ndarray], shape_of: Callable[[str], tuple], where: str):
  """read(name), refusing a tensor whose shape is not shape_of(name), the one the config gives."""

  def read_checked(name: str) -> np.ndarray:
    array = read(name)
    if tuple(array.shape) != tuple(shape_of(name)):
      raise PretrainedError(f'{name}: shape {tuple(array.shape)}; valid: {tuple(shape_of(name))}, the shape {where} '
                            'gives it')
    return array
  return read_checked


def unbiased_output(rows_VxD: np.ndarray) -> dict:
  """An untied output projection without a bias (GPT-2's lm_head, GPT-NeoX's embed_out) as this library's, which
  has one under use_bias: the kernel, and a bias of zeros."""
  return {'kernel': rows_VxD.T, 'bias': np.zeros(rows_VxD.shape[0], np.float32)}


def llama_shape(name: str, config: transformer.ModelConfig) -> tuple:
  """The shape config.json gives a Llama-layout tensor (a Linear's weight out x in)."""
  width, vocabulary, hidden = config.model_dim, config.vocab_size, config.feed_forward_dim
  queries, keys = config.num_heads * config.head_dim, config.key_value_heads * config.head_dim
  leaf = name.rsplit('.', 2)
  table = {'q_proj.weight': (queries, width), 'k_proj.weight': (keys, width), 'v_proj.weight': (keys, width),
           'o_proj.weight': (width, queries), 'q_proj.bias': (queries,), 'k_proj.bias': (keys,),
           'v_proj.bias': (keys,), 'gate_proj.weight': (hidden, width), 'up_proj.weight': (hidden, width),
           'down_proj.weight': (width, hidden), 'embed_tokens.weight': (vocabulary, width),
           'lm_head.weight': (vocabulary, width)}
  return table.get('.'.join(leaf[-2:]), (width,))  # the norms' scales


def llama_params(read: Callable[[str], np.ndarray], config: transformer.ModelConfig, where: str = 'config.json'
                 ) -> dict:
  """{'params': ...} of transformer.DecoderOnly(config) from the Llama layout's tensors, read(name) each; where: what
  gave config (named when a tensor's shape is not the one it gives)."""
  heads, kv_heads, head_dim = config.num_heads, config.key_value_heads, config.head_dim
  read = checked(read, lambda name: llama_shape(name, config), where)

  def linear(name):
    return read(f'{name}.weight').T

  layers = {}
  for index in range(config.num_decoder_layers):
    prefix = f'model.layers.{index}'
    attention = {}
    for ours, theirs, count in (('query', 'q_proj', heads), ('key', 'k_proj', kv_heads), ('value', 'v_proj', kv_heads)):
      weight = read(f'{prefix}.self_attn.{theirs}.weight')
      if ours != 'value':
        weight = _per_head(weight, count, head_dim)
      attention[ours] = {'kernel': weight.T}
      if config.qkv_bias:
        bias = read(f'{prefix}.self_attn.{theirs}.bias')
        attention[ours]['bias'] = bias if ours == 'value' else _per_head(bias, count, head_dim)
    attention['out'] = {'kernel': linear(f'{prefix}.self_attn.o_proj')}
    layers[f'layer_{index}'] = {
        'self_attention': attention,
        'self_attention_residual': {'RMSNorm_0': {'scale': read(f'{prefix}.input_layernorm.weight')}},
        'feed_forward': {'gate_kernel': linear(f'{prefix}.mlp.gate_proj'),
                         'hidden_kernel': linear(f'{prefix}.mlp.up_proj'),
                         'output_kernel': linear(f'{prefix}.mlp.down_proj')},
        'feed_forward_residual': {'RMSNorm_0': {'scale': read(f'{prefix}.post_attention_layernorm.weight')}},
    }
  embedding = {'embedding': {'embedding': read('model.embed_tokens.weight')}}
  if not config.tie_embeddings:
    embedding['output'] = {'kernel': linear('lm_head')}
  decoder = {**layers, 'final_norm': {'scale': read('model.norm.weight')}}
  return {'params': {'decoder': decoder, 'embedding': embedding}}


def params_of(read: Callable[[str], np.ndarray], config: transformer.ModelConfig, name: str) -> dict:
  """{'params': ...} of the architecture's tensors, read(name) each."""
  if name == 'GPT2LMHeadModel':
    from experiments.pretrained import gpt2  # pylint: disable=g-import-not-at-top
    return gpt2.params(read, config)
  if name == 'GPTNeoXForCausalLM':
    from experiments.pretrained import gpt_neox  # pylint: disable=g-import-not-at-top
    return gpt_neox.params(read, config)
  return llama_params(read, config)


def load(folder: str) -> tuple[transformer.ModelConfig, dict]:
  """(the model's config, its parameters) from a Hugging Face model folder."""
  hf_config = read_config(folder)
  config = model_config(hf_config)
  return config, params_of(Tensors(folder), config, architecture(hf_config))
