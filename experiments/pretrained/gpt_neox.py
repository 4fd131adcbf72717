"""GPT-NeoX (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B; Black et al. 2022) both ways: pre-LayerNorm with biases, exact
GELU, the parallel residual x + Attention(LN1(x)) + FFN(LN2(x)) (use_parallel_residual), and partial rotation
(rotary_pct): the first r = rotary_pct x d features of each head are a RoPE of width r (p_rope's 'rescaled'
frequencies), the rest unrotated. Its fused query_key_value holds each head's query, key and value rows together
(head after head: one row of the table, six parameters); its rotated features pair i with i + r/2 (rotate_half), so
the first r rows of each head's query and key are permuted into this library's pairs (2i, 2i + 1).
"""

import numpy as np

import transformer
from experiments.pretrained import rope_config, tables
from experiments.pretrained.tables import PretrainedError, flag, layer_path, number

ARCHITECTURE = 'GPTNeoXForCausalLM'
ACTIVATIONS = {'gelu': 'gelu_exact', 'gelu_new': 'gelu', 'gelu_pytorch_tanh': 'gelu'}
BLOCK = dict(architecture='transformer', norm='pre', norm_type='layernorm', use_bias=True, scale_embeddings=False)
EMBEDDING, OUTPUT = 'gpt_neox.embed_in.weight', 'embed_out.weight'


def rotated_fraction(hf_config: dict) -> float:
  parameters = hf_config.get('rope_parameters') if isinstance(hf_config.get('rope_parameters'), dict) else {}
  fraction = tables.first_of({**hf_config, **parameters}, ('partial_rotary_factor', 'rotary_pct'), 1.0)
  return number({'rotary_pct': fraction}, 'rotary_pct')


def model_config(hf_config: dict, name: str = ARCHITECTURE) -> transformer.ModelConfig:
  del name
  width, heads = number(hf_config, 'hidden_size', integer=True), number(hf_config, 'num_attention_heads', integer=True)
  head_dim = width // heads
  activation = hf_config.get('hidden_act', 'gelu')
  if activation not in ACTIVATIONS:
    raise PretrainedError(f'config.json: hidden_act: got {activation!r}; valid: {", ".join(ACTIVATIONS)}')
  if not flag(hf_config, 'attention_bias', True):
    raise PretrainedError('config.json: attention_bias: got false; valid: true (GPT-NeoX\'s projections have biases)')
  fraction = rotated_fraction(hf_config)
  rotated = int(head_dim * fraction)
  if fraction > 1 or rotated < 2 or rotated % 2:
    raise PretrainedError(f'config.json: rotary_pct: got {fraction}, which rotates {rotated} of {head_dim} features; '
                          'valid: a fraction in (0, 1] that rotates an even number of at least 2')
  base = hf_config.get('rotary_emb_base') or (hf_config.get('rope_parameters') or {}).get('rope_theta')
  rope = {**hf_config, 'rope_theta': base if base is not None else hf_config.get('rope_theta', 10000.0)}
  if isinstance(rope.get('rope_parameters'), dict):
    rope['rope_parameters'] = {key: value for key, value in rope['rope_parameters'].items()
                               if key not in ('partial_rotary_factor', 'rope_theta')}
  position = (rope_config.rope_position(rope) if rotated == head_dim else
              rope_config.rope_position(rope, 'p_rope', rotary_fraction=rotated / head_dim,
                                        rotary_frequencies='rescaled'))
  return tables.model_config(
      **BLOCK, vocab_size=number(hf_config, 'vocab_size', integer=True), model_dim=width, num_heads=heads,
      num_kv_heads=0,
      feed_forward_dim=number(hf_config, 'intermediate_size', integer=True), num_encoder_layers=0,
      num_decoder_layers=number(hf_config, 'num_hidden_layers', integer=True), dropout_rate=0.0,
      activation=ACTIVATIONS[activation], layer_norm_eps=number(hf_config, 'layer_norm_eps', 1e-5),
      parallel_residual=flag(hf_config, 'use_parallel_residual', True),
      tie_embeddings=flag(hf_config, 'tie_word_embeddings', False), position=position)


def _rotated(config: transformer.ModelConfig) -> int:
  settings = config.position.settings
  return config.head_dim if config.position.kind == 'rope' else 2 * int(settings.rotary_fraction * config.head_dim / 2
                                                                         + 1e-9)


def feature_order(config: transformer.ModelConfig) -> np.ndarray:
  """One head's features in this library's order: the rotated r as pairs (i, i + r/2), then the rest."""
  rotated = _rotated(config)
  return np.concatenate([tables.rotary_order(rotated), np.arange(rotated, config.head_dim)])


def _fused(name: str, index: int, config: transformer.ModelConfig, bias: bool) -> tables.Row:
  """query_key_value's weight (3D x D, rows head by head: its query, key and value rows) or bias (3D)."""
  heads, head_dim, width = config.num_heads, config.head_dim, config.model_dim
  order, inverse = feature_order(config), np.argsort(feature_order(config))
  paths = tuple(layer_path(index, 'self_attention', part, leaf) for leaf in ('kernel', 'bias')
                for part in ('query', 'key', 'value'))
  shape = (3 * width,) if bias else (3 * width, width)

  def to_ours(array):
    parts, found = array.reshape(heads, 3, head_dim, *array.shape[1:]), []
    for part in range(3):
      rows = (parts[:, part][:, order] if part < 2 else parts[:, part]).reshape(width, *array.shape[1:])
      found.append(rows if bias else rows.T)
    return tuple(found)

  def to_theirs(arrays):
    parts = [np.asarray(a).reshape(heads, head_dim) if bias else np.asarray(a).T.reshape(heads, head_dim, width)
             for a in arrays]
    parts = [p[:, inverse] if part < 2 else p for part, p in enumerate(parts)]
    return np.stack(parts, axis=1).reshape(shape)
  return tables.Row(name, paths[3:] if bias else paths[:3], shape, to_ours, to_theirs)


def table(config: transformer.ModelConfig) -> list:
  width, hidden, vocabulary = config.model_dim, config.feed_forward_dim, config.vocab_size

  def norm(name, *path):
    return tables.layer_norm(name, path, width)
  rows = [tables.same(EMBEDDING, ('embedding', 'embedding', 'embedding'), (vocabulary, width)),
          *norm('gpt_neox.final_layer_norm', 'decoder', 'final_norm')]
  if not config.tie_embeddings:
    rows.append(tables.output_without_bias(OUTPUT, (vocabulary, width)))
  for index in range(config.num_decoder_layers):
    prefix = f'gpt_neox.layers.{index}'
    rows += [_fused(f'{prefix}.attention.query_key_value.weight', index, config, bias=False),
             _fused(f'{prefix}.attention.query_key_value.bias', index, config, bias=True),
             tables.linear(f'{prefix}.attention.dense.weight', layer_path(index, 'self_attention', 'out', 'kernel'),
                           (width, width)),
             tables.same(f'{prefix}.attention.dense.bias', layer_path(index, 'self_attention', 'out', 'bias'),
                         (width,))]
    for theirs, ours, shape in (('dense_h_to_4h', 'hidden', (hidden, width)),
                                ('dense_4h_to_h', 'output', (width, hidden))):
      rows += [tables.linear(f'{prefix}.mlp.{theirs}.weight', layer_path(index, 'feed_forward', f'{ours}_kernel'),
                             shape),
               tables.same(f'{prefix}.mlp.{theirs}.bias', layer_path(index, 'feed_forward', f'{ours}_bias'), shape[:1])]
    rows += norm(f'{prefix}.input_layernorm', *layer_path(index, 'self_attention_residual', 'LayerNorm_0'))
    rows += norm(f'{prefix}.post_attention_layernorm', *layer_path(index, 'feed_forward_residual', 'LayerNorm_0'))
  return rows


def buffers(name: str) -> bool:
  """What older checkpoints store beside the weights: the causal mask and the rotary frequencies (buffers that
  transformers recomputes from the config)."""
  return name.endswith(('.attention.bias', '.attention.masked_bias', '.rotary_emb.inv_freq'))


def params(read, names, config: transformer.ModelConfig, where: str = 'config.json') -> dict:
  tied_head = tables.tied_output(read, names, config, EMBEDDING, OUTPUT, where)
  return tables.read_params(table(config), read, names, where, lambda name: buffers(name) or name == tied_head)


def exportable(config: transformer.ModelConfig) -> str:
  """'' when the run's model is GPT-NeoX's block: pre-LayerNorm, GELU (either form), biases, multi-head, untied,
  RoPE or p_rope's rescaled partial rotation without an extension."""
  position = config.position
  if not (position.kind == 'rope' or (position.kind == 'p_rope'
                                      and position.settings.rotary_frequencies == 'rescaled')):
    return f'model.position.kind: got {position.kind!r}; valid: rope, or p_rope with rescaled frequencies'
  if position.settings.rope_extension != 'none' or position.settings.ssmax:
    return 'model.position.rope_extension: valid for GPT-NeoX: none, without ssmax'
  for field, value in {**BLOCK, **tables.PLAIN_ATTENTION, 'head_width': 0}.items():
    if getattr(config, field) != value:
      return f'model.{field}: got {getattr(config, field)!r}; valid: {value!r} (GPT-NeoX\'s block)'
  if config.activation not in ('gelu', 'gelu_exact'):
    return f'model.activation: got {config.activation!r}; valid: gelu or gelu_exact (GPT-NeoX\'s block)'
  if config.key_value_heads != config.num_heads or config.tie_embeddings:
    return 'model.num_kv_heads, model.tie_embeddings: valid for GPT-NeoX: multi-head, untied'
  return ''


def hf_config(config: transformer.ModelConfig, context_length: int) -> dict:
  return dict(architectures=[ARCHITECTURE], model_type='gpt_neox', vocab_size=config.vocab_size,
              hidden_size=config.model_dim, num_attention_heads=config.num_heads,
              num_hidden_layers=config.num_decoder_layers, intermediate_size=config.feed_forward_dim,
              hidden_act={'gelu_exact': 'gelu', 'gelu': 'gelu_new'}[config.activation],
              rotary_pct=_rotated(config) / config.head_dim, rotary_emb_base=config.position.settings.rope_base,
              max_position_embeddings=context_length, layer_norm_eps=config.layer_norm_eps,
              use_parallel_residual=config.parallel_residual, tie_word_embeddings=False, attention_bias=True,
              hidden_dropout=0.0, attention_dropout=0.0, torch_dtype='float32')


def tensors(variables: dict, config: transformer.ModelConfig) -> dict:
  return tables.write_tensors(table(config), variables)
