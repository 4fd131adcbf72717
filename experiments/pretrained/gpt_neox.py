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
from experiments.pretrained.hugging_face import PretrainedError, checked, unbiased_output

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
  if not config.tie_embeddings:
    embedding['output'] = unbiased_output(read('embed_out.weight'))
  return {'params': {'decoder': {**layers, 'final_norm': final}, 'embedding': embedding}}


def exportable(config: transformer.ModelConfig) -> bool:
  """Whether the run's model is GPT-NeoX's block: pre-LayerNorm, GELU (either form), biases, multi-head, untied,
  RoPE or p_rope's rescaled partial rotation without an extension."""
  position = config.position
  rotary = position.kind == 'rope' or (position.kind == 'p_rope' and position.settings.rotary_frequencies == 'rescaled')
  return (rotary and position.settings.rope_extension == 'none' and not position.settings.ssmax
          and config.norm == 'pre' and config.norm_type == 'layernorm' and config.activation in ('gelu', 'gelu_exact')
          and config.use_bias and config.key_value_heads == config.num_heads and not config.tie_embeddings
          and not config.scale_embeddings and config.architecture == 'transformer')


def hf_config(config: transformer.ModelConfig, context_length: int) -> dict:
  head_dim = config.head_dim
  return dict(architectures=[ARCHITECTURE], model_type='gpt_neox', vocab_size=config.vocab_size,
              hidden_size=config.model_dim, num_attention_heads=config.num_heads,
              num_hidden_layers=config.num_decoder_layers, intermediate_size=config.feed_forward_dim,
              hidden_act={'gelu_exact': 'gelu', 'gelu': 'gelu_new'}[config.activation],
              rotary_pct=_rotated(config) / head_dim, rotary_emb_base=config.position.settings.rope_base,
              max_position_embeddings=context_length, layer_norm_eps=config.layer_norm_eps,
              use_parallel_residual=config.parallel_residual, tie_word_embeddings=False, attention_bias=True,
              hidden_dropout=0.0, attention_dropout=0.0, torch_dtype='float32')


def tensors(variables: dict, config: transformer.ModelConfig) -> dict:
  """{GPTNeoXForCausalLM name: float32 NumPy array} of transformer.DecoderOnly(config)'s {'params': ...}."""
  from flax.core import meta  # pylint: disable=g-import-not-at-top
  tree = meta.unbox(variables)['params']
  heads, head_dim, width = config.num_heads, config.head_dim, config.model_dim
  inverse = np.argsort(feature_order(config))
  if np.any(np.asarray(tree['embedding']['output']['bias'])):
    raise PretrainedError('model.use_bias: the output projection has a bias; valid for GPTNeoXForCausalLM: an output '
                          'bias of zeros (its embed_out has none)')
  found = {'gpt_neox.embed_in.weight': tree['embedding']['embedding']['embedding'],
           'embed_out.weight': np.asarray(tree['embedding']['output']['kernel']).T,
           'gpt_neox.final_layer_norm.weight': tree['decoder']['final_norm']['scale'],
           'gpt_neox.final_layer_norm.bias': tree['decoder']['final_norm']['bias']}
  for index in range(config.num_decoder_layers):
    layer, prefix = tree['decoder'][f'layer_{index}'], f'gpt_neox.layers.{index}'
    attention = layer['self_attention']
    rows, biases = [], []
    for name in ('query', 'key', 'value'):
      kernel = np.asarray(attention[name]['kernel']).T.reshape(heads, head_dim, width)
      bias = np.asarray(attention[name]['bias']).reshape(heads, head_dim)
      if name != 'value':
        kernel, bias = kernel[:, inverse], bias[:, inverse]
      rows.append(kernel)
      biases.append(bias)
    found[f'{prefix}.attention.query_key_value.weight'] = np.stack(rows, axis=1).reshape(3 * width, width)
    found[f'{prefix}.attention.query_key_value.bias'] = np.stack(biases, axis=1).reshape(3 * width)
    found[f'{prefix}.attention.dense.weight'] = np.asarray(attention['out']['kernel']).T
    found[f'{prefix}.attention.dense.bias'] = attention['out']['bias']
    feed_forward = layer['feed_forward']
    found.update({f'{prefix}.mlp.dense_h_to_4h.weight': np.asarray(feed_forward['hidden_kernel']).T,
                  f'{prefix}.mlp.dense_h_to_4h.bias': feed_forward['hidden_bias'],
                  f'{prefix}.mlp.dense_4h_to_h.weight': np.asarray(feed_forward['output_kernel']).T,
                  f'{prefix}.mlp.dense_4h_to_h.bias': feed_forward['output_bias']})
    for ours, theirs in (('self_attention_residual', 'input_layernorm'),
                         ('feed_forward_residual', 'post_attention_layernorm')):
      found[f'{prefix}.{theirs}.weight'] = layer[ours]['LayerNorm_0']['scale']
      found[f'{prefix}.{theirs}.bias'] = layer[ours]['LayerNorm_0']['bias']
  return {name: np.ascontiguousarray(np.asarray(array, np.float32)) for name, array in found.items()}
