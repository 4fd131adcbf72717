"""Rank positional encodings over several tasks by mean reciprocal rank (Kazemnejad et al. 2023):

  python -m experiments.rank --sweeps=runs/lg-copy,runs/lg-reverse,runs/lg-addition,runs/lg-sort,runs/lg-parity \
      [--metric=sequence_accuracy] [--output=runs/lg-ranking.md]

Each --sweeps entry is the --workdir of an experiments.compare sweep (configs/length_generalization.py
gives the protocol's). On every task the variants are ranked by the metric averaged over the evaluation
lengths beyond the training length, once per seed; the table gives each variant's MRR over tasks with
its 95% interval over seeds (experiments/sweeps/ranking.py). Only finished runs count, and every run
of a sweep must share one configuration but for its seed and variant (and each variant's own settings: rows
are compared on the settings their variants share); anything else is refused.
"""

import os
import re
import sys

from absl import flags

import transformer
from experiments.shared import cli
from experiments.runs import run_record
from experiments.sweeps import ranking, results

_SWEEPS = flags.DEFINE_string('sweeps', None, 'Comma-separated sweep directories, one per task.')
_METRIC = flags.DEFINE_string('metric', 'sequence_accuracy', 'The score: a metric every sweep evaluates.')
_OUTPUT = flags.DEFINE_string('output', None, 'Also write the tables to this markdown file.')
RUN_NAME = re.compile(r'^(?P<variant>.+)-seed(?P<seed>\d+)$')
PER_RUN_FIELDS = ('seed', 'model.position.kind', 'model.architecture')
POSITION_PREFIX = 'model.position.'


def _comparable(stored: dict) -> dict:
  """A run's configuration, flat, less the fields that differ by design from run to run (PER_RUN_FIELDS), with
  the fields added since older records were written at the value those runs had. Its model.position holds
  its variant's own settings: two rows are compared on the settings their variants share."""
  config = run_record.flatten(run_record.canonical(stored))
  variant = transformer.VARIANTS.get(config.get('model.position.kind'))
  own = variant.setting_names() if variant else ()
  for field, value in run_record.ADDED_FIELDS.items():
    if not field.startswith(POSITION_PREFIX) or field[len(POSITION_PREFIX):] in own:
      config.setdefault(field, value)
  return {field: value for field, value in config.items() if field not in PER_RUN_FIELDS}


def read_sweep(sweep: str) -> tuple[str, results.Table]:
  """(the sweep's task name, its table of finished runs); a RankingError if its runs mix configurations."""
  if not os.path.isdir(sweep):
    raise ranking.RankingError(f'--sweeps: {sweep} is not a directory; valid: the --workdir of a compare sweep')
  found = {}
  for name in sorted(os.listdir(sweep)):
    match = RUN_NAME.match(name)
    if match and run_record.is_finished(os.path.join(sweep, name)):
      found[name] = (match['variant'], int(match['seed']))
  if not found:
    raise ranking.RankingError(f'--sweeps: {sweep} holds no finished run; valid: a compare sweep that has run')
  configs = {}
  for name in found:
    configs[name] = _comparable(run_record.stored_config(os.path.join(sweep, name)))
    for other in configs:  # every pair: two variants share some settings, and runs of one variant all of theirs
      changed = [field for field in sorted(set(configs[name]) | set(configs[other]))
                 if configs[name].get(field) != configs[other].get(field)
                 and (field in configs[name] and field in configs[other] or not field.startswith(POSITION_PREFIX))]
      if changed:
        raise ranking.RankingError(
            f'{sweep}: {name} and {other} differ in {changed[0]} ({configs[name].get(changed[0])!r} and '
            f'{configs[other].get(changed[0])!r}); a ranking would mix configurations')
  first_name = next(iter(configs))
  variants = sorted({variant for variant, _ in found.values()})
  seeds = 1 + max(seed for _, seed in found.values())
  return configs[first_name]['task.name'], results.aggregate(sweep, variants, seeds)


def main(argv):
  del argv
  if not _SWEEPS.value:
    cli.fail('--sweeps: missing; valid: comma-separated compare sweep directories, e.g. runs/lg-copy,runs/lg-reverse')
  sweeps = [s.strip() for s in _SWEEPS.value.split(',') if s.strip()]
  tables = {}
  try:
    if _OUTPUT.value:
      cli.check_output_path('--output', _OUTPUT.value)
    for sweep in sweeps:
      task, table = read_sweep(sweep)
      label = task if task not in tables else os.path.basename(os.path.normpath(sweep))
      if _METRIC.value not in table.metrics:
        raise ranking.RankingError(f'--metric: got {_METRIC.value!r}; {sweep} evaluates {", ".join(table.metrics)}')
      tables[label] = table
    ranked = ranking.rank_sweeps(tables, _METRIC.value)
  except (ranking.RankingError, results.ResultsError, cli.CommandError) as error:
    cli.fail(str(error))
  text = ranking.markdown(ranked)
  print(text)
  if _OUTPUT.value:
    from experiments.shared.files import write_text_atomically  # pylint: disable=g-import-not-at-top
    write_text_atomically(_OUTPUT.value, text)
    print(f'wrote {_OUTPUT.value}', file=sys.stderr)


if __name__ == '__main__':
  cli.run(main)
