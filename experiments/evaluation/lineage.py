"""Which runs replicate one another, for the tables that take seeds as replicates.

A run's lineage is its configuration without its seed and without the fields a restart may change
(run_record.RESUMABLE_FIELDS: they leave its numbers as they are), and its seeds. A run fine-tuned from
another (train.init_from) carries the source's lineage in place of the source's path: the source's
configuration under `init_from.`, the step it started from, and the source's seeds before its own. Runs
with one configuration differ only by chance, so a row of a table holds runs of one configuration, each
once; `group` refuses anything else.
"""

import dataclasses
import json
import os

from experiments.runs import run_record


@dataclasses.dataclass(frozen=True)
class Lineage:
  configuration: dict  # flattened, without seeds and RESUMABLE_FIELDS
  seeds: tuple         # the run's seed after its sources' (oldest first)


def of_run(workdir: str) -> Lineage:
  """The lineage of the run at `workdir`, its sources read from their own directories."""
  resolved = run_record.stored_config(workdir)
  if resolved is None:
    raise FileNotFoundError(f'{workdir} has no {run_record.CONFIG_FILE}; valid: a training run directory')
  configuration = {name: value for name, value in run_record.flatten(resolved).items()
                   if name != 'seed' and name not in run_record.RESUMABLE_FIELDS}
  seeds = (int(resolved['seed']),)
  if not configuration.get('train.init_from'):
    return Lineage(configuration, seeds)
  record_path = os.path.join(workdir, run_record.INIT_FROM_FILE)
  if not os.path.exists(record_path):
    raise FileNotFoundError(f'{workdir}: fine-tuned from {configuration["train.init_from"]} but has no '
                            f'{record_path}; valid: a fine-tuned run that has started')
  with open(record_path) as file:
    source = json.load(file)
  try:
    source_lineage = of_run(source['workdir'])
  except FileNotFoundError as error:
    raise FileNotFoundError(f'{workdir} was fine-tuned from {source["workdir"]}, which is gone ({error}); valid: '
                            'the source run in place, its configuration names the fine-tuned rows') from None
  del configuration['train.init_from']
  configuration.update({f'init_from.{name}': value for name, value in source_lineage.configuration.items()})
  configuration['init_from.step'] = int(source['step'])
  return Lineage(configuration, source_lineage.seeds + seeds)


def evaluated_at(run_lineage: Lineage, checkpoint_step: int) -> Lineage:
  """The lineage with the step of the checkpoint a table reads (train.steps may grow on a restart, so runs
  of one configuration are replicates only at one step)."""
  return Lineage({**run_lineage.configuration, 'checkpoint_step': int(checkpoint_step)}, run_lineage.seeds)


def seeds_text(seeds: tuple) -> str:
  """(0,) -> '0'; a fine-tune's (source seed, own seed) -> '1/0'."""
  return '/'.join(str(seed) for seed in seeds)


def _method_text(method: str, factor) -> str:
  return method if factor in (None, 1, 1.0) else f'{method} x{factor:g}'


def _layers_text(configuration: dict) -> str:
  """What a model of local and global layers adds to its variant's name: Llama 4's temperature, the local layers' own
  variant (and RoPE base where it differs from the global one), the cycle of layer types with the window or chunk,
  sinks, QK-norm, sandwich norms; '' for full attention in every layer without them."""
  parts = []
  if configuration.get('model.position.temperature_scale'):
    parts.append(f'temperature {configuration["model.position.temperature_scale"]:g} from '
                 f'{configuration["model.position.temperature_floor"]}')
  local = configuration.get('model.local_position.kind')
  if local:
    bases = (configuration.get('model.local_position.rope_base'), configuration.get('model.position.rope_base'))
    differ = local == configuration['model.position.kind'] == 'rope' and bases[0] != bases[1]
    parts.append(f'{local} local' + (f' base {bases[0]:g}, global base {bases[1]:g}' if differ else ''))
  if configuration.get('model.layer_types', 'full') != 'full':
    sizes = [f'{name} {configuration[key]}' for name, key in (('window', 'model.sliding_window'),
                                                               ('chunk', 'model.attention_chunk_size'))
             if configuration.get(key)]
    parts.append(' '.join([configuration['model.layer_types']] + sizes))
  parts += [name for name, key in (('sinks', 'model.attention_sinks'), ('QK-norm', 'model.qk_norm'),
                                   ('sandwich norm', 'model.sandwich_norm'))
            if configuration.get(key) not in (None, False, 'none')]
  return f' ({"; ".join(parts)})' if parts else ''


def label(configuration: dict, method: str = 'none', factor: float = 1.0, overrides=()) -> str:
  """A row's name: the variant (and, for local and global layers, their design), the extension it was trained with,
  'fine-tuned at L' for a fine-tune, the method it was evaluated with, and any position overrides: 'rope',
  'rope + yarn x8', 'rope + yarn x16, fine-tuned at 512', 'rope (sliding,full window 32; sinks)', 'layer_pattern
  rope,rope,rope,none' (a pattern of variants by layer names its cycle)."""
  text = configuration['model.position.kind']
  if text == 'layer_pattern':
    text += ' ' + configuration['model.position.layer_pattern']
  text += _layers_text(configuration)
  trained_with = configuration.get('model.position.rope_extension', 'none')
  if trained_with != 'none':
    text += ' + ' + _method_text(trained_with, configuration.get('model.position.extension_factor'))
  if 'init_from.step' in configuration:
    text += f', fine-tuned at {configuration["task.max_length"]}'
  if method != 'none':
    text += (', then + ' if trained_with != 'none' or 'init_from.step' in configuration else ' + ')
    text += _method_text(method, factor)
  return ' + '.join([text] + [f'{field}={value}' for field, value in overrides])


@dataclasses.dataclass
class Row:
  label: str
  configuration: dict  # the runs' lineage configuration
  by_seeds: dict       # {seeds: what the table reads of that run}
  directories: dict    # {seeds: the evaluation directory it came from}


def group(items) -> list[Row]:
  """(label, lineage, directory, payload) of each evaluation, as rows in the order their labels first
  appear; a row that would mix two configurations, or hold one run twice, is refused."""
  rows = {}
  for row_label, run_lineage, directory, payload in items:
    row = rows.setdefault(row_label, Row(row_label, run_lineage.configuration, {}, {}))
    changed = sorted(name for name in set(row.configuration) | set(run_lineage.configuration)
                     if row.configuration.get(name) != run_lineage.configuration.get(name))
    if changed:
      name = changed[0]
      first = next(iter(row.directories.values()))
      raise ValueError(f'the {row_label} row would mix configurations: {name} is '
                       f'{run_lineage.configuration.get(name)!r} in {directory} and {row.configuration.get(name)!r} '
                       f'in {first}; valid: runs that differ only in their seed')
    if run_lineage.seeds in row.by_seeds:
      raise ValueError(f'{directory} and {row.directories[run_lineage.seeds]} are both {row_label} seed '
                       f'{seeds_text(run_lineage.seeds)}; valid: each run once')
    row.by_seeds[run_lineage.seeds], row.directories[run_lineage.seeds] = payload, directory
  return list(rows.values())
