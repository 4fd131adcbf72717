"""A corpus chosen for an evaluation, not for a model: any corpus prepared with the run's tokenizer scores the run
(experiments.evaluate --corpus=DIR, the probes, longrope_search, analyze). The run's tokenizer is its tokenizer.json
(an imported run), else its own corpus's; a corpus of another tokenizer is refused, naming both, and so is one
whose ids exceed the model's vocabulary. What the corpus is (its manifest's identity) then names the evaluation,
so two corpora's numbers never share a directory or a table row."""

import os
import re

import transformer
from experiments.data.corpus import open_corpus
from experiments.data.manifest import DataError

TOKENIZER_FILE = 'tokenizer.json'


def vocabulary(tokenizer) -> dict:
  """{token: id} of a corpus's tokenizer (experiments/data/corpus_tokenizer.py), or of a tokenizers.Tokenizer;
  the byte tokenizer as its 257 symbols."""
  inner = getattr(tokenizer, 'tokenizer', tokenizer)
  if hasattr(inner, 'get_vocab'):
    return inner.get_vocab(with_added_tokens=True)
  return {f'<byte {index}>': index for index in range(tokenizer.vocab_size)}


def run_tokenizer(workdir: str, resolved: dict):
  """(the run's {token: id} or None when it has no tokenizer, the --tokenizer that prepares a corpus of it, why it
  cannot be read or '')."""
  source = resolved.get('source') or {}
  if source.get('tokenizer_refused'):
    return None, source['path'], source['tokenizer_refused']
  path = os.path.join(workdir, TOKENIZER_FILE)
  if os.path.isfile(path):
    from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
    return Tokenizer.from_file(path).get_vocab(with_added_tokens=True), path, ''
  own = resolved['task'].get('path') or ''
  if resolved['task']['name'] == 'corpus' and own:
    try:
      opened = open_corpus(own)
    except DataError as error:
      return None, own, f'its own corpus cannot be read: {error}'
    kind = os.path.join(own, TOKENIZER_FILE) if os.path.isfile(os.path.join(own, TOKENIZER_FILE)) else 'bytes'
    return vocabulary(opened.tokenizer), kind, ''
  return None, '', ''


def how_to_prepare(tokenizer: str) -> str:
  return f'python -m experiments.prepare_corpus --input=TEXTS --output=DIR --tokenizer={tokenizer or "PATH"}'


def checked_corpus(workdir: str, resolved: dict, model: transformer.ModelConfig, corpus: str) -> str:
  """The corpus's absolute path once it is known to fit the run; ValueError naming what does not."""
  if resolved['task']['name'] != 'corpus' or resolved['task']['model_kind'] != 'decoder_only':
    raise ValueError(f'--corpus: {workdir} is a {resolved["task"]["name"]} run; valid: --corpus with a language model '
                     'of a prepared corpus\'s tokens (trained on one, or imported)')
  own, where, refused = run_tokenizer(workdir, resolved)
  return fitting_corpus(corpus, model.vocab_size, own, where, refused, how_to_prepare(where))


def fitting_corpus(corpus: str, vocab_size: int, own, where: str, refused: str, hint: str) -> str:
  """The corpus's absolute path when it was prepared with the tokenizer own ({token: id}, from where; None: the
  model has none to compare) and its ids fit vocab_size; ValueError naming what does not. refused: why the
  model's tokenizer could not be read ('' when it was, or there is none). hint: how to prepare a corpus that fits."""
  directory = os.path.abspath(corpus)
  try:
    opened = open_corpus(directory)
  except DataError as error:
    raise ValueError(f'--corpus: {error}') from None
  if refused:
    raise ValueError(f'--corpus: the model\'s tokenizer ({where}) cannot be compared with {corpus}\'s: {refused}; '
                     'valid: a model whose tokenizer this project reads')
  if own is not None:
    theirs = vocabulary(opened.tokenizer)
    differing = sum(1 for token in set(own) | set(theirs) if own.get(token) != theirs.get(token))
    if differing:
      raise ValueError(f'--corpus: {corpus} was prepared with another tokenizer ({opened.tokenizer.kind}, '
                       f'{opened.vocab_size} tokens) than the model\'s ({where}, {len(own)} tokens; {differing} '
                       f'differ); valid: a corpus prepared with the model\'s tokenizer ({hint})')
  if opened.vocab_size > vocab_size:
    raise ValueError(f'--corpus: {corpus} has a vocabulary of {opened.vocab_size} tokens, more than the model\'s '
                     f'{vocab_size}; valid: a corpus prepared with the model\'s tokenizer ({hint})')
  return directory


def corpus_label(directory: str, identity: str) -> str:
  """The corpus as a directory name's part: its folder's name and the first 8 hex digits of its identity."""
  name = re.sub(r'[^A-Za-z0-9_.-]+', '_', os.path.basename(os.path.normpath(directory)))[:40]
  return f'{name}-{identity[:8]}'
