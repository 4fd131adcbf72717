"""The OLMo 2 and OLMo 3 layout (Olmo2ForCausalLM, Olmo3ForCausalLM; Team OLMo 2024, 2025) both ways: the Llama
block with its norms moved to the sublayers' outputs, x + RMSNorm(F(x)) (model.norm='output'; their
post_attention_layernorm and post_feedforward_layernorm), queries and keys RMS-normalised over the whole projection
before the rotation (model.qk_norm='projection'), and OLMo 3's sliding layers (layer_types, three sliding layers to
one full where it is absent, as transformers fills it in; RoPE by layer type in
rope_parameters: the full layers' as model.position, the sliding layers' as model.local_position where they
differ). The projections and the feed-forward are Llama's rows (llama.py), rotate_half's halves permuted per head.
"""

import transformer
from experiments.pretrained import llama, rope_config, tables
from experiments.pretrained.tables import PretrainedError, flag, number

ARCHITECTURES = ('Olmo2ForCausalLM', 'Olmo3ForCausalLM')
MODEL_TYPES = {'Olmo2ForCausalLM': 'olmo2', 'Olmo3ForCausalLM': 'olmo3'}
BLOCK = dict(architecture='transformer', norm='output', norm_type='rmsnorm', activation='swiglu', use_bias=False,
             parallel_residual=False, scale_embeddings=False, qk_norm='projection')
NORMS = ('post_attention_layernorm', 'post_feedforward_layernorm')
FIXED = dict(sandwich_norm=False, attention_sinks=False, attention_softcap=0.0, final_logit_softcap=0.0,
             query_scale=0.0, logit_scale=1.0, head_width=0, feed_forward_bias=False)


def _positions(hf_config: dict, kinds: list) -> tuple:
  """(model.position, model.local_position): RoPE by layer type where rope_parameters is keyed so (OLMo 3), the
  local one None where it is the global one's."""
  keyed = rope_config.positions_by_layer_type(hf_config, tables.HF_LAYER_TYPES)
  if keyed is None:
    return rope_config.rope_position(hf_config), None
  position, local_position = keyed
  return position, local_position if 'sliding' in kinds and local_position != position else None


def model_config(hf_config: dict, name: str) -> transformer.ModelConfig:
  """This library's config of an OLMo 2 or 3 checkpoint; PretrainedError naming the field it cannot serve."""
  if hf_config.get('hidden_act', 'silu') != 'silu':
    raise PretrainedError(f'config.json: hidden_act: got {hf_config["hidden_act"]!r}; valid: silu (SwiGLU)')
  if hf_config.get('attention_dropout'):
    raise PretrainedError(f'config.json: attention_dropout: got {hf_config["attention_dropout"]!r}; valid: 0')
  layers = number(hf_config, 'num_hidden_layers', integer=True)
  kinds = tables.listed_layer_types(hf_config, layers) or (
      ['full'] * layers if name == 'Olmo2ForCausalLM' else tables.every_nth_global(layers, 4))
  if name == 'Olmo2ForCausalLM' and 'sliding' in kinds:
    raise PretrainedError('config.json: layer_types: sliding layers in an Olmo2ForCausalLM; valid: full_attention '
                          'only (OLMo 3 has windows)')
  position, local_position = _positions(hf_config, kinds)
  heads = number(hf_config, 'num_attention_heads', integer=True)
  bias = flag(hf_config, 'attention_bias', False)
  return tables.model_config(
      **BLOCK, vocab_size=number(hf_config, 'vocab_size', integer=True),
      model_dim=number(hf_config, 'hidden_size', integer=True), num_heads=heads,
      num_kv_heads=number(hf_config, 'num_key_value_heads', heads, integer=True),
      feed_forward_dim=number(hf_config, 'intermediate_size', integer=True), num_encoder_layers=0,
      num_decoder_layers=layers, dropout_rate=0.0, layer_norm_eps=number(hf_config, 'rms_norm_eps'),
      layer_types=tables.layer_cycle(kinds),
      sliding_window=number(hf_config, 'sliding_window', integer=True) if 'sliding' in kinds else 0,
      qkv_bias=bias, attention_output_bias=bias, tie_embeddings=flag(hf_config, 'tie_word_embeddings', False),
      position=position, local_position=local_position)


def table(config: transformer.ModelConfig) -> list:
  """Every tensor of the OLMo 2/3 layout for config, as tables.Row."""
  order = tables.rotary_order(config.head_dim)
  rows = llama.ends(config)
  for index in range(config.num_decoder_layers):
    rows += llama.attention_rows(config, index, order) + llama.feed_forward_rows(config, index)
    rows += llama.norm_rows(config, index, NORMS)
  return rows


def params(read, names, config: transformer.ModelConfig, where: str = 'config.json') -> dict:
  """{'params': ...} of transformer.DecoderOnly(config), every tensor read or refused (a tied model's
  lm_head.weight accepted when it equals the embedding)."""
  tied_head = tables.tied_output(read, names, config, llama.EMBEDDING, llama.OUTPUT, where)
  return tables.read_params(table(config), read, names, where, lambda name: llama.buffers(name) or name == tied_head)


def exportable(config: transformer.ModelConfig) -> str:
  """'' when the run's model is OLMo 2's or 3's layout; else the first field that is not, with what would be
  valid."""
  for field, value in {**BLOCK, **FIXED}.items():
    if getattr(config, field) != value:
      return f'model.{field}: got {getattr(config, field)!r}; valid: {value!r} (OLMo\'s block)'
  if config.qkv_bias != config.attention_output_bias:
    return (f'model.qkv_bias: got {config.qkv_bias} with attention_output_bias {config.attention_output_bias}; '
            'valid: both or neither (OLMo\'s attention_bias)')
  return rope_config.unexportable_layers(config, 'OLMo 3')


def architecture_of(config: transformer.ModelConfig) -> str:
  """OLMo 3 where the run has windows or two RoPEs, else OLMo 2."""
  plain = config.layer_type_cycle == ('full',) and config.local_position is None
  return 'Olmo2ForCausalLM' if plain else 'Olmo3ForCausalLM'


def hf_config(config: transformer.ModelConfig, context_length: int) -> dict:
  """config.json of Olmo2ForCausalLM, or Olmo3ForCausalLM (layer_types, rope_parameters by layer type)."""
  name = architecture_of(config)
  fields = dict(
      architectures=[name], model_type=MODEL_TYPES[name], vocab_size=config.vocab_size, hidden_size=config.model_dim,
      intermediate_size=config.feed_forward_dim, num_hidden_layers=config.num_decoder_layers,
      num_attention_heads=config.num_heads, num_key_value_heads=config.key_value_heads, hidden_act='silu',
      rms_norm_eps=config.layer_norm_eps, max_position_embeddings=context_length,
      tie_word_embeddings=config.tie_embeddings, attention_bias=config.qkv_bias, attention_dropout=0.0,
      torch_dtype='float32')
  if name == 'Olmo2ForCausalLM':
    return {**fields, **rope_config.rope_fields(config.position, context_length)}
  kinds = {'full': 'full_attention', 'sliding': 'sliding_attention'}
  return {**fields, 'sliding_window': config.sliding_window or None,
          'layer_types': [kinds[config.layer_type(index)] for index in range(config.num_decoder_layers)],
          'rope_parameters': {'full_attention': rope_config.rope_parameters(config.position, context_length),
                              'sliding_attention': rope_config.rope_parameters(config.local_position or config.position,
                                                                               context_length)}}


def tensors(variables: dict, config: transformer.ModelConfig) -> dict:
  return tables.write_tensors(table(config), variables)
