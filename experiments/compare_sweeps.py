"""Two compare sweeps of the same variants, task and budget under one treatment: what moved, and the order.

  python -m experiments.compare_sweeps --sweeps=runs/today-shakespeare,runs/llama-shakespeare \
      [--metric=bits_per_character] [--output=runs/blocks-shakespeare.md]

The first sweep is A, the second B (e.g. today's block and the Llama-style block, each an experiments.compare
--workdir). For each variant both finished and each evaluation length: B - A paired over seeds with its 95%
interval, each sweep's rank of the variant, and Kendall's tau between the two orders
(experiments/sweeps/two_sweeps.py). The fields the sweeps differ in are printed above the tables; sweeps of
another task or training budget, or whose runs mix configurations, are refused. --metric defaults to the
sweeps' headline (bits per byte or character for a language model, else the first metric they evaluate).
"""

from absl import flags

from experiments.shared import cli
from experiments.sweeps import ranking, results, stored_sweep, two_sweeps

_SWEEPS = flags.DEFINE_string('sweeps', None, 'Two comma-separated sweep directories: A,B.')
_METRIC = flags.DEFINE_string('metric', None, 'The score (default: the sweeps\' headline metric).')
_OUTPUT = flags.DEFINE_string('output', None, 'Also write the tables to this markdown file.')


def main(argv):
  del argv
  sweeps = [s.strip() for s in (_SWEEPS.value or '').split(',') if s.strip()]
  if len(sweeps) != 2:
    cli.fail(f'--sweeps: got {_SWEEPS.value!r}; valid: two compare sweep directories, A,B')
  try:
    if _OUTPUT.value:
      cli.check_output_path('--output', _OUTPUT.value)
    read = [stored_sweep.read(sweep) for sweep in sweeps]
    tables = tuple(table for _, table, _ in read)
    metric = _METRIC.value or next((m for m in tables[0].metrics if m in tables[1].metrics), None)
    compared = two_sweeps.compare(tuple(sweeps), tables, tuple(configs for _, _, configs in read), metric)
  except (two_sweeps.SweepsError, ranking.RankingError, results.ResultsError, cli.CommandError) as error:
    cli.fail(str(error))
  cli.print_and_write(two_sweeps.markdown(compared), _OUTPUT.value)


if __name__ == '__main__':
  cli.run(main)
