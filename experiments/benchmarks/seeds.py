"""Seeds in one program against one seed alone: the training step of N replicas vectorised with
jax.vmap (experiments/runs/replicas.py), as the trainer runs it, for each N and config.

  python -m experiments.benchmark seeds [--configs=configs/algorithmic.py:copy,configs/shakespeare.py]
                                        [--seeds=1,2,4,8] [--steps=20] [--warmup=3] [--json=seeds.json]

Each (config, N) runs in its own subprocess. A timed step is what the trainer's loop does per step:
build every replica's batch on the host, place it, step, and read the metrics back. "1 alone" is the
plain unvectorised step that a single run uses. Reported: compile time, median step time (min-max),
that time over one seed alone's, the time per seed-step, and the speed-up over training the N seeds
one after another (N x one alone / N in one program); peak resident memory.
"""

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from absl import flags

from experiments.benchmarks.flops import model_flops_per_step
from experiments.shared import cli

_CONFIGS = flags.DEFINE_string('configs', 'configs/algorithmic.py:copy,configs/shakespeare.py',
                               'Comma-separated config files (with :argument).')
_SEEDS = flags.DEFINE_string('seeds', '1,2,4,8', 'Comma-separated replica counts; 1 is the run alone.')
_STEPS = flags.DEFINE_integer('steps', 20, 'Timed steps per row.', lower_bound=1)
_WARMUP = flags.DEFINE_integer('warmup', 3, 'Untimed steps after compilation.', lower_bound=0)
_JSON = flags.DEFINE_string('json', None, 'Also write the rows to this JSON file.')
_ROW = flags.DEFINE_string('row', None, 'Internal: run one row, "config|seeds", and print its JSON.')


@dataclasses.dataclass
class _Program:
  """A config's training step for `count` seeds in one program, with its state placed and the step compiled."""
  experiment: Any
  replicas: Any
  task: Any
  placement: Any
  state: Any
  train_step: Any
  parameters: int
  memory: dict
  state_bytes_on_first_device: int


def _program(config_argument: str, count: int, overrides: dict | None) -> _Program:
  # pylint: disable=g-import-not-at-top
  import functools
  import jax
  import transformer
  from experiments.runs import sharding, steps
  from experiments.runs.parallel import placement_for
  from experiments.runs.replicas import Replicas
  from experiments.runs.settings import from_config_dict
  from experiments.tasks import TASKS
  config = cli.load_config_file(config_argument)
  config.update_from_flattened_dict(overrides or {})
  experiment = from_config_dict(config, jax.device_count())
  replicas = Replicas(range(experiment.seed, experiment.seed + count))
  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(experiment.model, experiment.task.model_kind)
  host_states = [jax.device_get(steps.create_train_state(dataclasses.replace(experiment, seed=seed), model, task))
                 for seed in replicas.seeds]
  specs, memory = sharding.plan(experiment, model, task, host_states[0], jax.device_count())
  placement = placement_for(experiment.parallel, batch_axis=replicas.batch_axis, state_specs=specs)
  state = placement.put_state(replicas.join(host_states))
  first = jax.devices()[0]
  train_step = placement.compile_train_step(replicas.train_step(functools.partial(
      steps.train_step, model=model, task=task, experiment=experiment)))
  return _Program(
      experiment=experiment, replicas=replicas, task=task, placement=placement, state=state, train_step=train_step,
      parameters=sum(x.size for x in jax.tree_util.tree_leaves(host_states[0].params)), memory=memory,
      state_bytes_on_first_device=sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(state)
                                      for shard in leaf.addressable_shards if shard.device == first))


def run_row(config_argument: str, count: int, overrides: dict | None = None) -> dict:
  """One row: the config (with `overrides`, {dotted field: value}) stepped with `count` seeds in one program."""
  import jax  # pylint: disable=g-import-not-at-top
  program = _program(config_argument, count, overrides)
  experiment, replicas, task, placement = program.experiment, program.replicas, program.task, program.placement
  seed_argument = replicas.seed_argument()
  batch_size = experiment.train.batch_size
  rows = placement.host_rows(batch_size)
  batch_times = []

  def one_step(state, step):
    started = time.perf_counter()
    batches = [task.batch_rows(seed, step, 'train', batch_size, rows) for seed in replicas.seeds]
    batch_times.append(time.perf_counter() - started)
    state, metrics = program.train_step(state, placement.put_batch(replicas.join(batches), batch_size), seed_argument)
    replicas.split(placement.to_host(metrics))
    return state

  started = time.perf_counter()
  first_batch = placement.put_batch(
      replicas.join([task.batch_rows(seed, 0, 'train', batch_size, rows) for seed in replicas.seeds]), batch_size)
  memory_analysis = program.train_step.lower(program.state, first_batch, seed_argument).compile().memory_analysis()
  state = one_step(program.state, 0)
  compile_seconds = time.perf_counter() - started
  for step in range(1, 1 + _WARMUP.value):
    state = one_step(state, step)
  times = []
  del batch_times[:]
  for step in range(1 + _WARMUP.value, 1 + _WARMUP.value + _STEPS.value):
    started = time.perf_counter()
    state = one_step(state, step)
    times.append(time.perf_counter() - started)
  first = jax.devices()[0]
  stats = first.memory_stats() if first.platform != 'cpu' else None
  tokens = count * batch_size * experiment.task.max_length
  flops = (model_flops_per_step(program.parameters, experiment.model.num_decoder_layers, experiment.model.model_dim,
                                experiment.task.max_length, count * batch_size)
           if experiment.task.model_kind == 'decoder_only' else None)
  return dict(tokens_per_s=tokens / statistics.median(times), model_flops_per_step=flops,
              device_peak_bytes=stats['peak_bytes_in_use'] if stats else None, device_kind=first.device_kind,
              config=config_argument, seeds=count, compile_s=compile_seconds, step_ms=1e3 * statistics.median(times),
              step_min_ms=1e3 * min(times), step_max_ms=1e3 * max(times), parameters=program.parameters,
              batch_ms=1e3 * statistics.median(batch_times), batch_share=sum(batch_times) / sum(times),
              batch_size=batch_size, length=experiment.task.max_length,
              peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, devices=jax.device_count(),
              backend=jax.default_backend(), state_bytes_on_first_device=program.state_bytes_on_first_device,
              planned=program.memory, mesh=program.memory['mesh'],
              compiled_temporary_bytes=getattr(memory_analysis, 'temp_size_in_bytes', None),
              compiled_argument_bytes=getattr(memory_analysis, 'argument_size_in_bytes', None))


def row_in_subprocess(command: list[str], label: str, environment: dict | None = None) -> dict:
  """The row a benchmark command run as its own process prints on its 'ROW {json}' line; a one-line failure
  naming `label` and the command's last error line when it prints none."""
  completed = subprocess.run(command, capture_output=True, text=True, check=False,
                             env=dict(environment or os.environ, PYTHONPATH=os.getcwd()))
  found = [line for line in completed.stdout.splitlines() if line.startswith('ROW ')]
  if completed.returncode != 0 or not found:
    cli.fail(f'{label}: exit code {completed.returncode}: '
             f'{(completed.stderr.strip().splitlines() or ["no output"])[-1]}')
  return json.loads(found[0][4:])


def main(argv):
  del argv
  if _ROW.value:
    config_argument, count = _ROW.value.rsplit('|', 1)
    print('ROW ' + json.dumps(run_row(config_argument, int(count))))
    return
  try:
    counts = [int(c) for c in _SEEDS.value.split(',') if c.strip()]
  except ValueError:
    cli.fail(f'--seeds: got {_SEEDS.value!r}; valid: comma-separated positive integers, e.g. 1,2,4,8')
  if not counts or min(counts) < 1:
    cli.fail(f'--seeds: got {_SEEDS.value!r}; valid: comma-separated positive integers, e.g. 1,2,4,8')
  configs = [c.strip() for c in _CONFIGS.value.split(',') if c.strip()]
  for config_argument in configs:
    cli.load_config_file(config_argument)  # a bad file is named before anything runs
  if 1 not in counts:
    counts = [1] + counts  # the baseline every ratio divides by
  rows = []
  for config_argument in configs:
    for count in counts:
      command = [sys.executable, '-m', 'experiments.benchmark', 'seeds', f'--row={config_argument}|{count}',
                 f'--steps={_STEPS.value}', f'--warmup={_WARMUP.value}']
      rows.append(row_in_subprocess(command, f'{config_argument} with {count} seeds'))
      print(f'{config_argument} x{count}: {rows[-1]["step_ms"]:.1f} ms', file=sys.stderr, flush=True)
  print(table(rows))
  if _JSON.value:
    with open(_JSON.value, 'w') as file:
      json.dump(rows, file, indent=1)


def table(rows: list[dict]) -> str:
  lines = ['| config | seeds | compile s | step ms (min-max) | x one alone | ms per seed-step | speed-up over '
           'one after another | peak RSS MiB |', '|---|---|---|---|---|---|---|---|']
  alone = {row['config']: row['step_ms'] for row in rows if row['seeds'] == 1}
  for row in rows:
    ratio = row['step_ms'] / alone[row['config']]
    lines.append(f'| {row["config"]} | {row["seeds"]} | {row["compile_s"]:.1f} | {row["step_ms"]:.1f} '
                 f'({row["step_min_ms"]:.1f}-{row["step_max_ms"]:.1f}) | {ratio:.2f} | '
                 f'{row["step_ms"] / row["seeds"]:.1f} | {row["seeds"] / ratio:.2f} | {row["peak_rss_mib"]:.0f} |')
  return '\n'.join(lines)
