"""LongRoPE's rescale factors searched for finished RoPE runs, scored by our own evaluation.

  python -m experiments.longrope_search --workdir=runs/shakespeare/rope-seed0,runs/shakespeare/rope-seed1 \
      --factor=16 --output=runs/longrope-x16 [--length=2048] [--tokens=16384] [--population=16] [--generations=6]

searches the long factors lambda_1 .. lambda_P of rope_extension=longrope (the evolution of Ding et al.
2024, experiments/evaluation/factor_search.py) for runs of one configuration (seeds of one run), the score of
a candidate being the runs' mean bits per character (bits per byte for a corpus) at --length (default: the
original length times --factor), over non-overlapping windows of the last --tokens tokens of the held-out
stream. The search never reads the first half of that stream, where experiments.evaluate scores (its
--tokens counts from the start), so the factors are not chosen on the text they are reported on.

For a run of a task that draws its own problems (copy, reverse, ...), a candidate's score is the runs' mean
cross-entropy on problems of --length (default: the original length times --factor) from --batches
evaluation batches of each run's seed (default: as many as the trainer evaluates on), drawn after the
trainer's own evaluation batches, which experiments.evaluate scores: again the factors are not chosen on
the problems they are reported on.

  python -m experiments.longrope_search --workdir=runs/copy/rope-seed0,runs/copy/rope-seed1 --factor=4 \
      --output=runs/longrope-copy-x4 [--batches=8]

--set=short searches the short set instead, for runs fine-tuned with longrope (whose long set it keeps): a
candidate is scored at --length within the original length (default: the original length; a task's trained
problem size) with the set chosen by length, Hugging Face's rule, which serves such lengths the short set.
The first population holds factors of 1 (RoPE as trained) and the run's long set.

  python -m experiments.longrope_search --workdir=runs/ft/rope-seed0,runs/ft/rope-seed1 --factor=16 --set=short \
      --output=runs/longrope-x16-short

--output (a new directory) gets search.jsonl, every candidate as it is scored (its generation, origin and
score), and at the end config.json: a Hugging Face config whose rope_scaling is LongRoPE's (the long
factors found and short factors 1: RoPE as trained up to the original length; or with --set=short the
short factors found and the run's long ones), with what was searched under "longrope_search". Evaluate
with it (with --position=longrope_by_length=true for a short set):

  python -m experiments.evaluate --workdir=... --extension=longrope --factor=16 \
      --rope_scaling=runs/longrope-x16/config.json --lengths=128,256,512,1024,2048
"""

import dataclasses
import json
import os
import time

from absl import flags

from experiments.runs import checkpoints
from experiments.evaluation import factor_search, long_context, rope_scaling
from experiments.shared import cli, xla_cpu
from experiments.shared.files import append_line_durably, write_json_atomically

_WORKDIR = flags.DEFINE_string('workdir', None, 'Comma-separated finished runs of one configuration (its seeds) of '
                               'a RoPE language model (rope, xpos or p_rope).')
_FACTOR = flags.DEFINE_float('factor', None, 'The factor s > 1: the length served over the original one.')
_LENGTH = flags.DEFINE_integer('length', None, 'The window length scored (default: the original length times '
                               '--factor).')
_TOKENS = flags.DEFINE_integer('tokens', 16384, 'Score the last this many tokens of the held-out stream (at most '
                               'half of it; language models).')
_BATCHES = flags.DEFINE_integer('batches', None, 'A task run: score this many evaluation batches per run, after the '
                                'trainer\'s own (default: as many as the trainer evaluates on).')
_POPULATION = flags.DEFINE_integer('population', 16, 'Candidates per generation.')
_GENERATIONS = flags.DEFINE_integer('generations', 6, 'Generations after the first population.')
_MUTATION_RATE = flags.DEFINE_float('mutation_rate', 0.3, 'The chance that a factor of a child is mutated.')
_MUTATION_SCALE = flags.DEFINE_float('mutation_scale', 0.1, 'The standard deviation of a mutation\'s log-factor.')
_SEED = flags.DEFINE_integer('seed', 0, 'The search\'s random seed.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 8, 'Windows per batch.', lower_bound=1)
_CORPUS = flags.DEFINE_string('corpus', '', 'A language model: score this corpus (prepared with the runs\' tokenizer) '
                              'instead of their own; the search\'s record names it.')
_OUTPUT = flags.DEFINE_string('output', None, 'A new directory for search.jsonl and config.json.')
_SET = flags.DEFINE_string('set', 'long', 'The factor set searched: long (scored past the original length), or short '
                           '(runs fine-tuned with longrope: scored within the original length with the set chosen by '
                           'length, their long set kept).')


def _scored_on(problem: factor_search.Problem) -> dict:
  if problem.text is None:
    return dict(seeds=list(problem.seeds), batches=problem.batches, first_batch=problem.first_batch,
                batch_size=problem.batch_size)
  return dict(tokens=len(problem.text), first_token=problem.first_token, corpus=problem.task.settings.path,
              corpus_name=long_context.corpus_name(problem.task))


def main(argv):
  del argv
  try:
    if not _WORKDIR.value or not _OUTPUT.value:
      raise ValueError('--workdir and --output: both needed; valid: runs of one RoPE configuration and a new directory')
    cli.check_output_path('--output', _OUTPUT.value, directory=True)
    if os.path.exists(_OUTPUT.value) and os.listdir(_OUTPUT.value):
      raise ValueError(f'--output: {_OUTPUT.value} is not empty; valid: a new directory (a search is never '
                       f'written over another)')
    settings = factor_search.SearchSettings(_POPULATION.value, _GENERATIONS.value, _MUTATION_RATE.value,
                                            _MUTATION_SCALE.value, _SEED.value)
    settings.check()
    factor = _FACTOR.value
    workdirs = [w for w in _WORKDIR.value.split(',') if w]
    problem = factor_search.pose_problem(workdirs, factor, _LENGTH.value, _TOKENS.value, _BATCHES.value, _SET.value,
                                         os.path.abspath(_CORPUS.value) if _CORPUS.value else '')
    if problem.text is None and flags.FLAGS['tokens'].present:
      raise ValueError(f'--tokens: set for a {problem.task.settings.name} run; valid: only for language models (a task '
                       'run is scored on --batches of its own problems)')
    starts = factor_search.method_starts(problem, factor)
    params = [checkpoints.restore_params(w, step) for w, step in zip(problem.workdirs, problem.steps)]
    os.makedirs(_OUTPUT.value, exist_ok=True)
    log_path = os.path.join(_OUTPUT.value, 'search.jsonl')
    started = time.time()

    def log(candidate: factor_search.Candidate) -> None:
      append_line_durably(log_path, json.dumps(dict(dataclasses.asdict(candidate), factors=list(candidate.factors),
                                                    seconds=round(time.time() - started, 1)), allow_nan=False))
      print(f'generation {candidate.generation} {candidate.origin}: {candidate.score:.4f}', flush=True)

    score = factor_search.scorer(problem, factor, params, _BATCH_SIZE.value)
    ranked = factor_search.search(score, starts, factor, settings, log)
  except (OSError, KeyError, ValueError, FloatingPointError, cli.CommandError) as error:
    cli.fail(str(error))
  best = ranked[0]
  by_start = {c.origin: c.score for c in ranked if c.generation == 0 and c.origin in (
      *factor_search.STARTS, factor_search.TRAINED, factor_search.ROPE)}
  short, long = factor_search.factor_sets(problem, best.factors)
  config_path = os.path.join(_OUTPUT.value, 'config.json')
  write_json_atomically(config_path, dict(
      rope_scaling=dict(rope_type='longrope', short_factor=list(short), long_factor=list(long)),
      original_max_position_embeddings=problem.original_length,
      longrope_search=dict(runs=[os.path.abspath(w) for w in problem.workdirs], checkpoint_steps=list(problem.steps),
                           factor=factor, set=problem.factor_set, length=problem.length, **_scored_on(problem),
                           score=best.score,
                           origin=best.origin,
                           generation=best.generation, start_scores=by_start, candidates=len(ranked),
                           settings=dataclasses.asdict(settings))))
  rope_scaling.longrope_overrides(config_path)  # what evaluate will read: the file must read back
  print(f'best of {len(ranked)}: {best.score:.4f} (generation {best.generation}, {best.origin}); at the start: ' +
        ', '.join(f'{name} {score:.4f}' for name, score in by_start.items()))
  print(f'wrote {config_path}')


if __name__ == '__main__':
  xla_cpu.schedule_for_memory()  # attention in blocks at long lengths, one block at a time
  cli.run(main)
