"""The hostile matrix of the checkpoints' import and export, load_run, evaluate --corpus and prepare_corpus's Parquet:
each case reported as its command, exit code, stderr's line count and last line, and what changed on disk. Not a
pytest file (tests/test_import_checkpoint.py, tests/test_pretrained_refusals.py, tests/test_pretrained.py and
tests/test_corpus.py hold the assertions); it takes a few minutes and writes under the directory it is given:

  python tests/hostile_import_matrix.py /tmp/hostile-import > import_matrix.jsonl

Sources are written here: a tiny Llama folder (safetensors' NumPy API, the shipped corpus's BPE as its tokenizer),
variants of it that lie, GGUF files (the gguf package's writer) and, with transformers installed, GPT-2 and GPT-NeoX
folders. A row's expectation is its first field: 'refused' (exit 2, one line, the disk unchanged), 'served', or
'raises' (load_run, a Python function: an exception whose message names the problem, the disk unchanged).
"""
import copy
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.hostile_matrix import ENV, H, PY, ROOT, describe, snapshot  # pylint: disable=wrong-import-position

import numpy as np  # pylint: disable=wrong-import-position

TOKENIZER = f'{ROOT}/experiments/data/corpus/tokenizer.json'
LLAMA = dict(architectures=['LlamaForCausalLM'], vocab_size=4096, hidden_size=32, intermediate_size=48,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
             max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=False, hidden_act='silu')
TEXT = 'It was the best of times, it was the worst of times, it was the age of wisdom. '


def llama_folder(name: str, config: dict = None, extra: dict = None, drop=(), tokenizer: bool = True) -> str:
  """A Llama folder whose tensors are the ones `config` (or LLAMA) describes, plus `extra`, less `drop`."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  from experiments.pretrained import hugging_face, llama  # pylint: disable=import-outside-toplevel
  folder = f'{H}/src/{name}'
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  config = config or LLAMA
  try:
    rows = llama.table(hugging_face.model_config(config))
  except ValueError:
    rows = llama.table(hugging_face.model_config(LLAMA))
  rng = np.random.default_rng(0)
  tensors = {row.name: (0.2 * rng.normal(size=row.shape) + ('norm' in row.name)).astype(np.float32) for row in rows}
  tensors = {name: value for name, value in {**tensors, **(extra or {})}.items() if name not in drop}
  save_file(tensors, f'{folder}/model.safetensors')
  with open(f'{folder}/config.json', 'w') as file:
    json.dump(config, file)
  if tokenizer:
    shutil.copy(TOKENIZER, f'{folder}/tokenizer.json')
  return folder


def edited(name: str, change) -> str:
  """A copy of the good Llama folder with change(folder) applied."""
  folder = f'{H}/src/{name}'
  shutil.rmtree(folder, ignore_errors=True)
  shutil.copytree(f'{H}/src/llama', folder)
  change(folder)
  return folder


def write(path: str, content) -> None:
  with open(path, 'wb' if isinstance(content, bytes) else 'w') as file:
    file.write(content)


def configured(name: str, **changes) -> str:
  config = copy.deepcopy(LLAMA)
  config.update(changes)
  config = {key: value for key, value in config.items() if value is not None}
  return edited(name, lambda folder: write(f'{folder}/config.json', json.dumps(config)))


def gguf_file(name: str, tokenizer_model: str = '', with_embedding: bool = True) -> str:
  """A tiny llama GGUF file of the good folder's weights (its query and key rows as llama.cpp orders them)."""
  import gguf  # pylint: disable=import-outside-toplevel
  from experiments.pretrained import gguf_file as reader  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  path = f'{H}/src/{name}.gguf'
  writer = gguf.GGUFWriter(path, 'llama')
  writer.add_context_length(64)
  writer.add_embedding_length(32)
  writer.add_block_count(2)
  writer.add_feed_forward_length(48)
  writer.add_head_count(4)
  writer.add_head_count_kv(2)
  writer.add_layer_norm_rms_eps(1e-5)
  writer.add_rope_freq_base(10000.0)
  if tokenizer_model:
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list([f'<t{index}>' for index in range(4096)])
  for hf_name, array in sorted(load_file(f'{H}/src/llama/model.safetensors').items()):
    if hf_name == 'model.embed_tokens.weight' and not with_embedding:
      continue
    writer.add_tensor(reader.gguf_name(hf_name), array)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def transformers_folder(name: str, architecture: str) -> str:
  """A tiny GPT-2 or GPT-NeoX folder saved by transformers ('' without it)."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
  except ImportError:
    return ''
  torch.manual_seed(0)
  if architecture == 'GPT2LMHeadModel':
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=4096, n_embd=32, n_layer=1, n_head=4,
                                                                 n_positions=64))
  else:
    model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=4096, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        max_position_embeddings=64, rotary_pct=0.5))
  folder = f'{H}/src/{name}'
  shutil.rmtree(folder, ignore_errors=True)
  model.save_pretrained(folder, safe_serialization=True)
  shutil.copy(TOKENIZER, f'{folder}/tokenizer.json')
  return folder


def prepare() -> dict:
  """The sources, the corpora and the runs the cases read."""
  shutil.rmtree(H, ignore_errors=True)
  os.makedirs(f'{H}/texts')
  for index in range(12):
    write(f'{H}/texts/doc{index}.txt', f'Document {index}. ' + TEXT * (3 + index % 3))
  for name, tokenizer in (('corpus', TOKENIZER), ('bytes-corpus', 'bytes')):
    subprocess.run([PY, '-m', 'experiments.prepare_corpus', f'--input={H}/texts', f'--output={H}/{name}',
                    f'--tokenizer={tokenizer}', '--heldout_fraction=0.3'], cwd=ROOT, env=ENV, check=True,
                   capture_output=True)
  import pyarrow  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet  # pylint: disable=import-outside-toplevel
  texts = [open(f'{H}/texts/doc{index}.txt').read() for index in range(12)]
  with open(f'{H}/docs.jsonl', 'w') as file:
    for text in texts:
      file.write(json.dumps({'text': text}) + '\n')
  pyarrow.parquet.write_table(pyarrow.table({'id': list(range(12)), 'text': texts}), f'{H}/docs.parquet',
                              row_group_size=5)
  pyarrow.parquet.write_table(pyarrow.table({'id': [1], 'text': [None]}), f'{H}/nulls.parquet')
  write(f'{H}/broken.parquet', open(f'{H}/docs.parquet', 'rb').read()[:-30])
  shutil.copy(f'{H}/docs.parquet', f'{H}/docs.parquet.gz')
  good = llama_folder('llama')
  sources = dict(good=good)
  sources['gpt2'] = transformers_folder('gpt2', 'GPT2LMHeadModel')
  sources['neox'] = transformers_folder('neox', 'GPTNeoXForCausalLM')
  for name, source in (('imported', good), ('bare', good), ('gpt2-run', sources['gpt2']),
                       ('neox-run', sources['neox'])):
    if source:
      arguments = [f'--source={source}', f'--workdir={H}/{name}'] + ([f'--corpus={H}/corpus'] if name == 'imported'
                                                                      else [])
      subprocess.run([PY, '-m', 'experiments.import_checkpoint', *arguments], cwd=ROOT, env=ENV, check=True,
                     capture_output=True)
  subprocess.run([PY, '-m', 'experiments.train', '--config=configs/smoke.py', f'--workdir={H}/smoke',
                  '--config.model.position.kind=alibi'], cwd=ROOT, env=ENV, check=True, capture_output=True)
  return sources


def report(expected: str, argv: list, rows: list, label: str = '') -> None:
  watch = [H]
  before = snapshot(watch)
  done = subprocess.run([PY, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
  after = snapshot(watch)
  lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith(('I1', 'W1'))]
  last = lines[-1] if lines else (done.stdout.strip().splitlines() or [''])[-1]
  shown = (label + ' ' if label else '') + ' '.join(a.replace(ROOT + '/', '').replace(H, '$H') for a in argv)
  rows.append((len(rows) + 1, expected, shown, done.returncode, len(lines), last.replace(H, '$H')[:240],
               describe(before, after)))
  print(json.dumps(rows[-1]), flush=True)


def imported(source: str, workdir: str = '', *extra) -> list:
  return ['-m', 'experiments.import_checkpoint', f'--source={source}', f'--workdir={workdir or H + "/new"}', *extra]


def main() -> None:
  sources = prepare()
  rows = []
  bias = {f'model.layers.0.self_attn.o_proj.bias': np.zeros(32, np.float32)}
  refused_imports = [
      ('no flags', ['-m', 'experiments.import_checkpoint']),
      ('a source that is not there', imported(f'{H}/src/absent')),
      ('a folder without config.json', imported(f'{H}/texts')),
      ('config.json not JSON', imported(edited('not-json', lambda f: write(f'{f}/config.json', '{"architectures": [')))),
      ('config.json a JSON list', imported(edited('json-list', lambda f: write(f'{f}/config.json', '[1, 2]')))),
      ('another architecture', imported(configured('bert', architectures=['BertForMaskedLM']))),
      ('rope factor -2', imported(configured('factor-neg', rope_scaling={'rope_type': 'linear', 'factor': -2}))),
      ('rope factor 0', imported(configured('factor-zero', rope_scaling={'rope_type': 'linear', 'factor': 0}))),
      ('rope factor NaN', imported(configured('factor-nan', rope_scaling={'rope_type': 'linear',
                                                                           'factor': float('nan')}))),
      ('rope_theta 0', imported(configured('theta-zero', rope_theta=0))),
      ('rope_theta negative', imported(configured('theta-neg', rope_theta=-1.0))),
      ('kv heads not dividing the heads', imported(configured('kv3', num_key_value_heads=3))),
      ('num_attention_heads 0', imported(configured('heads0', num_attention_heads=0))),
      ('llama3 without low_freq_factor', imported(configured('llama3', rope_scaling={
          'rope_type': 'llama3', 'factor': 8.0, 'high_freq_factor': 4.0, 'original_max_position_embeddings': 32}))),
      ('linear without factor', imported(configured('linear', rope_scaling={'rope_type': 'linear'}))),
      ('no rms_norm_eps', imported(configured('no-eps', rms_norm_eps=None))),
      ('rope_scaling and rope_parameters disagree', imported(configured('both', rope_scaling={
          'rope_type': 'linear', 'factor': 2.0}, rope_parameters={'rope_type': 'linear', 'factor': 4.0}))),
      ('tied config, another lm_head', imported(configured('tied', tie_word_embeddings=True))),
      ('a layer the config does not list', imported(llama_folder('extra-layer', extra={
          'model.layers.2.mlp.up_proj.weight': np.zeros((48, 32), np.float32)}))),
      ('an o_proj bias without attention_bias', imported(llama_folder('o-bias', extra=bias))),
      ('mlp_bias true, no biases in the file', imported(configured('mlp-bias', mlp_bias=True))),
      ('partial rotary above 1 (GPT-NeoX)', imported(edited('rotary', lambda f: write(f'{f}/config.json', json.dumps(
          dict(architectures=['GPTNeoXForCausalLM'], vocab_size=4096, hidden_size=32, intermediate_size=48,
               num_hidden_layers=1, num_attention_heads=4, rotary_pct=1.5)))))),
      ('tokenizer.json not JSON', imported(edited('bad-tokenizer', lambda f: write(f'{f}/tokenizer.json', 'nope')))),
      ('index not JSON', imported(edited('bad-index', lambda f: (os.rename(f'{f}/model.safetensors',
                                                                             f'{f}/model-1.safetensors'),
                                                                   write(f'{f}/model.safetensors.index.json', '{'))))),
      ('safetensors header longer than its file', imported(edited('header-length', lambda f: write(
          f'{f}/model.safetensors', (10 ** 9).to_bytes(8, 'little') + open(f'{f}/model.safetensors', 'rb').read()[8:])))),
      ('safetensors shape that lies', imported(edited('header-shape', lambda f: write(
          f'{f}/model.safetensors', lying_shape(open(f'{f}/model.safetensors', 'rb').read()))))),
      ('safetensors truncated', imported(edited('truncated', lambda f: write(
          f'{f}/model.safetensors', open(f'{f}/model.safetensors', 'rb').read()[:-1000])))),
      ('GGUF without token_embd.weight', imported(gguf_file('no-embedding', with_embedding=False))),
      ('SentencePiece GGUF with a corpus', imported(gguf_file('spm', tokenizer_model='llama'), '',
                                                    f'--corpus={H}/corpus')),
      ('a corpus of another tokenizer', imported(sources['good'], '', f'--corpus={H}/bytes-corpus')),
      ('a corpus that is not one', imported(sources['good'], '', f'--corpus={H}/texts')),
      ('a workdir that holds a run', imported(sources['good'], f'{H}/imported')),
  ]
  for label, argv in refused_imports:
    report('refused', argv, rows, f'[{label}]')
  from experiments.shared.files import exclusive_lock  # pylint: disable=import-outside-toplevel
  with exclusive_lock(f'{H}/locked.importing.lock', 'the matrix'):
    report('refused', imported(sources['good'], f'{H}/locked'), rows, '[another import holds the lock]')
  report('served', imported(sources['good'], f'{H}/locked'), rows, '[the lock released]')
  report('served', imported(sources['good'], f'{H}/deep/er/run'), rows, '[no corpus, a parent to make]')
  report('served', imported(llama_folder('biases', config=dict(LLAMA, attention_bias=True, mlp_bias=True)),
                            f'{H}/biases'), rows, '[attention_bias and mlp_bias]')
  report('served', imported(gguf_file('spm-bare', tokenizer_model='llama'), f'{H}/spm'), rows,
         '[SentencePiece GGUF, no corpus]')
  report('refused', ['-m', 'experiments.evaluate', f'--workdir={H}/spm', f'--corpus={H}/corpus', '--lengths=16',
                     '--tokens=64'], rows, '[its evaluation on any corpus]')
  # export
  for expected, label, argv in (
      ('refused', 'no flags', ['-m', 'experiments.export_checkpoint']),
      ('refused', 'a workdir without a run', ['-m', 'experiments.export_checkpoint', f'--workdir={H}/texts',
                                              f'--output={H}/export-x']),
      ('refused', 'an output that is not empty', ['-m', 'experiments.export_checkpoint', f'--workdir={H}/imported',
                                                  f'--output={H}/texts']),
      ('refused', 'ALiBi in the Transformer block', ['-m', 'experiments.export_checkpoint', f'--workdir={H}/smoke',
                                                      f'--output={H}/export-alibi']),
      ('served', 'the imported Llama', ['-m', 'experiments.export_checkpoint', f'--workdir={H}/imported',
                                        f'--output={H}/export-llama']),
      ('served', 'the corpus-less import', ['-m', 'experiments.export_checkpoint', f'--workdir={H}/bare',
                                            f'--output={H}/export-bare']),
      ('served', 'Llama with its biases', ['-m', 'experiments.export_checkpoint', f'--workdir={H}/biases',
                                           f'--output={H}/export-biases'])):
    report(expected, argv, rows, f'[export: {label}]')
  for name in ('gpt2-run', 'neox-run'):
    if os.path.isdir(f'{H}/{name}'):
      report('served', ['-m', 'experiments.export_checkpoint', f'--workdir={H}/{name}', f'--output={H}/export-{name}'],
             rows, f'[export: {name}]')
  # load_run
  load = ('from experiments import load_run; import numpy as np, sys; m, v, t = load_run(sys.argv[1]); '
          'print(m.apply(v, np.ones((1, 8), np.int32)).shape, t is not None)')
  report('served', ['-c', load, f'{H}/bare'], rows, '[load_run: no corpus]')
  report('raises', ['-c', load, f'{H}/absent'], rows, '[load_run: no run]')
  moved = f'{H}/src/llama-edited'
  shutil.copytree(sources['good'], moved)
  subprocess.run([PY, '-m', 'experiments.import_checkpoint', f'--source={moved}', f'--workdir={H}/moved'], cwd=ROOT,
                 env=ENV, check=True, capture_output=True)
  with open(f'{moved}/config.json', 'a') as file:
    file.write(' ')
  report('raises', ['-c', load, f'{H}/moved'], rows, '[load_run: its source changed]')
  # evaluate --corpus
  evaluate = ['-m', 'experiments.evaluate', '--lengths=16', '--tokens=64', '--protocol=windows']
  for expected, label, extra in (
      ('refused', 'no corpus given', [f'--workdir={H}/bare']),
      ('refused', 'a corpus of another tokenizer', [f'--workdir={H}/bare', f'--corpus={H}/bytes-corpus']),
      ('refused', 'a folder that is no corpus', [f'--workdir={H}/bare', f'--corpus={H}/texts']),
      ('refused', '--corpus for a copy run', [f'--workdir={H}/smoke', f'--corpus={H}/corpus']),
      ('served', 'a corpus of its tokenizer', [f'--workdir={H}/bare', f'--corpus={H}/corpus']),
      ('served', 'the same again (resumed, nothing new)', [f'--workdir={H}/bare', f'--corpus={H}/corpus']),
      ('served', 'its own corpus, by default', [f'--workdir={H}/imported'])):
    report(expected, evaluate + extra, rows, f'[evaluate: {label}]')
  # prepare_corpus, Parquet
  prepare_corpus = ['-m', 'experiments.prepare_corpus', f'--tokenizer={TOKENIZER}', '--heldout_fraction=0.3']
  for expected, label, extra in (
      ('served', 'Parquet', [f'--input={H}/docs.parquet', f'--output={H}/from-parquet']),
      ('served', 'the same as .jsonl', [f'--input={H}/docs.jsonl', f'--output={H}/from-jsonl']),
      ('refused', 'a missing column', [f'--input={H}/docs.parquet', '--text_field=body', f'--output={H}/p1']),
      ('refused', 'a column of integers', [f'--input={H}/docs.parquet', '--text_field=id', f'--output={H}/p1']),
      ('refused', 'a truncated file', [f'--input={H}/broken.parquet', f'--output={H}/p1']),
      ('refused', 'a gzipped Parquet file', [f'--input={H}/docs.parquet.gz', f'--output={H}/p1']),
      ('refused', 'only null rows', [f'--input={H}/nulls.parquet', f'--output={H}/p1']),
      ('refused', 'an empty --text_field', [f'--input={H}/docs.parquet', '--text_field=', f'--output={H}/p1'])):
    report(expected, prepare_corpus + extra, rows, f'[prepare_corpus: {label}]')
  same = all(open(f'{H}/from-parquet/{name}', 'rb').read() == open(f'{H}/from-jsonl/{name}', 'rb').read()
             for name in ('train.bin', 'heldout.bin'))
  print(json.dumps(['parquet and jsonl token files byte-identical', same]), flush=True)


def lying_shape(data: bytes) -> bytes:
  length = int.from_bytes(data[:8], 'little')
  header = json.loads(data[8:8 + length])
  header['model.norm.weight']['shape'] = [64]
  text = json.dumps(header, separators=(',', ':')).encode()
  return data[:8] + text + b' ' * (length - len(text)) + data[8 + length:]


if __name__ == '__main__':
  main()
