"""A GGUF file (llama.cpp's format) of the llama, qwen2 or gemma3 architecture as this library's decoder: its metadata
mapped to transformer.ModelConfig, its tensors read with the `gguf` package and dequantized to float32 (Q4_1, Q8_0,
F16, F32 and the other types the package knows), then read by the Llama table (llama.py) or Gemma's (gemma.py).

gemma3: the metadata has no local RoPE base and no layer pattern; llama.cpp takes Gemma 3's, 10,000 and five
sliding layers to one global, and so does this reader (GEMMA3_LOCAL_BASE, GEMMA3_PATTERN). llama.cpp's converter
stores each Gemma RMSNorm's 1 + w, which is read as Hugging Face's w (minus one) and made 1 + w again by the table;
its query and key rows are in Hugging Face's halves (it rotates them as GPT-NeoX does); query_pre_attn_scalar is the
head width, as llama.cpp scales the 270M-4B models.

llama.cpp's converter permutes each head's query and key rows of the llama architecture into interleaved order
(row 2i is Hugging Face's row i, row 2i + 1 its row i + d/2) and leaves qwen2's in Hugging Face's halves (it
rotates them as GPT-NeoX does); the llama rows are put back in halves here, and every model then goes through the
Hugging Face reader's one permutation into this library's pairs. qwen2 adds query, key and value biases. A file
without `output.weight` ties the output to the token embedding. GGUF lists a matrix's dimensions fastest first;
the package hands its rows as NumPy's (out x in), a Linear's weight. RoPE scaling of the linear and yarn types is
read from the file's metadata (rope_scaling). A `rope_freqs.weight` tensor (llama.cpp's converter writes Llama 3.1's
frequency bands as one, theta_p / f_p) becomes those per-pair factors (LongRoPE's form at factor 1: theta_p /
lambda_p, no attention factor). A tensor the import would not read is refused by name,
so that nothing in the file is dropped silently.

The file's tokenizer (tokenizer.ggml.*) of the gpt2 kind, a byte-level BPE, is rebuilt with Hugging Face
`tokenizers`: its tokens, merges and control tokens, and the pre-tokenizer its `pre` names (llama.cpp's: smollm
splits every digit before GPT-2's split); of the llama kind, SentencePiece, by sentencepiece_gguf.py.
"""

import re
from typing import Callable

import numpy as np

import transformer
from experiments.pretrained import gemma, llama, rope_config, sentencepiece_gguf, tables
from experiments.pretrained.tables import PretrainedError

SUPPORTED_ARCHITECTURES = ('llama', 'qwen2', 'gemma3')
GEMMA3_LOCAL_BASE, GEMMA3_PATTERN = 10000.0, 6  # llama.cpp's Gemma 3 defaults: not in the file's metadata
INTERLEAVED = ('llama',)  # the architectures whose query and key rows llama.cpp's converter interleaves
ROPE_FACTORS = 'rope_freqs.weight'  # per-pair divisors of the rotary frequencies (Llama 3.1's bands)
GLOBAL_NAMES = {'model.embed_tokens.weight': 'token_embd.weight', 'model.norm.weight': 'output_norm.weight',
                'lm_head.weight': 'output.weight'}
LAYER_NAMES = {'self_attn.q_proj': 'attn_q', 'self_attn.k_proj': 'attn_k', 'self_attn.v_proj': 'attn_v',
               'self_attn.o_proj': 'attn_output', 'mlp.gate_proj': 'ffn_gate', 'mlp.up_proj': 'ffn_up',
               'mlp.down_proj': 'ffn_down', 'input_layernorm': 'attn_norm', 'post_attention_layernorm': 'ffn_norm'}
GEMMA_LAYER_NAMES = {**{hf: gguf for hf, gguf in LAYER_NAMES.items() if hf != 'post_attention_layernorm'},
                     'self_attn.q_norm': 'attn_q_norm', 'self_attn.k_norm': 'attn_k_norm',
                     'post_attention_layernorm': 'post_attention_norm', 'pre_feedforward_layernorm': 'ffn_norm',
                     'post_feedforward_layernorm': 'post_ffw_norm'}
HF_LAYER = re.compile(r'^model\.layers\.(\d+)\.(.+)\.(weight|bias)$')
GGUF_LAYER = re.compile(r'^blk\.(\d+)\.(\w+)\.(weight|bias)$')


def _field(reader, name: str, default=None):
  field = reader.fields.get(name)
  if field is None:
    if default is None:
      raise PretrainedError(f'--source: the GGUF file has no {name}; valid: a llama.cpp GGUF of the '
                            f'{" or ".join(SUPPORTED_ARCHITECTURES)} architecture')
    return default
  return field.contents()


def model_config(reader) -> transformer.ModelConfig:
  """This library's config of the file's model; PretrainedError naming the key it cannot serve."""
  arch = _field(reader, 'general.architecture')
  if arch not in SUPPORTED_ARCHITECTURES:
    raise PretrainedError(f'general.architecture: got {arch!r}; valid: {", ".join(SUPPORTED_ARCHITECTURES)}')
  if arch == 'gemma3':
    return gemma.model_config(_gemma3_fields(reader), 'Gemma3ForCausalLM')
  width, heads = (_count(reader, f'{arch}.{key}') for key in ('embedding_length', 'attention.head_count'))
  head_dim = width // heads
  rotated = int(_field(reader, f'{arch}.rope.dimension_count', head_dim))
  if rotated != head_dim:
    raise PretrainedError(f'{arch}.rope.dimension_count: got {rotated}; valid: the head width {head_dim} (partial '
                          'rotary is not read from a GGUF file yet)')
  position = rope_config.rope_position({'rope_theta': float(_field(reader, f'{arch}.rope.freq_base', 10000.0)),
                                        'rope_scaling': rope_scaling(reader, arch)})
  names = {tensor.name for tensor in reader.tensors}
  embedding = [tensor for tensor in reader.tensors if tensor.name == 'token_embd.weight']
  if not embedding:
    raise PretrainedError('--source: the GGUF file has no token_embd.weight; valid: a llama.cpp GGUF file with its '
                          'token embedding (the vocabulary is read from its shape)')
  vocabulary = embedding[0].shape[-1]
  if ROPE_FACTORS in names:
    if position.settings.rope_extension != 'none':
      raise PretrainedError(f'{arch}.rope.scaling.type: got {_field(reader, f"{arch}.rope.scaling.type")!r} beside '
                            f'{ROPE_FACTORS}; valid: one of the two')
    factors = ' '.join(str(float(f)) for f in tensor_reader(reader)(ROPE_FACTORS).reshape(-1))
    position = tables.position_config('rope', WHERE, rope_base=position.settings.rope_base, rope_extension='longrope',
                                      original_length=max(2, context_length(reader)),
                                      longrope_short_factors=factors, longrope_long_factors=factors)
  return tables.model_config(
      WHERE, **llama.BLOCK, vocab_size=int(vocabulary), model_dim=width, num_heads=heads,
      num_kv_heads=_count(reader, f'{arch}.attention.head_count_kv', heads),
      feed_forward_dim=_count(reader, f'{arch}.feed_forward_length'), num_encoder_layers=0,
      num_decoder_layers=_count(reader, f'{arch}.block_count'), dropout_rate=0.0,
      layer_norm_eps=tables.number({'epsilon': _field(reader, f'{arch}.attention.layer_norm_rms_epsilon')}, 'epsilon',
                                   where=f'{arch}.attention.layer_norm_rms_epsilon'),
      qkv_bias=arch == 'qwen2', tie_embeddings='output.weight' not in names, position=position)


WHERE = 'the GGUF file\'s metadata'


def _gemma3_fields(reader) -> dict:
  """The gemma3 file's metadata as the Hugging Face config gemma.py reads (its defaults where the file has none)."""
  names = {tensor.name for tensor in reader.tensors}
  embedding = [tensor for tensor in reader.tensors if tensor.name == 'token_embd.weight']
  if not embedding:
    raise PretrainedError('--source: the GGUF file has no token_embd.weight; valid: a llama.cpp GGUF file with its '
                          'token embedding (the vocabulary is read from its shape)')
  head_dim = _count(reader, 'gemma3.attention.key_length')
  if _count(reader, 'gemma3.attention.value_length', head_dim) != head_dim:
    raise PretrainedError(f'gemma3.attention.value_length: got {_field(reader, "gemma3.attention.value_length")}; '
                          f'valid: the key length {head_dim}')
  return dict(
      hidden_size=_count(reader, 'gemma3.embedding_length'), num_attention_heads=_count(reader, 'gemma3.attention.head_count'),
      num_key_value_heads=_count(reader, 'gemma3.attention.head_count_kv'), head_dim=head_dim,
      intermediate_size=_count(reader, 'gemma3.feed_forward_length'), num_hidden_layers=_count(reader, 'gemma3.block_count'),
      rms_norm_eps=float(_field(reader, 'gemma3.attention.layer_norm_rms_epsilon')),
      sliding_window=_count(reader, 'gemma3.attention.sliding_window'), sliding_window_pattern=GEMMA3_PATTERN,
      max_position_embeddings=context_length(reader), vocab_size=int(embedding[0].shape[-1]),
      rope_theta=float(_field(reader, 'gemma3.rope.freq_base', 1e6)), rope_local_base_freq=GEMMA3_LOCAL_BASE,
      rope_scaling=rope_scaling(reader, 'gemma3') or None, query_pre_attn_scalar=head_dim,
      tie_word_embeddings='output.weight' not in names)


def _count(reader, name: str, default=None) -> int:
  """A positive integer of the file's metadata; PretrainedError naming the key otherwise."""
  value = _field(reader, name, default)
  try:
    number = int(value)
  except (TypeError, ValueError):
    number = 0
  if number < 1 or number != value:
    raise PretrainedError(f'{name}: got {value!r}; valid: a positive integer')
  return number


# llama.cpp's YaRN keys that transformers' rope_scaling has no field for, with the value that leaves YaRN as it is.
NEUTRAL_YARN_KEYS = {'attn_factor': 1.0, 'yarn_attn_factor': 1.0, 'yarn_ext_factor': 1.0, 'yarn_log_multiplier': 0.0}


def rope_scaling(reader, arch: str) -> dict:
  """The file's <arch>.rope.scaling.* as transformers' rope_scaling: linear (its factor: PI) and yarn (factor,
  original_context_length, yarn_beta_fast and yarn_beta_slow; llama.cpp's ramp over pair indices and attention
  factor 0.1 ln s + 1 are transformers' defaults). A type or a key that would compute something else is refused by
  name; none, or no key, is RoPE as trained."""
  prefix = f'{arch}.rope.scaling.'
  kind = _field(reader, prefix + 'type', 'none')
  if kind == 'none':
    return {}
  if kind not in ('linear', 'yarn'):
    raise PretrainedError(f'{prefix}type: got {kind!r}; valid here: none, linear, yarn')
  scaling = {'rope_type': kind, 'factor': float(_field(reader, prefix + 'factor'))}
  if kind == 'yarn':
    scaling.update(original_max_position_embeddings=int(_field(reader, prefix + 'original_context_length')),
                   beta_fast=float(_field(reader, prefix + 'yarn_beta_fast', 32.0)),
                   beta_slow=float(_field(reader, prefix + 'yarn_beta_slow', 1.0)))
  for key, neutral in NEUTRAL_YARN_KEYS.items():
    value = _field(reader, prefix + key, neutral)
    if float(value) != neutral:
      raise PretrainedError(f'{prefix}{key}: got {value}; valid here: {neutral} (llama.cpp\'s meaning of it has no '
                            'counterpart read here)')
  return scaling


def architecture(reader) -> str:
  return str(_field(reader, 'general.architecture'))


def context_length(reader) -> int:
  """The context the model was trained at (<architecture>.context_length)."""
  return int(_field(reader, f'{architecture(reader)}.context_length', 0))


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


def _layer_names(arch: str) -> dict:
  return GEMMA_LAYER_NAMES if arch == 'gemma3' else LAYER_NAMES


def gguf_name(hf_name: str, arch: str = 'llama') -> str:
  """llama.cpp's name of a Hugging Face tensor (model.layers.3.self_attn.q_proj.bias -> blk.3.attn_q.bias)."""
  if hf_name in GLOBAL_NAMES:
    return GLOBAL_NAMES[hf_name]
  match = HF_LAYER.match(hf_name)
  if not match or match[2] not in _layer_names(arch):
    raise PretrainedError(f'{hf_name}: no llama.cpp name for this tensor')
  return f'blk.{match[1]}.{_layer_names(arch)[match[2]]}.{match[3]}'


def hugging_face_name(name: str, arch: str = 'llama') -> str:
  """The Hugging Face name of a llama.cpp tensor (blk.3.attn_q.bias -> model.layers.3.self_attn.q_proj.bias); '' for
  a name the architecture's layout has no tensor for."""
  for hf_name, gguf in GLOBAL_NAMES.items():
    if name == gguf:
      return hf_name
  match = GGUF_LAYER.match(name)
  theirs = {gguf: hf for hf, gguf in _layer_names(arch).items()}.get(match[2]) if match else None
  return f'model.layers.{match[1]}.{theirs}.{match[3]}' if theirs else ''


def params(read: Callable[[str], np.ndarray], config: transformer.ModelConfig, arch: str, names) -> dict:
  """{'params': ...} of transformer.DecoderOnly(config) from the file's tensors, read(llama.cpp name) each, by the
  llama table (llama.py; gemma.py's for gemma3); names: every tensor the file holds, PretrainedError naming one left
  unread."""
  layout = gemma if arch == 'gemma3' else llama
  expected = {row.name for row in layout.table(config)}
  unnamed = sorted(name for name in names if name != ROPE_FACTORS and hugging_face_name(name, arch) not in expected)
  if unnamed:
    raise PretrainedError(f'the GGUF file holds {len(unnamed)} tensor(s) this import does not read '
                          f'({", ".join(unnamed[:4])}); valid: the {arch} architecture\'s tensors only, so that none '
                          'is dropped')

  def read_as_hugging_face(hf_name: str) -> np.ndarray:
    array = read(gguf_name(hf_name, arch))
    if arch == 'gemma3' and hf_name.endswith('norm.weight'):
      return array - 1.0  # llama.cpp stores Gemma's 1 + w
    match = HF_LAYER.match(hf_name)
    heads = match and {'self_attn.q_proj': config.num_heads, 'self_attn.k_proj': config.key_value_heads}.get(match[2])
    if arch in INTERLEAVED and heads and array.shape[0] == heads * config.head_dim:  # else the shape is refused
      array = tables.permute_heads(array, heads, np.argsort(tables.rotary_order(config.head_dim)))
    return array
  hf_names = [hugging_face_name(name, arch) for name in names if name != ROPE_FACTORS]
  return layout.params(read_as_hugging_face, hf_names, config, WHERE)


# tokenizer.ggml.pre -> whether digits are split one by one before GPT-2's split (llama.cpp's pre-tokenizers).
BYTE_LEVEL_PRE = {'gpt2': False, 'smollm': True, 'starcoder': True}
CONTROL = 3  # tokenizer.ggml.token_type of a control (special) token


def tokenizer_json(reader) -> str:
  """The file's tokenizer as Hugging Face tokenizers' JSON; PretrainedError for a kind not rebuilt here."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  kind, pre = _field(reader, 'tokenizer.ggml.model', ''), _field(reader, 'tokenizer.ggml.pre', 'default')
  if kind == 'llama':  # SentencePiece (Gemma, Llama 2)
    return sentencepiece_gguf.tokenizer_json(
        [str(token) for token in _field(reader, 'tokenizer.ggml.tokens')],
        [int(kind) for kind in _field(reader, 'tokenizer.ggml.token_type')],
        int(_field(reader, 'tokenizer.ggml.bos_token_id')), bool(_field(reader, 'tokenizer.ggml.add_bos_token', True)),
        bool(_field(reader, 'tokenizer.ggml.add_space_prefix', True)))
  if kind != 'gpt2' or pre not in BYTE_LEVEL_PRE:
    raise PretrainedError(f'tokenizer.ggml.model: got {kind!r} with pre {pre!r}; valid: gpt2 (a byte-level BPE) with '
                          f'pre {", ".join(BYTE_LEVEL_PRE)}, or llama (SentencePiece)')
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


def load(path: str) -> tuple[transformer.ModelConfig, dict]:
  """(the model's config, its parameters, dequantized to float32) from a GGUF file."""
  from gguf import GGUFReader  # pylint: disable=g-import-not-at-top
  reader = GGUFReader(path)
  config = model_config(reader)
  return config, params(tensor_reader(reader), config, architecture(reader), [t.name for t in reader.tensors])
