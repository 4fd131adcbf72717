"""The Cohere 2 layout (Cohere2ForCausalLM: Command R7B, Command A; Cohere 2025), read onto this library's fields:
the parallel block x + Attention(LN(x)) + FFN(LN(x)) with one LayerNorm, without an offset, for both branches
(model.parallel_residual, its two norms read from the one input_layernorm and their offsets zero), SwiGLU, RoPE in
the sliding layers only and no positions in the global ones (model.local_position rope, model.position none, as
Yang et al. 2025 describe Command A), output logits times logit_scale (model.logit_scale), tied embeddings.

Cohere rotates features 2i and 2i + 1 together (its rotary frequencies repeat-interleaved), as this library does:
the query and key rows are read as they are. Import only: a run here has two norms in its parallel block, which
one input_layernorm cannot hold.
"""

import numpy as np

import transformer
from experiments.pretrained import llama, rope_config, tables
from experiments.pretrained.tables import PretrainedError, flag, layer_path, number

ARCHITECTURES = ('Cohere2ForCausalLM',)
BLOCK = dict(architecture='transformer', norm='pre', norm_type='layernorm', activation='swiglu', use_bias=False,
             parallel_residual=True, scale_embeddings=False)


def _layer_types(hf_config: dict, layers: int) -> list:
  """transformers 5's layer_types, else sliding_window_pattern (every Nth layer global, 4 by default)."""
  listed = tables.listed_layer_types(hf_config, layers)
  if listed is not None:
    return listed
  pattern = number(hf_config, 'sliding_window_pattern', 4, integer=True)
  return tables.every_nth_global(layers, pattern)


def model_config(hf_config: dict, name: str) -> transformer.ModelConfig:
  """This library's config of a Cohere 2 checkpoint; PretrainedError naming the field it cannot serve."""
  del name
  if hf_config.get('hidden_act', 'silu') != 'silu':
    raise PretrainedError(f'config.json: hidden_act: got {hf_config["hidden_act"]!r}; valid: silu (SwiGLU)')
  if hf_config.get('attention_dropout'):
    raise PretrainedError(f'config.json: attention_dropout: got {hf_config["attention_dropout"]!r}; valid: 0')
  layers = number(hf_config, 'num_hidden_layers', integer=True)
  kinds = _layer_types(hf_config, layers)
  heads, width = number(hf_config, 'num_attention_heads', integer=True), number(hf_config, 'hidden_size', integer=True)
  head_dim = number(hf_config, 'head_dim', width // heads, integer=True)
  if head_dim * heads != width:
    raise PretrainedError(f'config.json: head_dim: got {head_dim}; valid: hidden_size / num_attention_heads = '
                          f'{width // heads} (Cohere 2 derives it so)')
  bias = flag(hf_config, 'attention_bias', False)
  sliding = 'sliding' in kinds
  rope, none = rope_config.rope_position(hf_config), tables.position_config('none')
  # RoPE where a layer slides: every layer when all do, else the local layers' own position.
  position, local_position = (rope, None) if set(kinds) == {'sliding'} else (none, rope if sliding else None)
  return tables.model_config(
      **BLOCK, vocab_size=number(hf_config, 'vocab_size', integer=True), model_dim=width, num_heads=heads,
      num_kv_heads=number(hf_config, 'num_key_value_heads', heads, integer=True),
      feed_forward_dim=number(hf_config, 'intermediate_size', integer=True), num_encoder_layers=0,
      num_decoder_layers=layers, dropout_rate=0.0, layer_norm_eps=number(hf_config, 'layer_norm_eps', 1e-5),
      layer_types=tables.layer_cycle(kinds), sliding_window=number(hf_config, 'sliding_window', integer=True)
      if sliding else 0, qkv_bias=bias, attention_output_bias=bias,
      tie_embeddings=flag(hf_config, 'tie_word_embeddings', True),
      logit_scale=number(hf_config, 'logit_scale', 0.0625),
      position=position, local_position=local_position)


def _layer_norm(name: str, paths: tuple, width: int) -> tables.Row:
  """Cohere's LayerNorm (a scale, no offset) as the scale of each norm under paths and offsets of zeros."""
  zeros = np.zeros(width, np.float32)
  return tables.Row(name, tuple(path for base in paths for path in ((*base, 'scale'), (*base, 'bias'))), (width,),
                    lambda array: sum(((array, zeros) for _ in paths), ()), lambda arrays: arrays[0])


def table(config: transformer.ModelConfig) -> list:
  """Every tensor of the Cohere 2 layout for config, as tables.Row."""
  identity = np.arange(config.head_dim)
  rows = llama.ends(config, lambda name, path, shape: _layer_norm(name, (path[:-1],), shape[0]))
  for index in range(config.num_decoder_layers):
    rows += llama.attention_rows(config, index, identity) + llama.feed_forward_rows(config, index)
    rows.append(_layer_norm(f'model.layers.{index}.input_layernorm.weight',
                            tuple(layer_path(index, residual, 'LayerNorm_0')
                                  for residual in ('self_attention_residual', 'feed_forward_residual')),
                            config.model_dim))
  return rows


def params(read, names, config: transformer.ModelConfig, where: str = 'config.json') -> dict:
  """{'params': ...} of transformer.DecoderOnly(config), every tensor read or refused (a tied model's
  lm_head.weight accepted when it equals the embedding)."""
  tied_head = tables.tied_output(read, names, config, llama.EMBEDDING, llama.OUTPUT, where)
  return tables.read_params(table(config), read, names, where, lambda name: llama.buffers(name) or name == tied_head)
