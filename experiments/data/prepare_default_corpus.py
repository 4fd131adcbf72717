"""Builds experiments/data/corpus/, the corpus configs/corpus.py trains on as shipped, from text the
repository already ships (nothing is downloaded):

  python -m experiments.data.prepare_default_corpus

Documents: each of Shakespeare's 42 works (experiments/data/shakespeare/), and each book of the King
James Bible and of the Reina-Valera 1909 (experiments/data/bible/, decoded from its subword pieces, one
verse per line under a 'Book chapter' heading per chapter). They are written as .txt files under a
scratch folder and prepared there by experiments.prepare_corpus with the flags below (relative paths, so
the manifest's command is the same on every machine), then moved to experiments/data/corpus/.

  python -m experiments.data.prepare_default_corpus --tokenizer=MODEL.gguf --output=corpora/shipped-MODEL

prepares the same documents, split the same way, with a pretrained model's own tokenizer (its tokenizer.json or
GGUF file; experiments/prepare_corpus.py), for scoring that model on them in bits per byte.
"""

import os
import shutil
import subprocess
import sys
import tempfile

from absl import flags

from experiments.data import bible, shakespeare
from experiments.shared import cli

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where `experiments` is
FLAGS = ('--input=documents', '--output=corpus', '--tokenizer=bpe', '--vocab_size=4096', '--heldout_fraction=0.1')


def documents() -> dict[str, str]:
  """{relative file name: text} of every document."""
  found = {}
  for split in ('train', 'heldout'):
    _, vocabulary = shakespeare.load(split)
    for name, ids in shakespeare.works(split).items():
      found[f'shakespeare/{name}.txt'] = ''.join(vocabulary[i] for i in ids)
  verses, pieces = bible.load()
  books = {}
  for split in ('train', 'eval', 'test'):
    for book, chapter, verse, spanish, english in verses[split]:
      for language, ids in (('english', english), ('spanish', spanish)):
        lines = books.setdefault((language, book), {})
        lines.setdefault(chapter, []).append(f'{verse} {bible.detokenize(ids, pieces)}')
  for (language, book), chapters in books.items():
    text = '\n\n'.join(f'{book} {chapter}\n' + '\n'.join(lines) for chapter, lines in sorted(chapters.items()))
    found[f'bible-{language}/{book.replace(" ", "_")}.txt'] = text + '\n'
  return found


_OUTPUT = flags.DEFINE_string('output', OUTPUT, 'The folder to write (must not exist).')
_TOKENIZER = flags.DEFINE_string('tokenizer', '', 'A pretrained model\'s tokenizer.json or GGUF file (default: the '
                                 'shipped BPE of 4096 tokens, trained on the documents).')


def main(argv):
  if len(argv) > 1:
    raise cli.CommandError(f'unexpected arguments: {" ".join(argv[1:])}; valid: --output, --tokenizer')
  arguments = FLAGS
  if _TOKENIZER.value:
    if not os.path.isfile(_TOKENIZER.value):
      raise cli.CommandError(f'--tokenizer: got {_TOKENIZER.value!r}, which is not a file; valid: a tokenizer.json '
                             'or .gguf file')
    arguments = tuple(flag for flag in FLAGS if not flag.startswith(('--tokenizer=', '--vocab_size=')))
    arguments += (f'--tokenizer={os.path.abspath(_TOKENIZER.value)}',)
  output = os.path.abspath(_OUTPUT.value)
  if os.path.exists(output):
    raise cli.CommandError(f'--output: {output} exists; valid: a new folder (a prepared corpus is never rewritten)')
  with tempfile.TemporaryDirectory() as scratch:
    for name, text in documents().items():
      path = os.path.join(scratch, 'documents', name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w', encoding='utf-8') as file:
        file.write(text)
    subprocess.run([sys.executable, '-m', 'experiments.prepare_corpus', *arguments], cwd=scratch, check=True,
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')])))
    shutil.move(os.path.join(scratch, 'corpus'), output)
  print(f'wrote {output}')


if __name__ == '__main__':
  cli.run(main)
