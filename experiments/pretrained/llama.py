"""The Llama layout (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM; Touvron et al. 2023)
both ways: pre-RMSNorm, SwiGLU, grouped-query attention, RoPE (its rope_scaling as a context extension:
rope_config.py), tied or untied embeddings; Llama's attention_bias (query, key, value and output biases) and mlp_bias
(the feed-forward's three), Qwen2's query, key and value biases, Qwen3's per-head QK-norm and head width, SmolLM3's
layers without RoPE (no_rope_layers, as position.layer_pattern over the layers; SmolLM3ForCausalLM); Mistral's
and Qwen2's sliding window as sliding layers (transformers 5's layer_types, or Mistral's sliding_window shorter than
its context: every layer; Qwen2's use_sliding_window: the layers from max_window_layers on). The table (`table`) is read by the import and written by the export;
the query and key rows are permuted per head between rotate_half's halves and this library's pairs (tables.rotary).
"""

from typing import Callable

import numpy as np

import transformer
from experiments.pretrained import rope_config, tables
from experiments.pretrained.tables import PretrainedError, flag, layer_path, number

ARCHITECTURES = ('LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM',
                 'SmolLM3ForCausalLM')
MODEL_TYPES = {'LlamaForCausalLM': 'llama', 'MistralForCausalLM': 'mistral', 'Qwen2ForCausalLM': 'qwen2',
               'Qwen3ForCausalLM': 'qwen3', 'SmolLM3ForCausalLM': 'smollm3'}
# The block, as this library's ModelConfig fields: what an import sets and what an export requires.
BLOCK = dict(architecture='transformer', norm='pre', norm_type='rmsnorm', activation='swiglu', use_bias=False,
             parallel_residual=False, scale_embeddings=False)
# What the export writes no field for (the import reads Qwen3's QK-norm and Mistral's window; their export is not
# written yet): a run with any other value is refused.
PLAIN_ATTENTION = tables.PLAIN_ATTENTION
EMBEDDING, FINAL_NORM, OUTPUT = 'model.embed_tokens.weight', 'model.norm.weight', 'lm_head.weight'


def model_config(hf_config: dict, name: str) -> transformer.ModelConfig:
  """This library's config of a Llama-layout checkpoint; PretrainedError naming the field it cannot serve."""
  heads = number(hf_config, 'num_attention_heads', integer=True)
  width = number(hf_config, 'hidden_size', integer=True)
  head_dim = number(hf_config, 'head_dim', width // heads, integer=True)
  if hf_config.get('hidden_act', 'silu') != 'silu':
    raise PretrainedError(f'config.json: hidden_act: got {hf_config["hidden_act"]!r}; valid: silu (SwiGLU)')
  if hf_config.get('attention_dropout'):
    raise PretrainedError(f'config.json: attention_dropout: got {hf_config["attention_dropout"]!r}; valid: 0')
  layers = number(hf_config, 'num_hidden_layers', integer=True)
  rotates = _rotary_layers(hf_config, layers) if name == 'SmolLM3ForCausalLM' else [True] * layers
  kinds = _layer_types(hf_config, name, layers, rotates)
  attention_bias = name != 'Qwen2ForCausalLM' and flag(hf_config, 'attention_bias', False)
  return tables.model_config(
      **BLOCK, vocab_size=number(hf_config, 'vocab_size', integer=True), model_dim=width, num_heads=heads,
      num_kv_heads=number(hf_config, 'num_key_value_heads', heads, integer=True),
      feed_forward_dim=number(hf_config, 'intermediate_size', integer=True), num_encoder_layers=0,
      num_decoder_layers=layers, dropout_rate=0.0, head_width=head_dim if head_dim * heads != width else 0,
      layer_types=tables.layer_cycle(kinds), sliding_window=number(hf_config, 'sliding_window', integer=True)
      if 'sliding' in kinds else 0, qk_norm='head' if name == 'Qwen3ForCausalLM' else 'none',
      layer_norm_eps=number(hf_config, 'rms_norm_eps'), qkv_bias=name == 'Qwen2ForCausalLM' or attention_bias,
      attention_output_bias=attention_bias, feed_forward_bias=flag(hf_config, 'mlp_bias', False),
      tie_embeddings=flag(hf_config, 'tie_word_embeddings', name == 'SmolLM3ForCausalLM'),
      position=_position(hf_config, rotates))


def _rotary_layers(hf_config: dict, layers: int) -> list:
  """SmolLM3's no_rope_layers (1: the layer rotates, 0: no positions), or every no_rope_layer_interval-th layer
  without, as transformers fills it in."""
  given = hf_config.get('no_rope_layers')
  if given is None:
    interval = number(hf_config, 'no_rope_layer_interval', 4, integer=True)
    return [(index + 1) % interval != 0 for index in range(layers)]
  if not isinstance(given, list) or len(given) != layers or any(value not in (0, 1) or isinstance(value, bool)
                                                                for value in given):
    raise PretrainedError(f'config.json: no_rope_layers: got {given!r}; valid: {layers} entries (num_hidden_layers), '
                          'each 1 (RoPE) or 0 (none)')
  return [value == 1 for value in given]


def _position(hf_config: dict, rotates: list) -> transformer.PositionConfig:
  """RoPE in every layer; where some layers have none (SmolLM3), position.layer_pattern over the layers."""
  if all(rotates):
    return rope_config.rope_position(hf_config)
  pattern = tables.layer_cycle(['rope' if rotating else 'none' for rotating in rotates])
  return rope_config.rope_position(hf_config, 'layer_pattern', layer_pattern=pattern)


def _layer_types(hf_config: dict, name: str, layers: int, rotates: list) -> list:
  """Each layer's kind: transformers 5's layer_types; else a window where use_sliding_window (default true but for
  Qwen2 and SmolLM3) and a sliding_window shorter than the context say so: every layer of a Mistral, Qwen2's from
  max_window_layers on, SmolLM3's layers without RoPE."""
  listed = tables.listed_layer_types(hf_config, layers)
  if listed is not None:
    return listed
  window, longest = hf_config.get('sliding_window'), number(hf_config, 'max_position_embeddings', 0, integer=True)
  opted_out = name in ('Qwen2ForCausalLM', 'SmolLM3ForCausalLM')
  if not window or not flag(hf_config, 'use_sliding_window', not opted_out) or window >= longest:
    return ['full'] * layers
  if name == 'SmolLM3ForCausalLM':
    return ['full' if rotating else 'sliding' for rotating in rotates]
  first = number(hf_config, 'max_window_layers', 0, integer=True, above=False) if name == 'Qwen2ForCausalLM' else 0
  return ['full' if index < first else 'sliding' for index in range(layers)]


def ends(config: transformer.ModelConfig, final_norm: Callable = tables.same) -> list:
  """The embedding, the final norm (read by final_norm(name, path, shape)) and an untied output's rows."""
  rows = [tables.same(EMBEDDING, ('embedding', 'embedding', 'embedding'), (config.vocab_size, config.model_dim)),
          final_norm(FINAL_NORM, ('decoder', 'final_norm', 'scale'), (config.model_dim,))]
  if not config.tie_embeddings:
    rows.append(tables.linear(OUTPUT, ('embedding', 'output', 'kernel'), (config.vocab_size, config.model_dim)))
  return rows


def attention_rows(config: transformer.ModelConfig, index: int, order: np.ndarray) -> list:
  """Layer index's self_attn tensors: the query and key rows (and biases, and QK-norm scales, by head or over the
  whole projection) with each head's features in `order` (tables.rotary_order for rotate_half's halves), value and
  output projections and their biases."""
  head_dim, prefix = config.head_dim, f'model.layers.{index}.self_attn'
  attention = lambda *rest: layer_path(index, 'self_attention', *rest)
  rows = []
  for ours, theirs, count in (('query', 'q', config.num_heads), ('key', 'k', config.key_value_heads)):
    rows.append(tables.rotary(f'{prefix}.{theirs}_proj.weight', attention(ours, 'kernel'),
                              (count * head_dim, config.model_dim), count, order))
    if config.qkv_bias:
      rows.append(tables.rotary(f'{prefix}.{theirs}_proj.bias', attention(ours, 'bias'), (count * head_dim,), count,
                                order))
    if config.qk_norm != 'none':  # a scale over each head's features (shared by the heads) or over all of them
      heads = 1 if config.qk_norm == 'head' else count
      rows.append(tables.rotary(f'{prefix}.{theirs}_norm.weight', attention(f'{ours}_norm', 'scale'),
                                (heads * head_dim,), heads, order))
  keys = config.key_value_heads * head_dim
  rows.append(tables.linear(f'{prefix}.v_proj.weight', attention('value', 'kernel'), (keys, config.model_dim)))
  if config.qkv_bias:
    rows.append(tables.same(f'{prefix}.v_proj.bias', attention('value', 'bias'), (keys,)))
  rows.append(tables.linear(f'{prefix}.o_proj.weight', attention('out', 'kernel'),
                            (config.model_dim, config.num_heads * head_dim)))
  if config.attention_output_bias:
    rows.append(tables.same(f'{prefix}.o_proj.bias', attention('out', 'bias'), (config.model_dim,)))
  return rows


def feed_forward_rows(config: transformer.ModelConfig, index: int) -> list:
  """Layer index's mlp tensors: SwiGLU's gate, up and down projections, and their biases under mlp_bias."""
  width, hidden = config.model_dim, config.feed_forward_dim
  rows = []
  for ours, theirs, shape in (('gate', 'gate_proj', (hidden, width)), ('hidden', 'up_proj', (hidden, width)),
                              ('output', 'down_proj', (width, hidden))):
    rows.append(tables.linear(f'model.layers.{index}.mlp.{theirs}.weight',
                              layer_path(index, 'feed_forward', f'{ours}_kernel'), shape))
    if config.feed_forward_bias:
      rows.append(tables.same(f'model.layers.{index}.mlp.{theirs}.bias',
                              layer_path(index, 'feed_forward', f'{ours}_bias'), shape[:1]))
  return rows


def norm_rows(config: transformer.ModelConfig, index: int, names: tuple) -> list:
  """Layer index's two RMSNorm scales, named names[0] (the attention's) and names[1] (the feed-forward's)."""
  return [tables.same(f'model.layers.{index}.{theirs}.weight', layer_path(index, ours, 'RMSNorm_0', 'scale'),
                      (config.model_dim,))
          for ours, theirs in zip(('self_attention_residual', 'feed_forward_residual'), names)]


def table(config: transformer.ModelConfig) -> list:
  """Every tensor of the Llama layout for config, as tables.Row."""
  order = tables.rotary_order(config.head_dim)
  rows = ends(config)
  for index in range(config.num_decoder_layers):
    rows += attention_rows(config, index, order) + feed_forward_rows(config, index)
    rows += norm_rows(config, index, ('input_layernorm', 'post_attention_layernorm'))
  return rows


def buffers(name: str) -> bool:
  """The rotary frequencies older checkpoints store (recomputed from the config, as transformers does)."""
  return name.endswith('.self_attn.rotary_emb.inv_freq')


def params(read, names, config: transformer.ModelConfig, where: str = 'config.json') -> dict:
  """{'params': ...} of transformer.DecoderOnly(config) from the checkpoint's tensors (read(name); names: all of
  them), every one read or refused (tables.read_params); a tied model's lm_head.weight is accepted when it equals
  the embedding, and refused otherwise."""
  tied_head = tables.tied_output(read, names, config, EMBEDDING, OUTPUT, where)
  return tables.read_params(table(config), read, names, where, lambda name: buffers(name) or name == tied_head)


def _rotary_kinds(position: transformer.PositionConfig) -> tuple:
  """The kinds of the run's position, layer by layer over a cycle: ('rope',) or a pattern's."""
  return position.settings.kinds() if position.kind == 'layer_pattern' else (position.kind,)


def exportable(config: transformer.ModelConfig) -> str:
  """'' when the run's model is the Llama layout (SmolLM3's where some layers have no RoPE); else the first field
  that is not, with what would be valid."""
  kinds = _rotary_kinds(config.position)
  if set(kinds) - {'rope', 'none'} or 'rope' not in kinds:
    return (f'model.position.kind: got {config.position.kind!r}; valid: rope, or a layer_pattern of rope and none '
            f'(transformers\' Llama, Qwen2 and SmolLM3 hold no {config.position.kind} in this block)')
  for field, value in {**BLOCK, **PLAIN_ATTENTION}.items():
    if getattr(config, field) != value:
      return f'model.{field}: got {getattr(config, field)!r}; valid: {value!r} (the Llama-style block)'
  refused = rope_config.unexportable(config.position)
  if refused:
    return refused
  if config.attention_output_bias and not config.qkv_bias:
    return ('model.attention_output_bias: got True without qkv_bias; valid: both (Llama\'s attention_bias) or qkv_bias '
            'alone (Qwen2)')
  if config.qkv_bias and not config.attention_output_bias and (config.feed_forward_bias or len(kinds) > 1):
    return ('model.qkv_bias: got True without attention_output_bias, with a feed-forward bias or layers without RoPE; '
            'valid: False, or Qwen2\'s block (neither mlp_bias nor NoPE layers)')
  return ''


def architecture_of(config: transformer.ModelConfig) -> str:
  if config.position.kind == 'layer_pattern':
    return 'SmolLM3ForCausalLM'
  return 'Qwen2ForCausalLM' if config.qkv_bias and not config.attention_output_bias else 'LlamaForCausalLM'


def hf_config(config: transformer.ModelConfig, context_length: int) -> dict:
  """config.json for the run's model (its RoPE settings from rope_config.rope_scaling; SmolLM3's no_rope_layers
  from the pattern)."""
  name = architecture_of(config)
  fields = dict(
      architectures=[name], model_type=MODEL_TYPES[name], vocab_size=config.vocab_size, hidden_size=config.model_dim,
      intermediate_size=config.feed_forward_dim, num_hidden_layers=config.num_decoder_layers,
      num_attention_heads=config.num_heads, num_key_value_heads=config.key_value_heads, head_dim=config.head_dim,
      hidden_act='silu', rms_norm_eps=config.layer_norm_eps, max_position_embeddings=context_length,
      tie_word_embeddings=config.tie_embeddings, attention_bias=config.attention_output_bias,
      mlp_bias=config.feed_forward_bias, attention_dropout=0.0, torch_dtype='float32')
  fields.update(rope_config.rope_fields(config.position, context_length))
  if name == 'Qwen2ForCausalLM':
    fields.update(use_sliding_window=False, sliding_window=None)
    del fields['attention_bias'], fields['mlp_bias']
  if name == 'SmolLM3ForCausalLM':
    kinds = _rotary_kinds(config.position)
    fields.update(no_rope_layers=[int(kinds[index % len(kinds)] == 'rope') for index in range(config.num_decoder_layers)],
                  use_sliding_window=False, sliding_window=None, pad_token_id=None, bos_token_id=None,
                  eos_token_id=None)
  return fields


def tensors(variables: dict, config: transformer.ModelConfig) -> dict:
  return tables.write_tensors(table(config), variables)
