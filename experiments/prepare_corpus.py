"""Prepares a user's text for the `corpus` task: documents, a held-out split by document, token ids on disk.

  python -m experiments.prepare_corpus --input=my_texts/ --output=corpora/mine --tokenizer=bpe --vocab_size=8192
  python -m experiments.train --config=configs/corpus.py --config.task.path=corpora/mine --workdir=runs/mine

--input (repeatable) names files, folders (read at any depth) or globs of .txt and .jsonl files, plain or
.gz/.xz compressed, and of Parquet files (FineWeb's, RedPajama's, any dataset of the Hugging Face hub). A
document is a whole .txt file (or each piece between --separator's occurrences), each .jsonl line's
--text_field, or each Parquet row's --text_field column (read with pyarrow a row group at a time). Each document goes to the held-out split when the SHA-256 of its text,
read as a fraction of 2^64, is below --heldout_fraction: adding documents never moves others.

--tokenizer=bytes needs no training; --tokenizer=bpe trains a byte-level BPE of --vocab_size tokens with
Hugging Face tokenizers on the first --tokenizer_sample_bytes of training documents; --tokenizer=PATH takes a
pretrained model's own BPE (byte-level, or SentencePiece's pieces with byte fallback: Gemma, Llama 2; BOS before each
document where its template starts with one), from its tokenizer.json or its GGUF file, so that the model is scored in
bits per byte on this text (its <|endoftext|>, <|end_of_text|>, <eos> or </s> token is the EOD). Documents are then
streamed through it (memory holds one batch of documents) into train.bin and heldout.bin with EOD after
each; manifest.json records the inputs and their SHA-256, the tokenizer's, the counts and the command
(experiments/data/corpus.py describes the folder). Everything is written to a temporary folder beside
--output and renamed to it at the end, so a stopped or failed prepare leaves no corpus behind; the same
inputs and flags give byte-identical files.
"""

import os
import shlex
import sys

from absl import flags

from experiments.data import corpus as corpus_format
from experiments.data import corpus_writer
from experiments.data import documents as documents_lib
from experiments.data.corpus_tokenizer import KINDS, LARGEST_BPE, SMALLEST_BPE, BpeTokenizer, ByteTokenizer
from experiments.pretrained import gguf_file
from experiments.shared import cli
from experiments.shared.files import sha256_of_file

_INPUT = flags.DEFINE_multi_string('input', None, 'A file, folder or glob of .txt/.jsonl (.gz/.xz) text or .parquet; '
                                   'repeatable.')
_OUTPUT = flags.DEFINE_string('output', None, 'The folder to write (new, or empty).')
_TOKENIZER = flags.DEFINE_string('tokenizer', 'bpe', f'One of {", ".join(KINDS)}, or the path of a pretrained model\'s '
                                 'tokenizer.json or GGUF file.')
_VOCAB_SIZE = flags.DEFINE_integer('vocab_size', 8192, 'BPE vocabulary size, EOD included.')
_HELDOUT = flags.DEFINE_float('heldout_fraction', 0.05, 'The fraction of documents held out, by hash of their text.')
_SEPARATOR = flags.DEFINE_string('separator', '', 'Split .txt files into documents on this string (Python escapes '
                                 'such as \\n are read); empty: one document per file.')
_TEXT_FIELD = flags.DEFINE_string('text_field', 'text', 'The field of each .jsonl line, or the Parquet column, that '
                                  'holds the text.')
_ERRORS = flags.DEFINE_string('errors', 'strict', 'strict: refuse text that is not UTF-8; replace: replace it.')
_DTYPE = flags.DEFINE_string('dtype', 'auto', 'Token id dtype: auto (uint16 when the vocabulary fits), uint16, uint32.')
_SAMPLE = flags.DEFINE_integer('tokenizer_sample_bytes', 100_000_000, 'BPE: train on the first this many bytes of '
                               'training documents.')


def _separator(text: str) -> str:
  try:
    return text.encode('latin-1', 'backslashreplace').decode('unicode_escape')
  except UnicodeDecodeError as error:
    raise cli.CommandError(f'--separator: got {text!r}, whose escapes do not decode ({error.reason}); valid: text '
                           f'with Python escapes such as \\n') from None


def _dtype(requested: str, vocab_size: int) -> str:
  if requested not in ('auto', *corpus_format.DTYPES):
    raise cli.CommandError(f'--dtype: got {requested!r}; valid: auto, {", ".join(corpus_format.DTYPES)}')
  fits = vocab_size <= 1 << 16
  if requested == 'uint16' and not fits:
    raise cli.CommandError(f'--dtype: got \'uint16\', but a vocabulary of {vocab_size} tokens needs ids up to '
                           f'{vocab_size - 1} > 65535; valid: uint32 or auto (or --vocab_size at most 65536)')
  return requested if requested != 'auto' else ('uint16' if fits else 'uint32')


def pretrained_tokenizer(path: str) -> dict:
  """{'text': tokenizer.json's text, 'path', 'sha256' of the file} of a pretrained model's BPE (byte-level, or
  SentencePiece's pieces with byte fallback): its tokenizer.json, or rebuilt from its GGUF file's metadata."""
  if not os.path.isfile(path):
    raise cli.CommandError(f'--tokenizer: got {path!r}, neither a file nor one of {", ".join(KINDS)}; valid: '
                           f'{", ".join(KINDS)}, or a pretrained model\'s tokenizer.json or .gguf file')
  try:
    if path.endswith('.gguf'):
      from gguf import GGUFReader  # pylint: disable=g-import-not-at-top
      text = gguf_file.tokenizer_json(GGUFReader(path))
    else:
      with open(path, encoding='utf-8') as file:
        text = file.read()
    BpeTokenizer.from_str(text)
  except Exception as error:  # pylint: disable=broad-except  (tokenizers and gguf raise their own types)
    raise cli.CommandError(f'--tokenizer: {path}: {" ".join(str(error).split())[:240]}; valid: the tokenizer.json '
                           f'of a byte-level BPE or of SentencePiece\'s pieces with byte fallback, or a GGUF file of '
                           f'one') from None
  return dict(text=text, path=os.path.abspath(path), sha256=sha256_of_file(path))


def check_flags() -> dict:
  """Every flag, checked before anything is read or written."""
  if not _INPUT.value:
    raise cli.CommandError('--input: missing; valid: a file, folder or glob of .txt/.jsonl text or .parquet '
                           '(repeatable)')
  if not _OUTPUT.value:
    raise cli.CommandError('--output: missing; valid: a new or empty folder to write the corpus to')
  output = _OUTPUT.value
  cli.check_output_path('--output', output, directory=True)
  if os.path.isdir(output) and os.listdir(output):
    raise cli.CommandError(f'--output: got {output!r}, a folder that is not empty; valid: a new or empty folder '
                           f'(a prepared corpus is never rewritten)')
  pretrained = _TOKENIZER.value not in KINDS and pretrained_tokenizer(_TOKENIZER.value)
  vocab_size = (ByteTokenizer.vocab_size if _TOKENIZER.value == 'bytes' else
                BpeTokenizer.from_str(pretrained['text']).vocab_size if pretrained else _VOCAB_SIZE.value)
  if _TOKENIZER.value == 'bpe' and not SMALLEST_BPE <= vocab_size <= LARGEST_BPE:
    raise cli.CommandError(f'--vocab_size: got {vocab_size}; valid: {SMALLEST_BPE} (the bytes and EOD) to {LARGEST_BPE} '
                           f'(2^20, four times the largest vocabularies in use: the BPE trainer\'s memory grows with '
                           f'it)')
  if not 0.0 < _HELDOUT.value < 1.0:
    raise cli.CommandError(f'--heldout_fraction: got {_HELDOUT.value}; valid: a fraction strictly between 0 and 1')
  if _ERRORS.value not in documents_lib.ERRORS:
    raise cli.CommandError(f'--errors: got {_ERRORS.value!r}; valid: {", ".join(documents_lib.ERRORS)}')
  if _SAMPLE.value < 1:
    raise cli.CommandError(f'--tokenizer_sample_bytes: got {_SAMPLE.value}; valid: a positive number of bytes')
  if not _TEXT_FIELD.value:
    raise cli.CommandError('--text_field: empty; valid: the name of the .jsonl field or Parquet column that holds the '
                           'text')
  if pretrained and _VOCAB_SIZE.present:
    raise cli.CommandError(f'--vocab_size: got {_VOCAB_SIZE.value} with --tokenizer={_TOKENIZER.value}, whose '
                           f'vocabulary is {vocab_size}; valid: --vocab_size only with --tokenizer=bpe')
  return dict(output=output, tokenizer='pretrained' if pretrained else _TOKENIZER.value, pretrained=pretrained or None,
              vocab_size=vocab_size, dtype=_dtype(_DTYPE.value, vocab_size),
              heldout_fraction=_HELDOUT.value, separator=_separator(_SEPARATOR.value), text_field=_TEXT_FIELD.value,
              errors=_ERRORS.value, tokenizer_sample_bytes=_SAMPLE.value)


def main(argv):
  if len(argv) > 1:
    raise cli.CommandError(f'unexpected arguments: {" ".join(argv[1:])}; valid: flags only (--input, --output, ...)')
  settings = check_flags()
  try:
    files = documents_lib.find_files(_INPUT.value)
  except documents_lib.InputError as error:
    raise cli.CommandError(str(error)) from None
  command = ' '.join(['python -m experiments.prepare_corpus', *map(shlex.quote, sys.argv[1:])])
  try:
    corpus_writer.prepare(files, dict(settings, inputs=_INPUT.value), command)
  except documents_lib.InputError as error:
    raise cli.CommandError(str(error)) from None


if __name__ == '__main__':
  cli.run(main)
