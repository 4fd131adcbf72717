"""A run's decoder as a Hugging Face model folder: the inverse of hugging_face.py, for the runs transformers has a
class for. The Llama-style block (pre-RMSNorm, SwiGLU, no biases, unscaled embeddings, RoPE) becomes
LlamaForCausalLM, with query, key and value biases Qwen2ForCausalLM; its context extension becomes rope_scaling
(pi -> linear, llama3, yarn with its ramp over pair indices); learned positions in GPT-2's block become
GPT2LMHeadModel (gpt2.py), and RoPE or p_rope's rescaled partial rotation in GPT-NeoX's block (LayerNorm, GELU,
biases, untied) GPTNeoXForCausalLM (gpt_neox.py). The query and key rows go back from this library's
rotary pairs (2i, 2i + 1) to Hugging Face's halves (i, i + d/2), the inverse of hugging_face.rotary_order.
"""

import numpy as np
from flax.core import meta

import transformer
from experiments.pretrained import gpt2, gpt_neox
from experiments.pretrained.hugging_face import PretrainedError, halves_per_head

ROPE_SCALING = {'none': None, 'pi': 'linear', 'dynamic_ntk_sequence': 'dynamic', 'llama3': 'llama3', 'yarn': 'yarn'}


def _refuse(field: str, value, valid: str):
  raise PretrainedError(f'{field}: got {value!r}; valid for a Hugging Face export: {valid}')


def architecture(config: transformer.ModelConfig) -> str:
  """LlamaForCausalLM, Qwen2ForCausalLM or GPT2LMHeadModel; PretrainedError naming the first field transformers
  cannot hold."""
  kind = config.position.kind
  if gpt2.exportable(config):
    return gpt2.ARCHITECTURE
  if gpt_neox.exportable(config):
    return gpt_neox.ARCHITECTURE
  if kind != 'rope':
    _refuse('model.position.kind', kind, 'rope in the Llama-style block (transformers\' Llama and Qwen2), or learned '
            f'in GPT-2\'s (pre-LayerNorm, GELU, biases); no class of theirs holds {kind} in this block')
  wanted = dict(architecture='transformer', norm='pre', norm_type='rmsnorm', activation='swiglu', use_bias=False,
                parallel_residual=False, scale_embeddings=False)
  for field, value in wanted.items():
    if getattr(config, field) != value:
      _refuse(f'model.{field}', getattr(config, field), f'{value!r} (the Llama-style block)')
  settings = config.position.settings
  if settings.rope_extension not in ROPE_SCALING:
    _refuse('model.position.rope_extension', settings.rope_extension,
            f'{", ".join(ROPE_SCALING)} (transformers\' dynamic is dynamic_ntk_sequence, one factor per sequence, and '
            'it has no static ntk or longrope by factor)')
  if settings.rope_extension == 'yarn' and settings.yarn_ramp == 'rotations':
    _refuse('model.position.yarn_ramp', 'rotations', 'dimensions or exact_dimensions (transformers\' yarn ramps over '
            'pair indices, not over rotations as the paper\'s gamma(r))')
  if settings.ssmax:
    _refuse('model.position.ssmax', True, 'False (transformers\' Llama does not scale the softmax by length)')
  return 'Qwen2ForCausalLM' if config.qkv_bias else 'LlamaForCausalLM'


def hf_config(config: transformer.ModelConfig, context_length: int) -> dict:
  """config.json for the run's model, trained at context_length."""
  name = architecture(config)
  if name == gpt2.ARCHITECTURE:
    return gpt2.hf_config(config)
  if name == gpt_neox.ARCHITECTURE:
    return gpt_neox.hf_config(config, context_length)
  settings = config.position.settings
  fields = dict(
      architectures=[name], model_type={'LlamaForCausalLM': 'llama', 'Qwen2ForCausalLM': 'qwen2'}[name],
      vocab_size=config.vocab_size, hidden_size=config.model_dim, intermediate_size=config.feed_forward_dim,
      num_hidden_layers=config.num_decoder_layers, num_attention_heads=config.num_heads,
      num_key_value_heads=config.key_value_heads, head_dim=config.head_dim, hidden_act='silu',
      rms_norm_eps=config.layer_norm_eps, rope_theta=settings.rope_base, max_position_embeddings=context_length,
      tie_word_embeddings=config.tie_embeddings, attention_bias=False, mlp_bias=False, attention_dropout=0.0,
      torch_dtype='float32')
  kind = ROPE_SCALING[settings.rope_extension]
  if kind == 'linear':
    fields['rope_scaling'] = dict(rope_type='linear', factor=settings.extension_factor)
  elif kind == 'dynamic':  # transformers' L is max_position_embeddings
    fields.update(rope_scaling=dict(rope_type='dynamic', factor=settings.extension_factor),
                  max_position_embeddings=settings.original_length)
  elif kind == 'llama3':
    fields['rope_scaling'] = dict(rope_type='llama3', factor=settings.extension_factor,
                                  original_max_position_embeddings=settings.original_length or context_length,
                                  low_freq_factor=settings.llama3_low_frequency_factor,
                                  high_freq_factor=settings.llama3_high_frequency_factor)
  elif kind == 'yarn':
    fields['rope_scaling'] = dict(rope_type='yarn', factor=settings.extension_factor,
                                  original_max_position_embeddings=settings.original_length,
                                  beta_fast=settings.yarn_beta, beta_slow=settings.yarn_alpha,
                                  truncate=settings.yarn_ramp == 'dimensions',
                                  **({'attention_factor': settings.yarn_attention_factor}
                                     if settings.yarn_attention_factor else {}))
  if name == 'Qwen2ForCausalLM':
    fields.update(use_sliding_window=False, sliding_window=None)
  return fields


def hf_tensors(params: dict, config: transformer.ModelConfig) -> dict:
  """{Hugging Face name: float32 NumPy array} of transformer.DecoderOnly(config)'s {'params': ...}."""
  name = architecture(config)
  if name == gpt2.ARCHITECTURE:
    return gpt2.tensors(params, config)
  if name == gpt_neox.ARCHITECTURE:
    return gpt_neox.tensors(params, config)
  tree = meta.unbox(params)['params']
  heads, kv_heads, head_dim = config.num_heads, config.key_value_heads, config.head_dim
  tensors = {'model.embed_tokens.weight': tree['embedding']['embedding']['embedding'],
             'model.norm.weight': tree['decoder']['final_norm']['scale']}
  if not config.tie_embeddings:
    tensors['lm_head.weight'] = np.asarray(tree['embedding']['output']['kernel']).T
  for index in range(config.num_decoder_layers):
    layer, prefix = tree['decoder'][f'layer_{index}'], f'model.layers.{index}'
    attention = layer['self_attention']
    for ours, theirs, count in (('query', 'q_proj', heads), ('key', 'k_proj', kv_heads), ('value', 'v_proj', kv_heads)):
      rotated = ours != 'value'
      weight = np.asarray(attention[ours]['kernel']).T
      tensors[f'{prefix}.self_attn.{theirs}.weight'] = halves_per_head(weight, count, head_dim) if rotated else weight
      if config.qkv_bias:
        bias = np.asarray(attention[ours]['bias'])
        tensors[f'{prefix}.self_attn.{theirs}.bias'] = halves_per_head(bias, count, head_dim) if rotated else bias
    tensors[f'{prefix}.self_attn.o_proj.weight'] = np.asarray(attention['out']['kernel']).T
    feed_forward = layer['feed_forward']
    for ours, theirs in (('gate_kernel', 'gate_proj'), ('hidden_kernel', 'up_proj'), ('output_kernel', 'down_proj')):
      tensors[f'{prefix}.mlp.{theirs}.weight'] = np.asarray(feed_forward[ours]).T
    tensors[f'{prefix}.input_layernorm.weight'] = layer['self_attention_residual']['RMSNorm_0']['scale']
    tensors[f'{prefix}.post_attention_layernorm.weight'] = layer['feed_forward_residual']['RMSNorm_0']['scale']
  return {name: np.ascontiguousarray(np.asarray(array, np.float32)) for name, array in tensors.items()}
