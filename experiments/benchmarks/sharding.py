"""Parameters split over devices, gradient accumulation and rematerialisation: what each costs in step time
and saves in memory per device, each row in its own process.

  python -m experiments.benchmark sharding [--config=configs/corpus.py] [--steps=5] [--warmup=1]
                                           [--sharding_json=sharding.json] [--rows='one device' ...]
                                           [--peak_flops=989e12]

Rows on 8 devices (on a CPU, XLA's fake host devices: --xla_force_host_platform_device_count=8) compare a
replicated state with fsdp=8 and with fsdp=4 x tensor=2; rows on one device compare the plain step with
each model.remat policy and with train.gradient_accumulation=4. Reported per row: the median step (the trainer's loop:
batch, place, step, read the metrics), the state's bytes on device 0 (read from the placed arrays), the
plan's estimate of activations, and what XLA's compiled step says one device needs: its arguments
(the state and batch) and its temporaries (activations and workspace), the numbers that bound a device's
memory. Peak RSS is the whole process (on a CPU every fake device shares it); on an accelerator, device 0's
peak bytes in use. Tokens/s counts every seed's training tokens; MFU is the PaLM model FLOPs of the step
(experiments/benchmarks/flops.py) over its time and --peak_flops per device. On one GPU, choose the
one-device rows with --rows.
"""

import json
import os
import sys

from absl import flags

from experiments.benchmarks import seeds as seeds_benchmark
from experiments.shared import cli

_CONFIG = flags.DEFINE_string('config', 'configs/corpus.py', 'The config every row starts from.')
_MODEL = flags.DEFINE_string('model', 'model.model_dim=256,model.feed_forward_dim=1024,model.num_decoder_layers=4',
                             'Comma-separated dotted overrides (integers) applied to every row.')
_SHARDING_JSON = flags.DEFINE_string('sharding_json', None, 'Also write the rows to this JSON file.')
_SHARDING_ROW = flags.DEFINE_string('sharding_row', None, 'Internal: run one row by its name, print its JSON.')
_ROWS = flags.DEFINE_multi_string('rows', None, 'Run only these rows (repeat the flag; default: every row).')
_PEAK_FLOPS = flags.DEFINE_float('peak_flops', 0.0, "The device's peak FLOP/s, for model FLOPs utilisation (0: "
                                 'not shown).')

ROWS = {  # name: (devices, overrides)
    'replicated (mesh)': (8, {'parallel.mode': 'mesh'}),
    'fsdp=8': (8, {'parallel.mode': 'mesh', 'parallel.fsdp': 8}),
    'fsdp=4 x tensor=2': (8, {'parallel.mode': 'mesh', 'parallel.fsdp': 4, 'parallel.tensor': 2}),
    'one device': (1, {}),
    'one device, model.remat=block': (1, {'model.remat': 'block'}),
    'one device, model.remat=matmuls': (1, {'model.remat': 'matmuls'}),
    'one device, gradient_accumulation=4': (1, {'train.gradient_accumulation': 4}),
}


def _model_overrides() -> dict:
  overrides = {}
  for item in filter(None, (part.strip() for part in _MODEL.value.split(','))):
    field, _, value = item.partition('=')
    if not value.lstrip('-').isdigit():
      cli.fail(f'--model: got {item!r}; valid: comma-separated FIELD=INTEGER overrides')
    overrides[field] = int(value)
  return overrides


def main(argv):
  del argv
  if _SHARDING_ROW.value:
    _, overrides = ROWS[_SHARDING_ROW.value]
    print('ROW ' + json.dumps(seeds_benchmark.run_row(_CONFIG.value, 1, {**_model_overrides(), **overrides})))
    return
  cli.load_config_file(_CONFIG.value)  # a bad file is named before anything runs
  _model_overrides()
  unknown = [name for name in _ROWS.value or [] if name not in ROWS]
  if unknown:
    cli.fail(f'--rows: got {unknown[0]!r}; valid: {", ".join(repr(name) for name in ROWS)}')
  if _PEAK_FLOPS.value < 0:
    cli.fail(f'--peak_flops: got {_PEAK_FLOPS.value}; valid: a positive number of FLOP/s, or 0 for no MFU')
  rows = []
  for name, (devices, _) in ROWS.items():
    if _ROWS.value and name not in _ROWS.value:
      continue
    command = [sys.executable, '-m', 'experiments.benchmark', 'sharding', f'--sharding_row={name}',
               f'--config={_CONFIG.value}', f'--model={_MODEL.value}', f'--steps={seeds_benchmark._STEPS.value}',  # pylint: disable=protected-access
               f'--warmup={seeds_benchmark._WARMUP.value}']  # pylint: disable=protected-access
    flags_now = os.environ.get('XLA_FLAGS', '')
    environment = dict(os.environ, XLA_FLAGS=f'{flags_now} --xla_force_host_platform_device_count={devices}'.strip())
    rows.append(dict(seeds_benchmark.row_in_subprocess(command, name, environment), name=name))
    print(f'{name}: {rows[-1]["step_ms"]:.1f} ms', file=sys.stderr, flush=True)
  print(table(rows, _PEAK_FLOPS.value))
  if _SHARDING_JSON.value:
    with open(_SHARDING_JSON.value, 'w') as file:
      json.dump(rows, file, indent=1)


def table(rows: list[dict], peak_flops: float = 0.0) -> str:
  """Markdown; model FLOPs utilisation against peak_flops (the model's FLOPs over all devices, per device)."""
  mib = 2 ** 20
  lines = ['| row | devices | mesh (data x fsdp x tensor) | step ms (min-max) | state on device 0 MiB | '
           'compiled step on one device: arguments / temporaries MiB | activations (estimate) MiB | peak RSS MiB | '
           'tokens/s | MFU | device 0 peak MiB |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for row in rows:
    mesh = ' x '.join(str(row['mesh'][axis]) for axis in ('data', 'fsdp', 'tensor'))
    arguments, temporaries = row['compiled_argument_bytes'], row['compiled_temporary_bytes']
    compiled = (f'{arguments / mib:.1f} / {temporaries / mib:.1f}' if arguments is not None and temporaries is not None
                else 'not reported')
    lines.append(f'| {row["name"]} | {row["devices"]} | {mesh} | {row["step_ms"]:.0f} ({row["step_min_ms"]:.0f}-'
                 f'{row["step_max_ms"]:.0f}) | {row["state_bytes_on_first_device"] / mib:.1f} | {compiled} | '
                 f'{row["planned"]["activations"] / mib:.1f} | {row["peak_rss_mib"]:.0f} | {row["tokens_per_s"]:,.0f} | '
                 f'{_utilisation(row, peak_flops)} | {_device_peak(row)} |')
  return '\n'.join(lines)


def _utilisation(row: dict, peak_flops: float) -> str:
  if not peak_flops or row['model_flops_per_step'] is None:
    return 'not asked' if not peak_flops else 'not a decoder'
  return f'{row["model_flops_per_step"] / (row["step_ms"] / 1e3) / (peak_flops * row["devices"]):.1%}'


def _device_peak(row: dict) -> str:
  return f'{row["device_peak_bytes"] / 2 ** 20:.0f}' if row['device_peak_bytes'] is not None else 'n/a (CPU: peak RSS)'
