"""A GGUF file (llama.cpp's format) of the llama architecture as this library's decoder: its metadata mapped to
transformer.ModelConfig, its tensors read with the `gguf` package and dequantized to float32 (Q4_1, Q8_0, F16,
F32 and the other types the package knows).

llama.cpp's converter stores each head's query and key rows in interleaved order (row 2i is Hugging Face's row i,
row 2i + 1 its row i + d/2), which is this library's rotary layout (features 2i and 2i + 1 turn together): they
are taken as they are. A file without `output.weight` ties the output to the token embedding. GGUF lists a matrix's
dimensions fastest first; the package hands its rows as NumPy's (out x in), a Linear's weight. A `rope_freqs.weight`
tensor (llama.cpp's converter writes Llama 3.1's frequency bands as one, theta_p / f_p) becomes those per-pair
factors (LongRoPE's form at factor 1: theta_p / lambda_p, no attention factor). A tensor the import would not read
is refused by name, so that nothing in the file is dropped silently.

The file's tokenizer (tokenizer.ggml.*) of the gpt2 kind, a byte-level BPE, is rebuilt with Hugging Face
`tokenizers`: its tokens, merges and control tokens, and the pre-tokenizer its `pre` names (llama.cpp's: smollm
splits every digit before GPT-2's split).
"""

from typing import Callable

import numpy as np

import transformer
from experiments.pretrained.hugging_face import PretrainedError, checked

SUPPORTED_ARCHITECTURES = ('llama',)
ROPE_FACTORS = 'rope_freqs.weight'  # per-pair divisors of the rotary frequencies (Llama 3.1's bands)


def _field(reader, name: str, default=None):
  field = reader.fields.get(name)
  if field is None:
    if default is None:
      raise PretrainedError(f'--source: the GGUF file has no {name}; valid: a llama.cpp GGUF of the llama architecture')
    return default
  return field.contents()


def model_config(reader) -> transformer.ModelConfig:
  """This library's config of the file's model; PretrainedError naming the key it cannot serve."""
  architecture = _field(reader, 'general.architecture')
  if architecture not in SUPPORTED_ARCHITECTURES:
    raise PretrainedError(f'general.architecture: got {architecture!r}; valid: {", ".join(SUPPORTED_ARCHITECTURES)}')
  width, heads = int(_field(reader, 'llama.embedding_length')), int(_field(reader, 'llama.attention.head_count'))
  head_dim = width // heads
  rotated = int(_field(reader, 'llama.rope.dimension_count', head_dim))
  if rotated != head_dim:
    raise PretrainedError(f'llama.rope.dimension_count: got {rotated}; valid: the head width {head_dim} (partial '
                          'rotary is not read from a GGUF file yet)')
  scaling = _field(reader, 'llama.rope.scaling.type', 'none')
  if scaling != 'none':
    raise PretrainedError(f'llama.rope.scaling.type: got {scaling!r}; valid here: none')
  names = {tensor.name for tensor in reader.tensors}
  vocabulary = next(tensor for tensor in reader.tensors if tensor.name == 'token_embd.weight').shape[-1]
  position = dict(rope_base=float(_field(reader, 'llama.rope.freq_base', 10000.0)))
  if ROPE_FACTORS in names:
    factors = ' '.join(str(float(f)) for f in tensor_reader(reader)(ROPE_FACTORS).reshape(-1))
    position.update(rope_extension='longrope', original_length=max(2, context_length(reader)),
                    longrope_short_factors=factors, longrope_long_factors=factors)
  return transformer.ModelConfig(
      vocab_size=int(vocabulary), model_dim=width, num_heads=heads,
      num_kv_heads=int(_field(reader, 'llama.attention.head_count_kv', heads)),
      feed_forward_dim=int(_field(reader, 'llama.feed_forward_length')), num_encoder_layers=0,
      num_decoder_layers=int(_field(reader, 'llama.block_count')), dropout_rate=0.0, activation='swiglu', norm='pre',
      norm_type='rmsnorm', layer_norm_eps=float(_field(reader, 'llama.attention.layer_norm_rms_epsilon')),
      use_bias=False, tie_embeddings='output.weight' not in names, scale_embeddings=False,
      position=transformer.PositionConfig('rope', **position))


def architecture(reader) -> str:
  return str(_field(reader, 'general.architecture'))


def context_length(reader) -> int:
  """The context the model was trained at (llama.context_length)."""
  return int(_field(reader, 'llama.context_length', 0))


def tensor_reader(reader) -> Callable[[str], np.ndarray]:
  """read(name) -> the tensor dequantized to float32, NumPy's (out x in) for a matrix; PretrainedError for a
  quantization type the gguf package cannot dequantize."""
  from gguf import quants  # pylint: disable=g-import-not-at-top
  tensors = {tensor.name: tensor for tensor in reader.tensors}

  def read(name: str) -> np.ndarray:
    if name not in tensors:
      raise PretrainedError(f'the GGUF file has no tensor {name!r}')
    tensor = tensors[name]
    try:
      return np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    except NotImplementedError:
      raise PretrainedError(f'{name}: quantization type {tensor.tensor_type.name}, which the gguf package cannot '
                            'dequantize; valid: F32, F16, BF16, Q4_0, Q4_1, Q8_0 and the other types it '
                            'implements') from None
  return read


def gguf_shape(name: str, config: transformer.ModelConfig) -> tuple:
  """The shape the file's metadata gives a llama tensor (out x in, as the package hands it)."""
  width, vocabulary, hidden = config.model_dim, config.vocab_size, config.feed_forward_dim
  queries, keys = config.num_heads * config.head_dim, config.key_value_heads * config.head_dim
  table = {'attn_q.weight': (queries, width), 'attn_k.weight': (keys, width), 'attn_v.weight': (keys, width),
           'attn_output.weight': (width, queries), 'ffn_gate.weight': (hidden, width),
           'ffn_up.weight': (hidden, width), 'ffn_down.weight': (width, hidden),
           'token_embd.weight': (vocabulary, width), 'output.weight': (vocabulary, width)}
  return table.get('.'.join(name.rsplit('.', 2)[-2:]), (width,))


def llama_params(read: Callable[[str], np.ndarray], config: transformer.ModelConfig, names=None) -> dict:
  """{'params': ...} of transformer.DecoderOnly(config) from the file's tensors (llama.cpp's names). names: every
  tensor the file holds; PretrainedError naming one this would leave unread."""
  if names is not None:
    unread = sorted(set(names) - set(llama_tensor_names(config)) - {ROPE_FACTORS})
    if unread:
      raise PretrainedError(f'the GGUF file holds {len(unread)} tensor(s) this import does not read '
                            f'({", ".join(unread[:4])}); valid: the llama architecture\'s tensors only, so that none '
                            'is dropped')
  read = checked(read, lambda name: gguf_shape(name, config), 'the file\'s metadata')
  layers = {}
  for index in range(config.num_decoder_layers):
    block = f'blk.{index}'
    layers[f'layer_{index}'] = {
        'self_attention': {ours: {'kernel': read(f'{block}.{theirs}.weight').T}
                           for ours, theirs in (('query', 'attn_q'), ('key', 'attn_k'), ('value', 'attn_v'),
                                                ('out', 'attn_output'))},
        'self_attention_residual': {'RMSNorm_0': {'scale': read(f'{block}.attn_norm.weight')}},
        'feed_forward': {'gate_kernel': read(f'{block}.ffn_gate.weight').T,
                         'hidden_kernel': read(f'{block}.ffn_up.weight').T,
                         'output_kernel': read(f'{block}.ffn_down.weight').T},
        'feed_forward_residual': {'RMSNorm_0': {'scale': read(f'{block}.ffn_norm.weight')}},
    }
  embedding = {'embedding': {'embedding': read('token_embd.weight')}}
  if not config.tie_embeddings:
    embedding['output'] = {'kernel': read('output.weight').T}
  return {'params': {'decoder': {**layers, 'final_norm': {'scale': read('output_norm.weight')}},
                     'embedding': embedding}}


# tokenizer.ggml.pre -> whether digits are split one by one before GPT-2's split (llama.cpp's pre-tokenizers).
BYTE_LEVEL_PRE = {'gpt2': False, 'smollm': True, 'starcoder': True}
CONTROL = 3  # tokenizer.ggml.token_type of a control (special) token


def tokenizer_json(reader) -> str:
  """The file's tokenizer as Hugging Face tokenizers' JSON; PretrainedError for a kind not rebuilt here."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  kind, pre = _field(reader, 'tokenizer.ggml.model', ''), _field(reader, 'tokenizer.ggml.pre', 'default')
  if kind != 'gpt2' or pre not in BYTE_LEVEL_PRE:
    raise PretrainedError(f'tokenizer.ggml.model: got {kind!r} with pre {pre!r}; valid: gpt2 (a byte-level BPE) with '
                          f'pre {", ".join(BYTE_LEVEL_PRE)}')
  tokens = [str(token) for token in _field(reader, 'tokenizer.ggml.tokens')]
  merges = [tuple(str(merge).split(' ')) for merge in _field(reader, 'tokenizer.ggml.merges')]
  tokenizer = Tokenizer(models.BPE(vocab={token: index for index, token in enumerate(tokens)}, merges=merges,
                                   fuse_unk=False, byte_fallback=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                             if BYTE_LEVEL_PRE[pre] else byte_level)
  tokenizer.decoder = decoders.ByteLevel()
  types = list(_field(reader, 'tokenizer.ggml.token_type', [1] * len(tokens)))
  tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                for token, kind in zip(tokens, types) if int(kind) == CONTROL])
  return tokenizer.to_str()


def llama_tensor_names(config: transformer.ModelConfig) -> list:
  """The tensors llama_params reads."""
  per_layer = ('attn_q', 'attn_k', 'attn_v', 'attn_output', 'attn_norm', 'ffn_gate', 'ffn_up', 'ffn_down', 'ffn_norm')
  names = [f'blk.{index}.{name}.weight' for index in range(config.num_decoder_layers) for name in per_layer]
  return names + ['token_embd.weight', 'output_norm.weight'] + ([] if config.tie_embeddings else ['output.weight'])


def load(path: str) -> tuple[transformer.ModelConfig, dict]:
  """(the model's config, its parameters, dequantized to float32) from a GGUF file."""
  from gguf import GGUFReader  # pylint: disable=g-import-not-at-top
  reader = GGUFReader(path)
  config = model_config(reader)
  return config, llama_params(tensor_reader(reader), config, [tensor.name for tensor in reader.tensors])
