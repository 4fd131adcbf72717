"""BLEU and chrF of a trained translation run, per source-length bucket, greedy and beam search.

  python -m experiments.translate --workdir=runs/translation [--split=eval] [--beam=4] \
      [--length_penalty=0.6] [--lengths=16,32,48] [--nocache]

Decodes every verse of the held-out split (the model writes every token itself), scores the
detokenised English against the reference with sacrebleu (corpus BLEU, 13a tokenisation, and chrF)
per evaluation length bucket of the task and over all of them, beside the copy baseline (the
Spanish source scored as if it were the translation). Prints a table and writes
WORKDIR/translation_scores.json and WORKDIR/translations_<split>.tsv (source, reference, greedy,
beam), each written whole or not at all.
"""

import os
import sys

import sacrebleu
from absl import app, flags

import transformer
from experiments import checkpoints, decoding
from experiments.files import write_json_atomically, write_text_atomically
from experiments.tasks.translation import Translation

_WORKDIR = flags.DEFINE_string('workdir', None, 'A training run of the translation task.')
_SPLIT = flags.DEFINE_enum('split', 'eval', ['eval', 'test'], 'Held-out books to translate.')
_BEAM = flags.DEFINE_integer('beam', 4, 'Beam size (1 would repeat greedy decoding).')
_LENGTH_PENALTY = flags.DEFINE_float('length_penalty', 0.6, 'alpha of ((5 + |y|) / 6) ** alpha.')
_LENGTHS = flags.DEFINE_string('lengths', None, "Buckets to decode, '16,32' (default: the task's eval_lengths).")
_CACHE = flags.DEFINE_bool('cache', True, "Decode through the decoder's key/value cache (--nocache reruns the "
                           'decoder on the whole prefix at every step: the same translations, slower).')


def scores(pairs: list[tuple[str, str]]) -> dict:
  hypotheses, references = [h for h, _ in pairs], [r for _, r in pairs]
  return dict(bleu=sacrebleu.corpus_bleu(hypotheses, [references]).score,
              chrf=sacrebleu.corpus_chrf(hypotheses, [references]).score, verses=len(pairs))


def main(argv):
  del argv
  try:
    if not _WORKDIR.value:
      raise ValueError('--workdir: missing; valid: a training run directory of the translation task')
    if _BEAM.value < 2:
      raise ValueError(f'--beam: got {_BEAM.value}; valid: 2 or more (greedy decoding is always reported)')
    config, task, params = checkpoints.load_run(_WORKDIR.value)
    if not isinstance(task, Translation):
      raise ValueError(f'--workdir: task {task.settings.name!r}; valid: a run of the translation task')
    lengths = decoding.parse_lengths(_LENGTHS.value) if _LENGTHS.value else sorted(task.settings.eval_lengths)
    unknown = [n for n in lengths if n not in task.settings.eval_lengths]
    if unknown:
      raise ValueError(f'--lengths: got {unknown[0]}; valid: the run\'s eval_lengths {task.settings.eval_lengths}')
  except (OSError, KeyError, ValueError) as error:
    print(f'error: {" ".join(str(error).split())}', file=sys.stderr)
    sys.exit(2)
  model = transformer.build_model(config, task.settings.model_kind)
  decoded, table = {}, {}
  print(f'{"source length":>14} {"verses":>7} {"BLEU greedy":>12} {"BLEU beam":>10} {"chrF greedy":>12} '
        f'{"chrF beam":>10} {"BLEU copy":>10}')
  for length in lengths:
    greedy = decoding.translations(task, model, params, _SPLIT.value, length, 1, 0.0, use_cache=_CACHE.value)
    beam = decoding.translations(task, model, params, _SPLIT.value, length, _BEAM.value, _LENGTH_PENALTY.value,
                                 use_cache=_CACHE.value)
    decoded[length] = [(source, reference, g, b) for (source, reference, g), (_, _, b) in zip(greedy, beam)]
    table[length] = row = _row(decoded[length])
    print(_line(f'<= {length}', row), flush=True)
  table['all'] = _row([entry for entries in decoded.values() for entry in entries])
  print(_line('all', table['all']))
  write_json_atomically(os.path.join(_WORKDIR.value, 'translation_scores.json'),
                        dict(split=_SPLIT.value, beam=_BEAM.value, length_penalty=_LENGTH_PENALTY.value,
                             buckets={str(k): v for k, v in table.items()}))
  lines = ['source\treference\tgreedy\tbeam'] + ['\t'.join(entry) for entries in decoded.values() for entry in entries]
  write_text_atomically(os.path.join(_WORKDIR.value, f'translations_{_SPLIT.value}.tsv'), '\n'.join(lines) + '\n')


def _row(entries) -> dict:
  if not entries:
    return dict(verses=0)
  greedy = scores([(g, r) for _, r, g, _ in entries])
  beam = scores([(b, r) for _, r, _, b in entries])
  copy = scores([(s, r) for s, r, _, _ in entries])
  return dict(verses=len(entries), greedy_bleu=greedy['bleu'], beam_bleu=beam['bleu'], greedy_chrf=greedy['chrf'],
              beam_chrf=beam['chrf'], copy_bleu=copy['bleu'], copy_chrf=copy['chrf'])


def _line(label: str, row: dict) -> str:
  if not row['verses']:
    return f'{label:>14} {0:>7}'
  return (f'{label:>14} {row["verses"]:>7} {row["greedy_bleu"]:>12.2f} {row["beam_bleu"]:>10.2f} '
          f'{row["greedy_chrf"]:>12.2f} {row["beam_chrf"]:>10.2f} {row["copy_bleu"]:>10.2f}')


if __name__ == '__main__':
  app.run(main)
