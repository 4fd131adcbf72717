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

from absl import flags

from experiments.shared import cli
from experiments.sweeps import ranking, results
from experiments.sweeps.stored_sweep import read_sweep

_SWEEPS = flags.DEFINE_string('sweeps', None, 'Comma-separated sweep directories, one per task.')
_METRIC = flags.DEFINE_string('metric', 'sequence_accuracy', 'The score: a metric every sweep evaluates.')
_OUTPUT = flags.DEFINE_string('output', None, 'Also write the tables to this markdown file.')
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
  cli.print_and_write(ranking.markdown(ranked), _OUTPUT.value)


if __name__ == '__main__':
  cli.run(main)
