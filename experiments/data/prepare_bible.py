"""Builds experiments/data/bible/ from two Debian packages of SWORD Bible modules (run once; the
repository ships the result, so nothing is downloaded at run time).

  apt-get download sword-text-sparv sword-text-kjv     # Reina-Valera 1909 and the King James Version
  pip install pysword==0.2.8 sentencepiece==0.2.3      # needed by this script only
  python -m experiments.data.prepare_bible --spanish=sword-text-sparv_2.60-1_all.deb \
      --english=sword-text-kjv_14.3-1_all.deb

Both modules use the KJV versification, so verse (book, chapter, verse) of one is verse (book,
chapter, verse) of the other, except in the five chapters of SHIFTED_CHAPTERS, where the Spanish
module keeps the Spanish numbering (realigned here, see realign). Writes:
  verses.tsv.xz   book, chapter, verse, Spanish ids, English ids (space-separated subword ids), one
                  line per verse present and non-empty in both, in canonical order
  manifest.json   the packages and their sha256, the pieces of the vocabulary (id -> piece), the
                  book of every split, counts, each file's sha256, the licences
The vocabulary is one joint byte-pair model (sentencepiece, VOCABULARY_SIZE pieces, trained on the
training books only) whose pieces are stored in the manifest, so the experiments decode ids back
to text without sentencepiece: join the pieces and turn U+2581 into spaces.
"""

import argparse
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile

from experiments.shared.files import sha256_of_file, write_text_atomically, write_xz_atomically

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'bible')
VOCABULARY_SIZE = 4000
MODULES = {'spanish': 'spaRV1909eb', 'english': 'engKJV2006eb'}
# Held-out books: short, self-contained, with few parallel passages elsewhere in the Bible.
SPLITS = {'eval': ('Ruth', 'Jonah', 'James', 'I Peter'), 'test': ('Esther', 'Micah', 'Philippians', 'I John')}  # pysword's names
SPECIAL_PIECES = ('<pad>', '<s>', '</s>', '<unk>')  # ids 0-3: PAD, BOS, EOS, UNK
# Chapters whose first KJV verse is the last verse of the previous chapter in Spanish Bibles (e.g.
# KJV Jonah 1:17 is Reina-Valera Jonah 2:1). In these the Spanish module leaves the previous chapter's
# last verse empty, runs one verse ahead through the chapter and joins its last two verses in one.
# Found by comparing the lengths of every chapter's verses shifted by -1, 0 and +1.
SHIFTED_CHAPTERS = (('Numbers', 13), ('Numbers', 30), ('I Samuel', 24), ('Hosea', 12), ('Jonah', 2))


def deb_members(path: str) -> dict:
  """The members of a Debian package (an ar archive): name -> bytes."""
  with open(path, 'rb') as file:
    data = file.read()
  if not data.startswith(b'!<arch>\n'):
    raise ValueError(f'{path}: not a Debian package (no ar header)')
  members, offset = {}, 8
  while offset + 60 <= len(data):
    header = data[offset:offset + 60]
    name, size = header[:16].decode().strip().rstrip('/'), int(header[48:58].decode().strip())
    members[name] = data[offset + 60:offset + 60 + size]
    offset += 60 + size + (size % 2)
  return members


def extract(deb: str, directory: str) -> None:
  members = deb_members(deb)
  archive = [name for name in members if name.startswith('data.tar')]
  with tarfile.open(fileobj=io.BytesIO(members[archive[0]])) as tar:
    tar.extractall(directory, filter='data')


def clean(text: str) -> str:
  return re.sub(r'\s+', ' ', text.replace('\u00b6', ' ')).strip()


def read_verses(sword_root: str) -> list[tuple]:
  """(book, chapter, verse, spanish, english) for every verse both modules have."""
  from pysword.canons import canons  # pylint: disable=g-import-not-at-top
  from pysword.modules import SwordModules  # pylint: disable=g-import-not-at-top
  modules = SwordModules(sword_root)
  modules.parse_modules()
  bibles = {language: modules.get_bible_from_module(name) for language, name in MODULES.items()}
  verses = []
  for testament in ('ot', 'nt'):
    for book, _, reference, chapter_sizes in canons['kjv'][testament]:
      references = [(chapter, number) for chapter, size in enumerate(chapter_sizes, start=1)
                    for number in range(1, size + 1)]
      texts = {language: list(bible.get_iter(books=[reference], clean=True)) for language, bible in bibles.items()}
      if any(len(found) != len(references) for found in texts.values()):
        raise ValueError(f'{book}: {[len(t) for t in texts.values()]} verses; the KJV canon has {len(references)}')
      pairs = realign(book, references, [clean(t) for t in texts['spanish']], [clean(t) for t in texts['english']])
      verses += [(book, chapter, number, spanish, english) for chapter, number, spanish, english in pairs
                 if spanish and english]
  return verses


def realign(book: str, references: list, spanish: list, english: list) -> list[tuple]:
  """(chapter, verse, spanish, english) of one book, the texts given in the order of references.
  In a chapter c of SHIFTED_CHAPTERS with n verses the Spanish of KJV (c-1, last) is the module's
  (c, 1), that of KJV (c, v) is the module's (c, v+1) for v < n - 1, and the module's (c, n), two
  Spanish verses, pairs with KJV (c, n-1) and (c, n) joined, numbered n - 1."""
  spanish_at = dict(zip(references, spanish))
  english_at = dict(zip(references, english))
  for shifted_book, chapter in SHIFTED_CHAPTERS:
    if shifted_book != book:
      continue
    last = max(number for c, number in references if c == chapter)
    previous = max(number for c, number in references if c == chapter - 1)
    if spanish_at[(chapter - 1, previous)]:
      raise ValueError(f'{book} {chapter - 1}:{previous}: Spanish text where the shifted numbering leaves none')
    spanish_at[(chapter - 1, previous)] = spanish_at[(chapter, 1)]
    for number in range(1, last):
      spanish_at[(chapter, number)] = spanish_at[(chapter, number + 1)]
    english_at[(chapter, last - 1)] = f'{english_at[(chapter, last - 1)]} {english_at[(chapter, last)]}'
    spanish_at[(chapter, last)] = english_at[(chapter, last)] = ''
  return [(chapter, number, spanish_at[(chapter, number)], english_at[(chapter, number)])
          for chapter, number in references]


def split_of(book: str) -> str:
  return next((split for split, books in SPLITS.items() if book in books), 'train')


def train_vocabulary(texts: list[str], directory: str) -> tuple:
  """(the trained sentencepiece processor, its pieces by id)."""
  import sentencepiece  # pylint: disable=g-import-not-at-top
  corpus = os.path.join(directory, 'corpus.txt')
  with open(corpus, 'w', encoding='utf-8') as file:
    file.write('\n'.join(texts) + '\n')
  prefix = os.path.join(directory, 'bpe')
  sentencepiece.SentencePieceTrainer.train(
      input=corpus, model_prefix=prefix, vocab_size=VOCABULARY_SIZE, model_type='bpe', character_coverage=1.0,
      pad_id=0, bos_id=1, eos_id=2, unk_id=3, normalization_rule_name='identity', num_threads=2,
      minloglevel=2)
  processor = sentencepiece.SentencePieceProcessor(model_file=prefix + '.model')
  return processor, [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--spanish', required=True, help='sword-text-sparv_<version>_all.deb')
  parser.add_argument('--english', required=True, help='sword-text-kjv_<version>_all.deb')
  parser.add_argument('--output', default=OUTPUT)
  args = parser.parse_args()
  os.makedirs(args.output, exist_ok=True)
  with tempfile.TemporaryDirectory() as scratch:
    for deb in (args.spanish, args.english):
      extract(deb, scratch)
    verses = read_verses(os.path.join(scratch, 'usr', 'share', 'sword'))
    missing = {book for books in SPLITS.values() for book in books} - {verse[0] for verse in verses}
    if missing:
      raise ValueError(f'held-out books not in the modules: {sorted(missing)}')
    training = [text for book, _, _, spanish, english in verses if split_of(book) == 'train'
                for text in (spanish, english)]
    processor, pieces = train_vocabulary(training, scratch)
  if tuple(pieces[:4]) != SPECIAL_PIECES:
    raise ValueError(f'unexpected special pieces {pieces[:4]}')
  lines, counts = [], {split: 0 for split in ('train', 'eval', 'test')}
  for book, chapter, number, spanish, english in verses:
    ids = [' '.join(map(str, processor.encode(text))) for text in (spanish, english)]
    lines.append(f'{book}\t{chapter}\t{number}\t{ids[0]}\t{ids[1]}')
    counts[split_of(book)] += 1
  path = os.path.join(args.output, 'verses.tsv.xz')
  write_xz_atomically(path, '\n'.join(lines) + '\n', 'utf-8')
  manifest = dict(
      rebuild='python -m experiments.data.prepare_bible --spanish=<sword-text-sparv .deb> '
              '--english=<sword-text-kjv .deb> (apt-get download sword-text-sparv sword-text-kjv)',
      description='Reina-Valera 1909 (Spanish) and King James Version (English), aligned verse by verse '
                  '(in the KJV versification, SHIFTED_CHAPTERS realigned); ids of a joint BPE vocabulary trained '
                  'on the training books',
      sources={language: f'{os.path.basename(deb)} (sha256 {sha256_of_file(deb)}): SWORD module {MODULES[language]}'
               for language, deb in (('spanish', args.spanish), ('english', args.english))},
      licence='public domain (both texts; Debian packaging of the SWORD modules)',
      splits={split: list(books) for split, books in SPLITS.items()}, verses=counts,
      verses_file=dict(file='verses.tsv.xz', sha256=sha256_of_file(path)),
      pieces=pieces, pieces_sha256=hashlib.sha256('\n'.join(pieces).encode('utf-8')).hexdigest())
  write_text_atomically(os.path.join(args.output, 'manifest.json'), json.dumps(manifest, indent=1, ensure_ascii=False) + '\n')


if __name__ == '__main__':
  main()
