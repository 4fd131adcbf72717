"""The Gemma 2 and Gemma 3 layout (Gemma2ForCausalLM, Gemma3ForCausalLM; Gemma Team 2024, 2025), read onto this
library's fields: local and global layers (model.layer_types, sliding_window: a query sees itself and the W - 1 keys
before it, as transformers masks it), Gemma 3's two RoPE bases (model.position for the global layers, its
local_position for the sliding ones), per-head QK-norm (Gemma 3), a norm before and after attention and the
feed-forward (model.sandwich_norm), GeGLU with the tanh GELU, heads wider than the width divides into
(model.head_width), logits scaled by query_pre_attn_scalar^-1/2 (model.query_scale), embeddings times sqrt(width),
tied output, Gemma 2's attention and final soft caps.

Gemma's RMSNorm multiplies by (1 + w) and its checkpoints store w: the import reads 1 + w into the norm's scale, the
export writes scale - 1. Query and key rows (and the QK-norm scales) are permuted per head between rotate_half's
halves and this library's pairs (tables.rotary), as for Llama.
"""

import numpy as np

import transformer
from experiments.pretrained import rope_config, tables
from experiments.pretrained.tables import PretrainedError, flag, layer_path, number

ARCHITECTURES = ('Gemma2ForCausalLM', 'Gemma3ForCausalLM')
BLOCK = dict(architecture='transformer', norm='pre', norm_type='rmsnorm', activation='geglu', use_bias=False,
             parallel_residual=False, scale_embeddings=True, sandwich_norm=True)
EMBEDDING, FINAL_NORM, OUTPUT = 'model.embed_tokens.weight', 'model.norm.weight', 'lm_head.weight'
LAYER_TYPES = tables.HF_LAYER_TYPES


def _layer_types(hf_config: dict, name: str, layers: int) -> list:
  """Each layer's kind: transformers 5's layer_types, else Gemma 3's sliding_window_pattern (every Nth layer global)
  or Gemma 2's alternation (even layers sliding)."""
  listed = tables.listed_layer_types(hf_config, layers)
  if listed is not None:
    return listed
  if name == 'Gemma2ForCausalLM':
    return ['sliding' if index % 2 == 0 else 'full' for index in range(layers)]
  pattern = number(hf_config, 'sliding_window_pattern', None, integer=True) or number(
      hf_config, '_sliding_window_pattern', 6, integer=True)
  return tables.every_nth_global(layers, pattern)


def _positions(hf_config: dict, name: str) -> tuple:
  """(the global layers' RoPE, the sliding layers'): rope_parameters keyed by layer type (transformers 5), or
  rope_theta and rope_scaling for the global layers and rope_local_base_freq for the local ones (Gemma 3's older
  schema); Gemma 2 has one RoPE for both."""
  keyed = rope_config.positions_by_layer_type(hf_config, LAYER_TYPES)
  if keyed is not None:
    return keyed
  global_position = rope_config.rope_position(hf_config)
  if name == 'Gemma2ForCausalLM':
    return global_position, None
  local_base = number(hf_config, 'rope_local_base_freq', 10000.0, minimum=1.0)
  return global_position, rope_config.rope_position(
      {**hf_config, 'rope_theta': local_base, 'rope_scaling': None, 'rope_parameters': None})


def model_config(hf_config: dict, name: str) -> transformer.ModelConfig:
  """This library's config of a Gemma 2 or 3 checkpoint; PretrainedError naming the field it cannot serve."""
  if hf_config.get('hidden_activation', 'gelu_pytorch_tanh') != 'gelu_pytorch_tanh':
    raise PretrainedError(f'config.json: hidden_activation: got {hf_config["hidden_activation"]!r}; valid: '
                          'gelu_pytorch_tanh (GeGLU with the tanh GELU)')
  for field in ('attention_bias', 'use_bidirectional_attention'):
    if flag(hf_config, field, False):
      raise PretrainedError(f'config.json: {field}: got true; valid: false (a causal decoder without biases)')
  if hf_config.get('attention_dropout'):
    raise PretrainedError(f'config.json: attention_dropout: got {hf_config["attention_dropout"]!r}; valid: 0')
  layers = number(hf_config, 'num_hidden_layers', integer=True)
  kinds = _layer_types(hf_config, name, layers)
  position, local_position = _positions(hf_config, name)
  window = number(hf_config, 'sliding_window', integer=True) if 'sliding' in kinds else 0
  heads = number(hf_config, 'num_attention_heads', integer=True)
  return tables.model_config(
      **BLOCK, vocab_size=number(hf_config, 'vocab_size', integer=True),
      model_dim=number(hf_config, 'hidden_size', integer=True), num_heads=heads,
      head_width=number(hf_config, 'head_dim', integer=True),
      num_kv_heads=number(hf_config, 'num_key_value_heads', heads, integer=True),
      feed_forward_dim=number(hf_config, 'intermediate_size', integer=True), num_encoder_layers=0,
      num_decoder_layers=layers, dropout_rate=0.0, layer_norm_eps=number(hf_config, 'rms_norm_eps'),
      layer_types=tables.layer_cycle(kinds), sliding_window=window, position=position,
      local_position=local_position if 'sliding' in kinds and local_position != position else None,
      qk_norm='head' if name == 'Gemma3ForCausalLM' else 'none',
      tie_embeddings=flag(hf_config, 'tie_word_embeddings', True),
      query_scale=number(hf_config, 'query_pre_attn_scalar', integer=False),
      attention_softcap=number(hf_config, 'attn_logit_softcapping', 0.0, above=False),
      final_logit_softcap=number(hf_config, 'final_logit_softcapping', 0.0, above=False))


def _norm(name: str, path: tables.Path, shape: tuple, order=None) -> tables.Row:
  """A Gemma RMSNorm's w as this library's scale 1 + w (its features in `order` for a QK-norm)."""
  forward, inverse = (slice(None), slice(None)) if order is None else (order, np.argsort(order))
  return tables.Row(name, (path,), tuple(shape), lambda array: ((1.0 + array)[forward],),
                    lambda arrays: arrays[0][inverse] - 1.0)


def table(config: transformer.ModelConfig) -> list:
  """Every tensor of the Gemma layout for config, as tables.Row."""
  width, hidden, head_dim = config.model_dim, config.feed_forward_dim, config.head_dim
  queries, keys = config.num_heads * head_dim, config.key_value_heads * head_dim
  order = tables.rotary_order(head_dim)
  rows = [tables.same(EMBEDDING, ('embedding', 'embedding', 'embedding'), (config.vocab_size, width)),
          _norm(FINAL_NORM, ('decoder', 'final_norm', 'scale'), (width,))]
  if not config.tie_embeddings:
    rows.append(tables.linear(OUTPUT, ('embedding', 'output', 'kernel'), (config.vocab_size, width)))
  for index in range(config.num_decoder_layers):
    prefix = f'model.layers.{index}'
    attention = lambda *rest, index=index: layer_path(index, 'self_attention', *rest)
    for ours, theirs, count in (('query', 'q', config.num_heads), ('key', 'k', config.key_value_heads)):
      rows.append(tables.rotary(f'{prefix}.self_attn.{theirs}_proj.weight', attention(ours, 'kernel'),
                                (count * head_dim, width), count, order))
      if config.qk_norm == 'head':
        rows.append(_norm(f'{prefix}.self_attn.{theirs}_norm.weight', attention(f'{ours}_norm', 'scale'),
                          (head_dim,), order))
    rows.append(tables.linear(f'{prefix}.self_attn.v_proj.weight', attention('value', 'kernel'), (keys, width)))
    rows.append(tables.linear(f'{prefix}.self_attn.o_proj.weight', attention('out', 'kernel'), (width, queries)))
    for ours, theirs, shape in (('gate', 'gate_proj', (hidden, width)), ('hidden', 'up_proj', (hidden, width)),
                                ('output', 'down_proj', (width, hidden))):
      rows.append(tables.linear(f'{prefix}.mlp.{theirs}.weight', layer_path(index, 'feed_forward', f'{ours}_kernel'),
                                shape))
    for residual, before, after in (('self_attention_residual', 'input_layernorm', 'post_attention_layernorm'),
                                    ('feed_forward_residual', 'pre_feedforward_layernorm',
                                     'post_feedforward_layernorm')):
      rows.append(_norm(f'{prefix}.{before}.weight', layer_path(index, residual, 'RMSNorm_0', 'scale'), (width,)))
      rows.append(_norm(f'{prefix}.{after}.weight', layer_path(index, residual, 'output_norm', 'scale'), (width,)))
  return rows


GEMMA3_FIXED = dict(qk_norm='head', attention_softcap=0.0, final_logit_softcap=0.0, attention_sinks=False,
                    attention_output_bias=False, qkv_bias=False, feed_forward_bias=False)


def exportable(config: transformer.ModelConfig) -> str:
  """'' when the run's model is Gemma 3's layout; else the first field that is not, with what would be valid."""
  for field, value in {**BLOCK, **GEMMA3_FIXED}.items():
    if getattr(config, field) != value:
      return f'model.{field}: got {getattr(config, field)!r}; valid: {value!r} (Gemma 3\'s block)'
  return rope_config.unexportable_layers(config, 'Gemma 3')


def hf_config(config: transformer.ModelConfig, context_length: int) -> dict:
  """config.json of Gemma3ForCausalLM (transformers 5's schema: layer_types, rope_parameters by layer type)."""
  kinds = {'full': 'full_attention', 'sliding': 'sliding_attention'}
  return dict(
      architectures=['Gemma3ForCausalLM'], model_type='gemma3_text', vocab_size=config.vocab_size,
      hidden_size=config.model_dim, intermediate_size=config.feed_forward_dim,
      num_hidden_layers=config.num_decoder_layers, num_attention_heads=config.num_heads,
      num_key_value_heads=config.key_value_heads, head_dim=config.head_dim, hidden_activation='gelu_pytorch_tanh',
      rms_norm_eps=config.layer_norm_eps, max_position_embeddings=context_length,
      sliding_window=config.sliding_window or None,
      layer_types=[kinds[config.layer_type(index)] for index in range(config.num_decoder_layers)],
      rope_parameters={'full_attention': rope_config.rope_parameters(config.position, context_length),
                       'sliding_attention': rope_config.rope_parameters(config.local_position or config.position,
                                                                        context_length)},
      query_pre_attn_scalar=_integral(config.query_scale or config.head_dim), tie_word_embeddings=config.tie_embeddings,
      attention_bias=False, attention_dropout=0.0, attn_logit_softcapping=None, final_logit_softcapping=None,
      use_bidirectional_attention=False, torch_dtype='float32')


def _integral(value: float):
  """transformers' Gemma config takes an int query_pre_attn_scalar where it is one."""
  return int(value) if float(value).is_integer() else value


def tensors(variables: dict, config: transformer.ModelConfig) -> dict:
  return tables.write_tensors(table(config), variables)


def params(read, names, config: transformer.ModelConfig, where: str = 'config.json') -> dict:
  """{'params': ...} of transformer.DecoderOnly(config) from the checkpoint's tensors, every one read or refused (a
  tied model's lm_head.weight accepted when it equals the embedding)."""
  tied_head = tables.tied_output(read, names, config, EMBEDDING, OUTPUT, where)
  return tables.read_params(table(config), read, names, where, lambda name: name == tied_head)
