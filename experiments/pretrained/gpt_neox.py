"""GPT-NeoX (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B; Black et al. 2022) as this library's decoder: pre-LayerNorm
with biases, exact GELU, the parallel residual x + Attention(LN1(x)) + FFN(LN2(x)) (use_parallel_residual), and
partial rotation (rotary_pct): the first r = rotary_pct x d features of each head are a RoPE of width r (p_rope's
'rescaled' frequencies), the rest unrotated. Its fused query_key_value holds each head's query, key and value rows
together (head after head); its rotated features pair i with i + r/2 (rotate_half), so the first r rows of each
head's query and key are permuted into this library's pairs (2i, 2i + 1) as hugging_face.py does for Llama.
"""

from typing import Callable

import numpy as np

import transformer
from experiments.pretrained import hugging_face
from experiments.pretrained.hugging_face import PretrainedError, checked

ARCHITECTURE = 'GPTNeoXForCausalLM'
ACTIVATIONS = {'gelu': 'gelu_exact', 'gelu_new': 'gelu', 'gelu_pytorch_tanh': 'gelu'}


def rotated_width(hf_config: dict, head_dim: int) -> int:
  fraction = hf_config.get('partial_rotary_factor', hf_config.get('rotary_pct', 1.0))
  parameters = hf_config.get('rope_parameters') or {}
  fraction = parameters.get('partial_rotary_factor', fraction)
  return int(head_dim * fraction)


def model_config(hf_config: dict) -> transformer.ModelConfig:
  width, heads = hf_config['hidden_size'], hf_config['num_attention_heads']
  head_dim = width // heads
  activation = hf_config.get('hidden_act', 'gelu')
  if activation not in ACTIVATIONS:
    raise PretrainedError(f'config.json: hidden_act: got {activation!r}; valid: {", ".join(ACTIVATIONS)}')
  if hf_config.get('attention_bias', True) is False:
    raise PretrainedError('config.json: attention_bias: got false; valid: true (GPT-NeoX\'s projections have biases)')
  rotated = rotated_width(hf_config, head_dim)
  if rotated < 2 or rotated % 2:
    raise PretrainedError(f'config.json: rotary_pct: rotates {rotated} of {head_dim} features; valid: an even '
                          'number of at least 2')
  base = hf_config.get('rotary_emb_base') or (hf_config.get('rope_parameters') or {}).get('rope_theta')
  rope = hugging_face.rope_position({**hf_config, 'rope_theta': float(base or hf_config.get('rope_theta', 10000.0))})
  fields = rope.fields()
  fields.pop('kind')
  if rotated == head_dim:
    position = transformer.PositionConfig('rope', **fields)
  else:
    position = transformer.PositionConfig('p_rope', **fields, rotary_fraction=rotated / head_dim,
                                          rotary_frequencies='rescaled')
  return transformer.ModelConfig(
      vocab_size=hf_config['vocab_size'], model_dim=width, num_heads=heads, num_kv_heads=heads,
      feed_forward_dim=hf_config['intermediate_size'], num_encoder_layers=0,
      num_decoder_layers=hf_config['num_hidden_layers'], dropout_rate=0.0, activation=ACTIVATIONS[activation],
      norm='pre', norm_type='layernorm', layer_norm_eps=float(hf_config.get('layer_norm_eps', 1e-5)), use_bias=True,
      parallel_residual=bool(hf_config.get('use_parallel_residual', True)),
      tie_embeddings=bool(hf_config.get('tie_word_embeddings', False)), scale_embeddings=False, position=position)


def _rotated(config: transformer.ModelConfig) -> int:
  settings = config.position.settings
  return config.head_dim if config.position.kind == 'rope' else 2 * int(settings.rotary_fraction * config.head_dim / 2
                                                                         + 1e-9)


def feature_order(config: transformer.ModelConfig) -> np.ndarray:
  """One head's features in this library's order: the rotated r as pairs (i, i + r/2), then the rest."""
  rotated = _rotated(config)
  return np.concatenate([hugging_face.rotary_order(rotated), np.arange(rotated, config.head_dim)])


def shape(name: str, config: transformer.ModelConfig) -> tuple:
  width, hidden, vocabulary = config.model_dim, config.feed_forward_dim, config.vocab_size
  table = {'query_key_value.weight': (3 * width, width), 'query_key_value.bias': (3 * width,),
           'dense.weight': (width, width), 'dense_h_to_4h.weight': (hidden, width), 'dense_h_to_4h.bias': (hidden,),
           'dense_4h_to_h.weight': (width, hidden), 'embed_in.weight': (vocabulary, width),
           'embed_out.weight': (vocabulary, width)}
  return table.get('.'.join(name.rsplit('.', 2)[-2:]), (width,))


def params(read: Callable[[str], np.ndarray], config: transformer.ModelConfig) -> dict:
  """{'params': ...} of transformer.DecoderOnly(config) from GPTNeoXForCausalLM's tensors, read(name) each."""
  read = checked(read, lambda name: shape(name, config), 'config.json')
  heads, head_dim, width = config.num_heads, config.head_dim, config.model_dim
  order = feature_order(config)

  def norm(name):
    return {'LayerNorm_0': {'scale': read(f'{name}.weight'), 'bias': read(f'{name}.bias')}}
  layers = {}
  for index in range(config.num_decoder_layers):
    prefix = f'gpt_neox.layers.{index}'
    fused = read(f'{prefix}.attention.query_key_value.weight').reshape(heads, 3, head_dim, width)
    fused_bias = read(f'{prefix}.attention.query_key_value.bias').reshape(heads, 3, head_dim)
    attention = {}
    for part, name in enumerate(('query', 'key', 'value')):
      rows, bias = fused[:, part], fused_bias[:, part]
      if name != 'value':
        rows, bias = rows[:, order], bias[:, order]
      attention[name] = {'kernel': rows.reshape(heads * head_dim, width).T, 'bias': bias.reshape(-1)}
    attention['out'] = {'kernel': read(f'{prefix}.attention.dense.weight').T,
                        'bias': read(f'{prefix}.attention.dense.bias')}
    layers[f'layer_{index}'] = {
        'self_attention': attention, 'self_attention_residual': norm(f'{prefix}.input_layernorm'),
        'feed_forward': {'hidden_kernel': read(f'{prefix}.mlp.dense_h_to_4h.weight').T,
                         'hidden_bias': read(f'{prefix}.mlp.dense_h_to_4h.bias'),
                         'output_kernel': read(f'{prefix}.mlp.dense_4h_to_h.weight').T,
                         'output_bias': read(f'{prefix}.mlp.dense_4h_to_h.bias')},
        'feed_forward_residual': norm(f'{prefix}.post_attention_layernorm')}
  final = norm('gpt_neox.final_layer_norm')['LayerNorm_0']
  embedding = {'embedding': {'embedding': read('gpt_neox.embed_in.weight')}}
  if not config.tie_embeddings:  # embed_out has no bias; this library's untied output has one with use_bias
    embedding['output'] = {'kernel': read('embed_out.weight').T, 'bias': np.zeros(config.vocab_size, np.float32)}
  return {'params': {'decoder': {**layers, 'final_norm': final}, 'embedding': embedding}}
