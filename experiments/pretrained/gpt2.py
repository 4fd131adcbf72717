"""GPT-2 (GPT2LMHeadModel, Radford et al. 2019) as this library's decoder and back: learned absolute positions
(transformer.wpe, n_positions rows), pre-LayerNorm with biases, the tanh approximation of GELU (gelu_new), a
feed-forward n_inner wide (4 x n_embd by default), tied embeddings. Its Conv1D layers store weights as (in x out),
this library's kernel as it is; the attention's fused c_attn holds the query, key and value kernels side by side.
"""

from typing import Callable

import numpy as np
from flax.core import meta

import transformer
from experiments.pretrained.hugging_face import PretrainedError, checked, unbiased_output

ARCHITECTURE = 'GPT2LMHeadModel'
TANH_GELU = ('gelu_new', 'gelu_pytorch_tanh')  # this library's gelu is jax.nn.gelu, the tanh approximation


def model_config(hf_config: dict) -> transformer.ModelConfig:
  width, heads = hf_config['n_embd'], hf_config['n_head']
  activation = hf_config.get('activation_function', 'gelu_new')
  if activation not in TANH_GELU:
    raise PretrainedError(f'config.json: activation_function: got {activation!r}; valid: {", ".join(TANH_GELU)} '
                          '(the tanh approximation of GELU, which this library computes)')
  for field in ('scale_attn_by_inverse_layer_idx', 'reorder_and_upcast_attn', 'add_cross_attention'):
    if hf_config.get(field):
      raise PretrainedError(f'config.json: {field}: got {hf_config[field]!r}; valid: false')
  if hf_config.get('scale_attn_weights', True) is False:
    raise PretrainedError('config.json: scale_attn_weights: got false; valid: true (logits / sqrt(head width))')
  return transformer.ModelConfig(
      vocab_size=hf_config['vocab_size'], model_dim=width, num_heads=heads, num_kv_heads=heads,
      feed_forward_dim=hf_config.get('n_inner') or 4 * width, num_encoder_layers=0,
      num_decoder_layers=hf_config['n_layer'], dropout_rate=0.0, activation='gelu', norm='pre',
      norm_type='layernorm', layer_norm_eps=float(hf_config.get('layer_norm_epsilon', 1e-5)), use_bias=True,
      tie_embeddings=bool(hf_config.get('tie_word_embeddings', True)), scale_embeddings=False,
      position=transformer.PositionConfig('learned', max_length=int(hf_config['n_positions'])))


def shape(name: str, config: transformer.ModelConfig) -> tuple:
  width, hidden = config.model_dim, config.feed_forward_dim
  rows = config.position.settings.max_length
  table = {'c_attn.weight': (width, 3 * width), 'c_attn.bias': (3 * width,), 'c_fc.weight': (width, hidden),
           'c_fc.bias': (hidden,), 'wte.weight': (config.vocab_size, width), 'wpe.weight': (rows, width),
           'lm_head.weight': (config.vocab_size, width)}
  leaf = '.'.join(name.rsplit('.', 2)[-2:])
  if leaf == 'c_proj.weight':
    return (hidden, width) if '.mlp.' in name else (width, width)
  return table.get(leaf, (width,))


def params(read: Callable[[str], np.ndarray], config: transformer.ModelConfig) -> dict:
  """{'params': ...} of transformer.DecoderOnly(config) from GPT2LMHeadModel's tensors, read(name) each."""
  read = checked(read, lambda name: shape(name, config), 'config.json')
  width = config.model_dim

  def norm(name):
    return {'LayerNorm_0': {'scale': read(f'{name}.weight'), 'bias': read(f'{name}.bias')}}
  layers = {}
  for index in range(config.num_decoder_layers):
    prefix = f'transformer.h.{index}'
    fused, fused_bias = read(f'{prefix}.attn.c_attn.weight'), read(f'{prefix}.attn.c_attn.bias')
    attention = {name: {'kernel': fused[:, part * width:(part + 1) * width],
                        'bias': fused_bias[part * width:(part + 1) * width]}
                 for part, name in enumerate(('query', 'key', 'value'))}
    attention['out'] = {'kernel': read(f'{prefix}.attn.c_proj.weight'), 'bias': read(f'{prefix}.attn.c_proj.bias')}
    layers[f'layer_{index}'] = {
        'self_attention': attention, 'self_attention_residual': norm(f'{prefix}.ln_1'),
        'feed_forward': {'hidden_kernel': read(f'{prefix}.mlp.c_fc.weight'), 'hidden_bias': read(f'{prefix}.mlp.c_fc.bias'),
                         'output_kernel': read(f'{prefix}.mlp.c_proj.weight'),
                         'output_bias': read(f'{prefix}.mlp.c_proj.bias')},
        'feed_forward_residual': norm(f'{prefix}.ln_2')}
  final = norm('transformer.ln_f')['LayerNorm_0']
  embedding = {'embedding': {'embedding': read('transformer.wte.weight')}}
  if not config.tie_embeddings:
    embedding['output'] = unbiased_output(read('lm_head.weight'))
  return {'params': {'decoder': {**layers, 'final_norm': final, 'position': {'table': read('transformer.wpe.weight')}},
                     'embedding': embedding}}


def exportable(config: transformer.ModelConfig) -> bool:
  """Whether the run's model is GPT-2's block: learned positions, pre-LayerNorm, GELU, biases, multi-head."""
  return (config.position.kind == 'learned' and config.norm == 'pre' and config.norm_type == 'layernorm'
          and config.activation == 'gelu' and config.use_bias and config.key_value_heads == config.num_heads
          and not config.parallel_residual and not config.scale_embeddings and config.architecture == 'transformer'
          and config.position.settings.interpolation_factor == 1.0)


def hf_config(config: transformer.ModelConfig) -> dict:
  return dict(architectures=[ARCHITECTURE], model_type='gpt2', vocab_size=config.vocab_size,
              n_positions=config.position.settings.max_length, n_embd=config.model_dim, n_layer=config.num_decoder_layers,
              n_head=config.num_heads, n_inner=config.feed_forward_dim, activation_function='gelu_new',
              layer_norm_epsilon=config.layer_norm_eps, tie_word_embeddings=config.tie_embeddings, resid_pdrop=0.0,
              embd_pdrop=0.0, attn_pdrop=0.0, torch_dtype='float32')


def tensors(variables: dict, config: transformer.ModelConfig) -> dict:
  """{GPT2LMHeadModel name: float32 NumPy array} of transformer.DecoderOnly(config)'s {'params': ...}."""
  tree = meta.unbox(variables)['params']
  found = {'transformer.wte.weight': tree['embedding']['embedding']['embedding'],
           'transformer.wpe.weight': tree['decoder']['position']['table'],
           'transformer.ln_f.weight': tree['decoder']['final_norm']['scale'],
           'transformer.ln_f.bias': tree['decoder']['final_norm']['bias']}
  if not config.tie_embeddings:
    if np.any(np.asarray(tree['embedding']['output']['bias'])):
      raise PretrainedError('model.tie_embeddings: got False, with an output bias; valid for GPT2LMHeadModel: tied '
                            'embeddings, or an output bias of zeros (its lm_head has none)')
    found['lm_head.weight'] = np.asarray(tree['embedding']['output']['kernel']).T
  for index in range(config.num_decoder_layers):
    layer, prefix = tree['decoder'][f'layer_{index}'], f'transformer.h.{index}'
    attention = layer['self_attention']
    found[f'{prefix}.attn.c_attn.weight'] = np.concatenate([attention[n]['kernel'] for n in ('query', 'key', 'value')],
                                                           axis=1)
    found[f'{prefix}.attn.c_attn.bias'] = np.concatenate([attention[n]['bias'] for n in ('query', 'key', 'value')])
    found[f'{prefix}.attn.c_proj.weight'] = attention['out']['kernel']
    found[f'{prefix}.attn.c_proj.bias'] = attention['out']['bias']
    feed_forward = layer['feed_forward']
    found.update({f'{prefix}.mlp.c_fc.weight': feed_forward['hidden_kernel'],
                  f'{prefix}.mlp.c_fc.bias': feed_forward['hidden_bias'],
                  f'{prefix}.mlp.c_proj.weight': feed_forward['output_kernel'],
                  f'{prefix}.mlp.c_proj.bias': feed_forward['output_bias']})
    for ours, theirs in (('self_attention_residual', 'ln_1'), ('feed_forward_residual', 'ln_2')):
      found[f'{prefix}.{theirs}.weight'] = layer[ours]['LayerNorm_0']['scale']
      found[f'{prefix}.{theirs}.bias'] = layer[ours]['LayerNorm_0']['bias']
  return {name: np.ascontiguousarray(np.asarray(array, np.float32)) for name, array in found.items()}
