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

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from experiments.data import bible, shakespeare

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


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--output', default=OUTPUT)
  parser.add_argument('--tokenizer', default='', help="a pretrained model's tokenizer.json or GGUF file (default: "
                      'the shipped BPE of 4096 tokens, trained on the documents)')
  args = parser.parse_args()
  flags = FLAGS
  if args.tokenizer:
    if not os.path.isfile(args.tokenizer):
      sys.exit(f'error: --tokenizer: got {args.tokenizer!r}, which is not a file; valid: a tokenizer.json or .gguf')
    flags = tuple(flag for flag in FLAGS if not flag.startswith(('--tokenizer=', '--vocab_size=')))
    flags += (f'--tokenizer={os.path.abspath(args.tokenizer)}',)
  if os.path.exists(args.output):
    sys.exit(f'error: {args.output} exists; remove it first (a prepared corpus is never rewritten)')
  with tempfile.TemporaryDirectory() as scratch:
    for name, text in documents().items():
      path = os.path.join(scratch, 'documents', name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w', encoding='utf-8') as file:
        file.write(text)
    subprocess.run([sys.executable, '-m', 'experiments.prepare_corpus', *flags], cwd=scratch, check=True,
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')])))
    shutil.move(os.path.join(scratch, 'corpus'), args.output)
  print(f'wrote {args.output}')


if __name__ == '__main__':
  main()
