"""GPT-2 (GPT2LMHeadModel, Radford et al. 2019) both ways: learned absolute positions (transformer.wpe, n_positions
rows), pre-LayerNorm with biases, the tanh approximation of GELU (gelu_new), a feed-forward n_inner wide (4 x n_embd
by default), tied embeddings. Its Conv1D layers store weights as (in x out), this library's kernel as it is; the
attention's fused c_attn holds the query, key and value kernels side by side (one row of the table, three
parameters)."""

import numpy as np

import transformer
from experiments.pretrained import tables
from experiments.pretrained.tables import PretrainedError, flag, layer_path, number

ARCHITECTURE = 'GPT2LMHeadModel'
TANH_GELU = ('gelu_new', 'gelu_pytorch_tanh')  # this library's gelu is jax.nn.gelu, the tanh approximation
BLOCK = dict(architecture='transformer', norm='pre', norm_type='layernorm', activation='gelu', use_bias=True,
             parallel_residual=False, scale_embeddings=False)
EMBEDDING, OUTPUT = 'transformer.wte.weight', 'lm_head.weight'


def model_config(hf_config: dict, name: str = ARCHITECTURE) -> transformer.ModelConfig:
  del name
  width = number(hf_config, 'n_embd', integer=True)
  activation = hf_config.get('activation_function', 'gelu_new')
  if activation not in TANH_GELU:
    raise PretrainedError(f'config.json: activation_function: got {activation!r}; valid: {", ".join(TANH_GELU)} '
                          '(the tanh approximation of GELU, which this library computes)')
  for field in ('scale_attn_by_inverse_layer_idx', 'reorder_and_upcast_attn', 'add_cross_attention'):
    if hf_config.get(field):
      raise PretrainedError(f'config.json: {field}: got {hf_config[field]!r}; valid: false')
  if not flag(hf_config, 'scale_attn_weights', True):
    raise PretrainedError('config.json: scale_attn_weights: got false; valid: true (logits / sqrt(head width))')
  return tables.model_config(
      **BLOCK, vocab_size=number(hf_config, 'vocab_size', integer=True), model_dim=width,
      num_heads=number(hf_config, 'n_head', integer=True), num_kv_heads=0,
      feed_forward_dim=number(hf_config, 'n_inner', 4 * width, integer=True), num_encoder_layers=0,
      num_decoder_layers=number(hf_config, 'n_layer', integer=True), dropout_rate=0.0,
      layer_norm_eps=number(hf_config, 'layer_norm_epsilon', 1e-5),
      tie_embeddings=flag(hf_config, 'tie_word_embeddings', True),
      position=tables.position_config('learned', max_length=number(hf_config, 'n_positions', integer=True)))


def _fused(name: str, index: int, shape: tuple) -> tables.Row:
  """c_attn's weight or bias: the query's, key's and value's side by side on the last axis."""
  leaf = 'kernel' if len(shape) == 2 else 'bias'
  paths = tuple(layer_path(index, 'self_attention', part, leaf) for part in ('query', 'key', 'value'))
  return tables.Row(name, paths, shape, lambda array: tuple(np.split(array, 3, axis=-1)),
                    lambda arrays: np.concatenate(arrays, axis=-1))


def table(config: transformer.ModelConfig) -> list:
  width, hidden, vocabulary = config.model_dim, config.feed_forward_dim, config.vocab_size

  def norm(name, *path):
    return tables.layer_norm(name, path, width)
  rows = [tables.same(EMBEDDING, ('embedding', 'embedding', 'embedding'), (vocabulary, width)),
          tables.same('transformer.wpe.weight', ('decoder', 'position', 'table'),
                      (config.position.settings.max_length, width)),
          *norm('transformer.ln_f', 'decoder', 'final_norm')]
  if not config.tie_embeddings:
    rows.append(tables.output_without_bias(OUTPUT, (vocabulary, width)))
  for index in range(config.num_decoder_layers):
    prefix = f'transformer.h.{index}'
    rows += [_fused(f'{prefix}.attn.c_attn.weight', index, (width, 3 * width)),
             _fused(f'{prefix}.attn.c_attn.bias', index, (3 * width,)),
             tables.same(f'{prefix}.attn.c_proj.weight', layer_path(index, 'self_attention', 'out', 'kernel'),
                         (width, width)),
             tables.same(f'{prefix}.attn.c_proj.bias', layer_path(index, 'self_attention', 'out', 'bias'), (width,))]
    for theirs, ours, shape in (('c_fc', 'hidden', (width, hidden)), ('c_proj', 'output', (hidden, width))):
      rows += [tables.same(f'{prefix}.mlp.{theirs}.weight', layer_path(index, 'feed_forward', f'{ours}_kernel'), shape),
               tables.same(f'{prefix}.mlp.{theirs}.bias', layer_path(index, 'feed_forward', f'{ours}_bias'), shape[1:])]
    rows += norm(f'{prefix}.ln_1', *layer_path(index, 'self_attention_residual', 'LayerNorm_0'))
    rows += norm(f'{prefix}.ln_2', *layer_path(index, 'feed_forward_residual', 'LayerNorm_0'))
  return rows


def buffers(name: str) -> bool:
  """The causal mask older checkpoints store per layer (attn.bias, attn.masked_bias: buffers, not weights)."""
  return name.endswith(('.attn.masked_bias', '.attn.bias'))


def params(read, names, config: transformer.ModelConfig, where: str = 'config.json') -> dict:
  tied_head = tables.tied_output(read, names, config, EMBEDDING, OUTPUT, where)
  return tables.read_params(table(config), read, names, where, lambda name: buffers(name) or name == tied_head)


def exportable(config: transformer.ModelConfig) -> str:
  """'' when the run's model is GPT-2's block: learned positions, pre-LayerNorm, GELU, biases, multi-head."""
  if config.position.kind != 'learned':
    return f'model.position.kind: got {config.position.kind!r}; valid: learned (GPT-2\'s block)'
  for field, value in {**BLOCK, **tables.PLAIN_ATTENTION, 'head_width': 0}.items():
    if getattr(config, field) != value:
      return f'model.{field}: got {getattr(config, field)!r}; valid: {value!r} (GPT-2\'s block)'
  if config.key_value_heads != config.num_heads:
    return f'model.num_kv_heads: got {config.num_kv_heads}; valid: 0 (GPT-2 is multi-head)'
  if config.position.settings.interpolation_factor != 1.0:
    return (f'model.position.interpolation_factor: got {config.position.settings.interpolation_factor}; valid: 1.0 '
            '(GPT-2 has no interpolation)')
  return ''


def hf_config(config: transformer.ModelConfig, context_length: int) -> dict:
  del context_length  # n_positions is the table's rows
  return dict(architectures=[ARCHITECTURE], model_type='gpt2', vocab_size=config.vocab_size,
              n_positions=config.position.settings.max_length, n_embd=config.model_dim,
              n_layer=config.num_decoder_layers,
              n_head=config.num_heads, n_inner=config.feed_forward_dim, activation_function='gelu_new',
              layer_norm_epsilon=config.layer_norm_eps, tie_word_embeddings=config.tie_embeddings, resid_pdrop=0.0,
              embd_pdrop=0.0, attn_pdrop=0.0, torch_dtype='float32')


def tensors(variables: dict, config: transformer.ModelConfig) -> dict:
  return tables.write_tensors(table(config), variables)
