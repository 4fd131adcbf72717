"""A run's decoder as a Hugging Face model folder, for the runs transformers has a class for: each architecture's
table (llama.py, gpt2.py, gpt_neox.py) read backwards. The RoPE decoder in the Llama-style block becomes
LlamaForCausalLM (with attention_bias for query, key, value and output biases, mlp_bias for the feed-forward's),
or Qwen2ForCausalLM with query, key and value biases alone; its extension becomes rope_scaling (pi -> linear,
llama3, yarn with its ramp over pair indices; rope_config.py); learned positions in GPT-2's block become
GPT2LMHeadModel, RoPE or p_rope's rescaled partial rotation in GPT-NeoX's block GPTNeoXForCausalLM, Gemma 3's
block (configs/hybrid.py:gemma3 in GeGLU) Gemma3ForCausalLM, RoPE with layers of none (position.layer_pattern of rope
and none: configs/hybrid.py:smollm3) SmolLM3ForCausalLM, and OLMo's block (model.norm='output', qk_norm='projection')
Olmo2ForCausalLM, or Olmo3ForCausalLM with sliding layers.
"""

import transformer
from experiments.pretrained import gemma, gpt2, gpt_neox, llama, olmo
from experiments.pretrained.tables import PretrainedError

EXPORTERS = {gpt2.ARCHITECTURE: gpt2, gpt_neox.ARCHITECTURE: gpt_neox, 'LlamaForCausalLM': llama,
             'Qwen2ForCausalLM': llama, 'SmolLM3ForCausalLM': llama, 'Gemma3ForCausalLM': gemma,
             **{name: olmo for name in olmo.ARCHITECTURES}}


def architecture(config: transformer.ModelConfig) -> str:
  """The Hugging Face class that holds the run's model; PretrainedError naming the first field the nearest block
  (Gemma 3's for a sandwich-norm model, OLMo's for norms on the sublayers' outputs, GPT-2's for learned positions,
  else the Llama-style block) would need otherwise."""
  for module in (gpt2, gpt_neox):
    if not module.exportable(config):
      return module.ARCHITECTURE
  if not gemma.exportable(config):
    return 'Gemma3ForCausalLM'
  if not olmo.exportable(config):
    return olmo.architecture_of(config)
  nearest = (gemma if config.sandwich_norm else olmo if config.norm == 'output' else
             gpt2 if config.position.kind == 'learned' else llama)
  refused = nearest.exportable(config)
  if refused:
    raise PretrainedError(refused.replace('; valid:', '; valid for a Hugging Face export:', 1) +
                          '; or learned positions in GPT-2\'s block, or RoPE in GPT-NeoX\'s, or Gemma 3\'s or '
                          'OLMo\'s block')
  return llama.architecture_of(config)


def hf_config(config: transformer.ModelConfig, context_length: int) -> dict:
  """config.json for the run's model, trained at context_length."""
  return EXPORTERS[architecture(config)].hf_config(config, context_length)


def hf_tensors(variables: dict, config: transformer.ModelConfig) -> dict:
  """{Hugging Face name: float32 NumPy array} of transformer.DecoderOnly(config)'s {'params': ...}."""
  return EXPORTERS[architecture(config)].tensors(variables, config)
