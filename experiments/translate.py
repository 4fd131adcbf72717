"""BLEU and chrF of trained translation runs, per source-length bucket, greedy and beam search.

  python -m experiments.translate --workdir=runs/translation [--split=eval] [--beam=4] \
      [--length_penalty=0.6] [--lengths=16,32,48] [--nocache]
  python -m experiments.translate --sweep=runs/compare-translation [same options]

Decodes every verse of the held-out split (the model writes every token itself), scores the
detokenised English against the reference with sacrebleu (corpus BLEU, 13a tokenisation, and chrF)
per evaluation length bucket of the task and over all of them, beside the copy baseline (the
Spanish source scored as if it were the translation). Prints a table and writes
WORKDIR/translation_scores.json and WORKDIR/translations_<split>.tsv (source, reference, greedy,
beam), each written whole or not at all.

--sweep does this for every finished run of an experiments.compare sweep (its <variant>-seed<k>
directories), skipping runs already scored with the same options, and writes
SWEEP/translation_scores.md: BLEU greedy / beam per run and bucket, the runs side by side.
"""

import json
import os

import sacrebleu
from absl import flags

import transformer
from experiments.runs import checkpoints
from experiments.evaluation import decoding
from experiments.shared import cli
from experiments.sweeps import results
from experiments.shared.files import write_json_atomically, write_text_atomically
from experiments.tasks.translation import Translation

_WORKDIR = flags.DEFINE_string('workdir', None, 'A training run of the translation task.')
_SWEEP = flags.DEFINE_string('sweep', None, 'An experiments.compare sweep of the translation task: every '
                             'finished run in it.')
_SPLIT = flags.DEFINE_enum('split', 'eval', ['eval', 'test'], 'Held-out books to translate.')
_BEAM = flags.DEFINE_integer('beam', 4, 'Beam size (1 would repeat greedy decoding).')
_LENGTH_PENALTY = flags.DEFINE_float('length_penalty', 0.6, 'alpha of ((5 + |y|) / 6) ** alpha.')
_LENGTHS = flags.DEFINE_string('lengths', None, "Buckets to decode, '16,32' (default: the task's eval_lengths).")
_CACHE = flags.DEFINE_bool('cache', True, "Decode through the decoder's key/value cache (--nocache reruns the "
                           'decoder on the whole prefix at every step: the same translations, slower).')
SCORES_FILE = 'translation_scores.json'


def scores(pairs: list[tuple[str, str]]) -> dict:
  hypotheses, references = [h for h, _ in pairs], [r for _, r in pairs]
  return dict(bleu=sacrebleu.corpus_bleu(hypotheses, [references]).score,
              chrf=sacrebleu.corpus_chrf(hypotheses, [references]).score, verses=len(pairs))


def load(workdir: str):
  """(config, task, params, buckets) of a translation run; a ValueError names what is wrong."""
  config, task, params = checkpoints.load_run(workdir)
  if not isinstance(task, Translation):
    raise ValueError(f'--workdir: task {task.settings.name!r} in {workdir}; valid: a run of the translation task')
  config, note = checkpoints.core_for(config, decoding=True)
  if note:
    print(f'{workdir}: {note}')
  lengths = decoding.parse_lengths(_LENGTHS.value) if _LENGTHS.value else sorted(task.settings.eval_lengths)
  unknown = [n for n in lengths if n not in task.settings.eval_lengths]
  if unknown:
    raise ValueError(f'--lengths: got {unknown[0]}; valid: the run\'s eval_lengths {task.settings.eval_lengths}')
  return config, task, params, lengths


def options(lengths) -> dict:
  return dict(split=_SPLIT.value, beam=_BEAM.value, length_penalty=_LENGTH_PENALTY.value, lengths=list(lengths))


def score_run(workdir: str, config, task, params, lengths) -> dict:
  """Decodes and scores one run's buckets, prints its table, writes its scores and translations."""
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
  payload = dict(options(lengths), buckets={str(k): v for k, v in table.items()})
  write_json_atomically(os.path.join(workdir, SCORES_FILE), payload)
  lines = ['source\treference\tgreedy\tbeam'] + ['\t'.join(entry) for entries in decoded.values() for entry in entries]
  write_text_atomically(os.path.join(workdir, f'translations_{_SPLIT.value}.tsv'), '\n'.join(lines) + '\n')
  print(f'wrote {os.path.join(workdir, SCORES_FILE)}, {os.path.join(workdir, f"translations_{_SPLIT.value}.tsv")}')
  return payload


def scored_before(workdir: str, lengths) -> dict | None:
  """The run's scores file when it was written with these options, else None."""
  path = os.path.join(workdir, SCORES_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as file:
    payload = json.load(file)
  same = all(payload.get(key) == value for key, value in options(lengths).items())
  return payload if same else None


def sweep_table(payloads: dict) -> str:
  """Markdown: a row per run, BLEU greedy / beam per bucket and over all of them."""
  buckets = sorted({key for p in payloads.values() for key in p['buckets'] if key != 'all'}, key=int) + ['all']
  header = ['run'] + [f'<= {b}' if b != 'all' else 'all' for b in buckets]
  lines = [f'BLEU greedy / beam {_BEAM.value} on the {_SPLIT.value} books by source length in pieces (the bucket '
           '<= N holds the verses longer than the bucket before it, up to N)',
           '', '| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
  for name, payload in payloads.items():
    cells = []
    for bucket in buckets:
      row = payload['buckets'].get(bucket, {})
      cells.append(f'{row["greedy_bleu"]:.1f} / {row["beam_bleu"]:.1f}' if row.get('verses') else '-')
    lines.append('| ' + ' | '.join([name] + cells) + ' |')
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  if bool(_WORKDIR.value) == bool(_SWEEP.value):
    cli.fail('--workdir / --sweep: give one; valid: a training run of the translation task (--workdir) or an '
         'experiments.compare sweep of it (--sweep)')
  if _BEAM.value < 2:
    cli.fail(f'--beam: got {_BEAM.value}; valid: 2 or more (greedy decoding is always reported)')
  if _WORKDIR.value:
    try:
      loaded = load(_WORKDIR.value)
    except (OSError, KeyError, ValueError) as error:
      cli.fail(str(error))
    score_run(_WORKDIR.value, *loaded)
    return
  if not os.path.isdir(_SWEEP.value):
    cli.fail(f'--sweep: {_SWEEP.value} is not a directory; valid: the --workdir of an experiments.compare sweep')
  runs = sorted(name for name in os.listdir(_SWEEP.value)
                if results.finished(os.path.join(_SWEEP.value, name)))
  if not runs:
    cli.fail(f'--sweep: no finished run in {_SWEEP.value}; valid: a sweep with <variant>-seed<k> runs that finished')
  payloads, loaded = {}, {}
  for name in runs:  # every run checked before any is decoded
    try:
      loaded[name] = load(os.path.join(_SWEEP.value, name))
    except (OSError, KeyError, ValueError) as error:
      cli.fail(str(error))
  for name in runs:
    workdir = os.path.join(_SWEEP.value, name)
    config, task, params, lengths = loaded[name]
    payloads[name] = scored_before(workdir, lengths)
    print(f'{name}: {"scored before, with the same options" if payloads[name] else "decoding"}', flush=True)
    if payloads[name] is None:
      payloads[name] = score_run(workdir, config, task, params, lengths)
  table = sweep_table(payloads)
  write_text_atomically(os.path.join(_SWEEP.value, 'translation_scores.md'), table)
  print(table)
  print(f'wrote {os.path.join(_SWEEP.value, "translation_scores.md")}')


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
  cli.run(main)
