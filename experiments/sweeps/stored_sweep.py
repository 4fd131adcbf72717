"""A compare sweep read back from its directory: the task and the table of its finished runs, refused when its
runs mix configurations (experiments.rank, experiments.compare_sweeps)."""

import os
import re

import transformer
from experiments.runs import run_record
from experiments.sweeps import ranking, results

RUN_NAME = re.compile(r'^(?P<variant>.+)-seed(?P<seed>\d+)$')
PER_RUN_FIELDS = ('seed', 'model.position.kind', 'model.architecture')
POSITION_PREFIX = 'model.position.'


def comparable(stored: dict) -> dict:
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
  task, table, _ = read(sweep)
  return task, table


def read(sweep: str) -> tuple[str, results.Table, dict]:
  """read_sweep's (task, table) and {variant: its runs' configuration (comparable)}."""
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
    configs[name] = comparable(run_record.stored_config(os.path.join(sweep, name)))
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
  by_variant = {found[name][0]: config for name, config in configs.items()}
  return configs[first_name]['task.name'], results.aggregate(sweep, variants, seeds), by_variant
