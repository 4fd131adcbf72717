"""A pretrained checkpoint as a finished run that every command here reads.

  python -m experiments.import_checkpoint --source=MODEL.gguf --workdir=runs/MODEL
  python -m experiments.prepare_corpus --input=my_texts/ --tokenizer=runs/MODEL/tokenizer.json --output=corpora/mine
  python -m experiments.evaluate --workdir=runs/MODEL --corpus=corpora/mine --lengths=2048,4096 --extension=none,yarn \
      --factor=2

--source is a Hugging Face model folder (config.json with model.safetensors or a sharded index: Llama, Mistral,
Qwen2, Qwen3, Gemma 2, Gemma 3, GPT-2, GPT-NeoX; experiments/pretrained/hugging_face.py) or a GGUF file of the llama,
qwen2 or gemma3 architecture
(dequantized to float32; experiments/pretrained/gguf_file.py). A model is not its corpus: --corpus is optional, and
names the corpus evaluations read when they are given none; every evaluation takes --corpus=DIR, any corpus
prepared with the model's tokenizer (experiments/runs/corpus_choice.py). A corpus of another tokenizer is refused.

The workdir gets what a finished run holds: config.json (the model, its RoPE settings and extension, the corpus
task at the model's context (its path empty without --corpus), and under `source` the checkpoint's path, format,
architecture and every file's size, modification time and SHA-256), checkpoints/0 (the parameters, float32),
summary.json (step 0), and tokenizer.json when the source has one; its attention runs in blocks of 1024 queries
and 4096 keys, so long windows never hold L x L logits per head. It is written in WORKDIR.importing/ under a lock
(WORKDIR.importing.lock) and renamed at the end, so a failed import leaves nothing and a second import to the same
workdir is refused; a workdir that exists is refused. A command that later reads the run refuses it if the source's
files have changed since (their size or modification time moved and their SHA-256 differs).
"""

import dataclasses
import json
import os
import shutil

import jax
from absl import flags

from configs import corpus as corpus_config
from experiments.pretrained.tables import PretrainedError
from experiments.pretrained.source import TOKENIZER_FILE, Source, read_source
from experiments.runs import checkpoints, corpus_choice, run_record, settings
from experiments.shared import cli
from experiments.shared.files import Busy, exclusive_lock, write_json_atomically, write_text_atomically

_SOURCE = flags.DEFINE_string('source', None, 'A Hugging Face model folder or a .gguf file.')
_CORPUS = flags.DEFINE_string('corpus', None, 'Optional: a corpus prepared with the model\'s tokenizer, the run\'s own '
                              '(evaluations take --corpus=DIR otherwise).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'The run to write (a new directory).')


# Causal attention a block of queries and keys at a time (transformer/blockwise.py), so that a pretrained model's
# long windows never form L x L logits per head: the same attention as one softmax, up to float rounding.
LONG_QUERY_BLOCK, LONG_KEY_BLOCK = 1024, 4096


@dataclasses.dataclass
class _State:  # what a checkpoint holds (experiments/runs/checkpoints.py)
  step: int
  params: dict
  opt_state: dict


def _check_corpus(source: Source, directory: str) -> str:
  """The corpus's absolute path, refused when its tokenizer is not the model's (or its ids exceed the model's
  vocabulary), or when the model's own tokenizer cannot be read to compare."""
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  own = Tokenizer.from_str(source.tokenizer_json).get_vocab(with_added_tokens=True) if source.tokenizer_json else None
  where = source.path if source.format == 'gguf' else os.path.join(source.path, TOKENIZER_FILE)
  hint = f'python -m experiments.prepare_corpus --input=TEXTS --output=DIR --tokenizer={where}'
  try:
    return corpus_choice.fitting_corpus(directory, source.config.vocab_size, own, where, source.tokenizer_refused, hint)
  except ValueError as error:
    raise cli.CommandError(str(error)) from None


def run_record_of(source: Source, corpus_directory: str = '') -> dict:
  """The run's config.json: the corpus task at the model's context (its corpus: corpus_directory, or none, which
  every evaluation then names with --corpus), the model as the source gives it."""
  config = corpus_config.get_config()
  config.task.path = os.path.abspath(corpus_directory) if corpus_directory else checkpoints.NO_CORPUS
  length = source.context_length or 2048
  config.task.max_length = length
  config.task.eval_lengths = (length,)
  model = dataclasses.asdict(source.config)
  model.pop('position')
  model.pop('local_position')
  for name in ('vocab_size', 'num_outputs', 'input_features', 'aligned_cross_attention'):
    model.pop(name)
  for name, value in model.items():
    config.model[name] = tuple(value) if isinstance(value, list) else value
  config.model.position = {'kind': source.config.position.kind, **source.config.position.fields()}
  local = source.config.local_position
  config.model.local_position = {'kind': ''} if local is None else local.fields()
  config.model.attention_block_size = LONG_QUERY_BLOCK
  config.model.attention_key_block_size = LONG_KEY_BLOCK
  config.train.steps = 1  # checked as a training config; the record says 0, the step it was imported at
  try:
    experiment = settings.from_config_dict(config, num_devices=1,
                                           vocab_size=None if corpus_directory else source.config.vocab_size)
  except settings.ConfigError as error:
    raise cli.CommandError(f'--source: {source.path}: {error}') from None
  record = settings.to_dict(experiment)
  record['model']['vocab_size'] = source.config.vocab_size
  record['train']['steps'] = 0
  record['source'] = dict(path=source.path, format=source.format, architecture=source.architecture,
                          context_length=source.context_length, files=source.files)
  if source.tokenizer_refused:
    record['source']['tokenizer_refused'] = source.tokenizer_refused
  return record


def _on_device_in_place(tree: dict) -> None:
  """Each NumPy leaf replaced by a jax array, one at a time, so that the host copy is freed as the device copy is
  made: the checkpoint is written from one copy of the model, not two."""
  for name, value in tree.items():
    if isinstance(value, dict):
      _on_device_in_place(value)
    else:
      tree[name] = jax.device_put(value)


def write_run(source: Source, record: dict, workdir: str) -> None:
  """The run, written in WORKDIR.importing/ and renamed to WORKDIR once whole, under a lock that a second import to
  the same workdir finds held (it is refused, and touches nothing of the first's)."""
  workdir = os.path.abspath(workdir)
  partial = workdir + '.importing'
  with _import_lock(workdir):
    if os.path.exists(workdir) and (not os.path.isdir(workdir) or os.listdir(workdir)):
      raise cli.CommandError(f'--workdir: {workdir} was written by another import meanwhile; valid: a new directory')
    if os.path.exists(partial):  # a killed import's: nobody else writes it while the lock is held
      shutil.rmtree(partial)
    os.makedirs(partial)
    try:
      write_json_atomically(os.path.join(partial, run_record.CONFIG_FILE), run_record.canonical(record))
      saved = checkpoints.Checkpoints(partial, keep=1)
      _on_device_in_place(source.params['params'])
      saved.save(0, _State(step=0, params=source.params['params'], opt_state={}))
      saved.close()
      if source.tokenizer_json is not None:
        write_text_atomically(os.path.join(partial, TOKENIZER_FILE), source.tokenizer_json)
      write_json_atomically(os.path.join(partial, run_record.SUMMARY_FILE), dict(step=0, imported_from=source.path))
      if os.path.isdir(workdir):
        os.rmdir(workdir)  # empty (checked above)
      os.rename(partial, workdir)
    finally:
      if os.path.exists(partial):
        shutil.rmtree(partial, ignore_errors=True)


class _import_lock:  # pylint: disable=invalid-name  (a context manager, like open)
  """An exclusive flock on WORKDIR.importing.lock while the import writes; the file is removed by its holder when
  done. A second import finds it held and is refused at once; one that opened the file just before the holder
  removed it sees that its file is no longer the one at the path, and is refused too."""

  def __init__(self, workdir: str):
    self.path = workdir + '.importing.lock'

  def __enter__(self):
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    self.lock = exclusive_lock(self.path, f'--workdir: {self.path[:-len(".importing.lock")]}')
    try:
      self.lock.__enter__()
    except Busy as error:
      raise cli.CommandError(f'{error}; valid: one import to a workdir at a time') from None
    if not os.path.exists(self.path) or os.stat(self.path).st_ino != os.fstat(self.lock.file.fileno()).st_ino:
      self.lock.__exit__(None, None, None)
      raise cli.CommandError(f'--workdir: {self.path[:-len(".importing.lock")]} was being imported by another process '
                             'meanwhile; valid: a new directory')
    return self

  def __exit__(self, *exc):
    os.remove(self.path)
    self.lock.__exit__(*exc)


def main(argv):
  if len(argv) > 1:
    raise cli.CommandError(f'unexpected arguments: {" ".join(argv[1:])}; valid: --source, --corpus, --workdir')
  for flag, value, valid in (('--source', _SOURCE.value, 'a Hugging Face model folder or a .gguf file'),
                             ('--workdir', _WORKDIR.value, 'a new directory for the run')):
    if not value:
      raise cli.CommandError(f'{flag}: missing; valid: {valid}')
  workdir = _WORKDIR.value
  if os.path.exists(workdir) and (not os.path.isdir(workdir) or os.listdir(workdir)):
    held = run_record.stored_config(workdir) if os.path.isdir(workdir) else None
    what = f'a run of {held["source"]["path"]}' if held and 'source' in held else 'a run' if held else 'files'
    raise cli.CommandError(f'--workdir: {workdir} already holds {what}; valid: a new directory (a run is never '
                           'rewritten)')
  cli.check_output_path('--workdir', workdir, directory=True)
  try:
    source = read_source(_SOURCE.value)
  except PretrainedError as error:
    raise cli.CommandError(str(error)) from None
  corpus = _check_corpus(source, _CORPUS.value) if _CORPUS.value else ''
  record = run_record_of(source, corpus)
  write_run(source, record, workdir)
  tokenizer = (f', {TOKENIZER_FILE}' if source.tokenizer_json is not None else
               f' (its tokenizer is not read here: {source.tokenizer_refused})' if source.tokenizer_refused else
               ' (the source has no tokenizer)')
  print(f'{workdir}: {source.architecture} from {source.path} ({source.format}): {source.config.num_decoder_layers} '
        f'layers, width {source.config.model_dim}, {source.config.num_heads} heads over '
        f'{source.config.key_value_heads} key/value heads, vocabulary {source.config.vocab_size}, trained at '
        f'{source.context_length}; wrote config.json, checkpoints/0, summary.json{tokenizer}')
  print(json.dumps(record['model']['position'], sort_keys=True))
  print(f'corpus: {corpus}' if corpus else 'corpus: none; evaluate it with --corpus=DIR, a corpus prepared with its '
        'tokenizer')


if __name__ == '__main__':
  cli.run(main)
