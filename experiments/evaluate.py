"""Finished runs evaluated at any lengths, as trained or with a context extension of RoPE.

  python -m experiments.evaluate --workdir=runs/shakespeare/rope-seed0 --lengths=128,256,512,1024,2048 \
      --extension=none,pi,ntk,dynamic_ntk,yarn,llama3 --factor=16 [--protocol=sliding --stride=0.5] \
      [--tokens=65536] [--output=runs/extension]

Each run and method writes RUN/evaluations/NAME/ (experiments/evaluation/long_context.py: evaluation.json,
results.jsonl; and this command's tables and plot of them), never touching the run's training metrics.
--output also gets the tables (results.md and results.csv by length; by_position.md by band of positions
within the longest window) and the plot (by length; by position within the longest window) over every
run and method: a row per configuration and method, with the runs' seeds as replicates (a fine-tune's
seeds are its source's and its own), the mean over seeds with its 95% t interval and each seed's score
(experiments/evaluation/length_table.py); runs of two configurations under one label are refused before anything is
evaluated. --collect writes them from evaluation directories already on disk. The original length is
read from each run. Methods other than none apply to runs of a rotary variant; for the others they are
skipped, with a line saying so. --factor is s for pi, ntk, dynamic_ntk_sequence, yarn, llama3 and longrope (the
new length over the original one; required for them), while dynamic_ntk computes its own.
--rope_scaling=config.json gives longrope the factors of a Hugging Face config (its rope_scaling;
experiments/evaluation/rope_scaling.py).
--protocol=streaming --sink_tokens=4 --cache_size=N scores the stream's first L tokens (each --lengths L) one at a
time through StreamingLLM's cache: the first 4 tokens and the most recent ones in N slots, positions by slot, in
memory that does not grow with L (experiments/evaluation/streaming.py).
--position sets other variants' analogues (interpolation_factor of sinusoidal and learned tables, the
NoPE temperature of Llama 4) on every run.

  python -m experiments.evaluate --workdir=runs/copy/rope-seed0,runs/copy/rope-seed1 --lengths=16,32,64 \
      --extension=none,yarn --factor=4 [--output=runs/copy-extension]

A run of a task that draws its own problems (copy, reverse, sort, addition, ...) has no stream: it is
scored at each length on the trainer's own evaluation batches (its seed, eval_batches of batch_size
problems; experiments/evaluation/task_lengths.py), so the run as trained gives its metrics.jsonl numbers, and
the table shows the task's headline metric (token accuracy). --protocol, --stride and --tokens are refused
for such runs.

  python -m experiments.evaluate --workdir=RUN --probe=passkey --lengths=128,256,512,1024 \
      --depths=0,0.25,0.5,0.75,1 --trials=20 [--probe_filler=classic] [--extension=yarn --factor=8]

probes retrieval instead (experiments/evaluation/probes.py): the passkey's exact-match rate (or, --probe=needle
--needles=4, RULER's several needles with one asked for, scored by string match) in every cell of
length x depth with its 95% Wilson interval, written to RUN/evaluations/PROBE-METHOD-FILLER-TRIALS/
(evaluation.json, results.json, heatmap.png) and printed as a table. With --output, and with --collect of
such directories, the grid over every run: a row per variant and method with the runs' seeds as replicates
(experiments/evaluation/probe_grid.py: results.md, results.csv, heatmaps.png).

  python -m experiments.evaluate --probe=passkey --collect=RUN1/evaluations/passkey-none-heldout-20,... \
      --output=runs/passkey-grid
"""

import math
import os

from absl import flags

from experiments.runs import checkpoints, run_record
from experiments.evaluation import length_table, long_context, probe_grid, probes, rope_scaling, task_lengths, windows
from experiments.shared import cli, xla_cpu
from transformer.positions.extension import METHODS

_WORKDIR = flags.DEFINE_string('workdir', None, 'One or more comma-separated training runs of one task: a language '
                               'model, or a task that draws its own problems (copy, ...).')
_LENGTHS = flags.DEFINE_string('lengths', None, 'Comma-separated window lengths, or a task\'s problem lengths '
                               '(default: the run\'s eval_lengths).')
_EXTENSION = flags.DEFINE_string('extension', 'none', f'Comma-separated methods among: {", ".join(METHODS)}.')
_EXTENSION_LAYERS = flags.DEFINE_enum('extension_layers', 'all', list(long_context.EXTENSION_LAYERS),
                                      'Which layers --extension stretches: all, global (the full layers) or local (the '
                                      'sliding and chunked layers; Gemma 3 stretches its global layers only).')
_FACTOR = flags.DEFINE_float('factor', None, 'The factor s of pi, ntk, yarn, llama3 and longrope (required with '
                             'them).')
_PROTOCOL = flags.DEFINE_enum('protocol', 'sliding', [*windows.PROTOCOLS, 'streaming'], 'windows: non-overlapping; '
                              'sliding: a window every stride tokens, each token scored once (experiments/evaluation/'
                              'windows.py); streaming: token by token through StreamingLLM\'s cache of --cache_size '
                              'slots, --sink_tokens of them the stream\'s first (experiments/evaluation/streaming.py).')
_SINK_TOKENS = flags.DEFINE_integer('sink_tokens', 4, 'streaming: the first tokens of the stream the cache keeps.')
_CACHE_SIZE = flags.DEFINE_integer('cache_size', 0, 'streaming: the cache\'s slots, sink tokens included (required).')
_STRIDE = flags.DEFINE_float('stride', 0.5, 'sliding: the stride as a fraction of the window length, in (0, 1).')
_POSITION = flags.DEFINE_string('position', '', 'FIELD=VALUE,... set on every run\'s model.position at evaluation: '
                                'the analogues for other variants, e.g. interpolation_factor=4 (sinusoidal, learned) '
                                'or temperature_scale=0.1,temperature_floor=128 (Llama 4\'s temperature, any variant).')
_ROPE_SCALING = flags.DEFINE_string('rope_scaling', None, 'A Hugging Face config.json whose rope_scaling holds '
                                    'LongRoPE\'s factors, for --extension=longrope (experiments/evaluation/rope_scaling.py).')
_TOKENS = flags.DEFINE_integer('tokens', 65536, 'Score the first this many tokens of the held-out stream.',
                               lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 8, 'Windows per batch.', lower_bound=1)
_CORPUS = flags.DEFINE_string('corpus', None, 'Score a language model of tokens on this corpus (any prepared with '
                              'the run\'s tokenizer) instead of its own; the evaluation\'s directory and table rows '
                              'name it. Required for a run imported without a corpus.')
_NAME = flags.DEFINE_string('name', None, 'The directory under RUN/evaluations/ (default: from the method, factor, '
                            'protocol and tokens).')
_COLLECT = flags.DEFINE_string('collect', None, 'Compute nothing: tabulate these comma-separated evaluation '
                               'directories (RUN/evaluations/NAME) together, at --lengths, into --output (with '
                               '--probe=passkey or needle: such probes, as the grid over their runs).')
_OUTPUT = flags.DEFINE_string('output', None, 'A directory for the table and plots over every run and method.')
_PROBE = flags.DEFINE_enum('probe', 'none', ['none', *probes.PROBES], 'passkey or needle: the retrieval grid of '
                           '--lengths x --depths instead of perplexity (experiments/evaluation/probes.py).')
_NEEDLES = flags.DEFINE_integer('needles', 4, '--probe=needle: the needles in each prompt, one of them asked for.')
_DEPTHS = flags.DEFINE_string('depths', '0,0.25,0.5,0.75,1', '--probe: comma-separated needle depths in [0, 1].')
_TRIALS = flags.DEFINE_integer('trials', 20, '--probe: prompts per (length, depth) cell.')
_PROBE_FILLER = flags.DEFINE_enum('probe_filler', 'heldout', list(probes.FILLERS), '--probe: heldout (the run\'s '
                                  'held-out text) or classic (the repeated sentences of Mohtashami & Jaggi).')

STATIC = ('pi', 'ntk', 'dynamic_ntk_sequence', 'yarn', 'llama3', 'longrope')


def _requests(methods: list[str]) -> list[long_context.Request]:
  unknown = [m for m in methods if m not in METHODS] or ([] if methods else [''])
  if unknown:
    raise ValueError(f'--extension: got {unknown[0]!r}; valid: a comma-separated list of {", ".join(METHODS)}')
  if any(m in STATIC for m in methods) and _FACTOR.value is None:
    raise ValueError(f'--factor: missing; valid: the factor s (>= 1) of {", ".join(m for m in methods if m in STATIC)}'
                     ', e.g. the longest length over the training length')
  if _FACTOR.value is not None and not (math.isfinite(_FACTOR.value) and _FACTOR.value >= 1):
    raise ValueError(f'--factor: got {_FACTOR.value}; valid: a finite number >= 1')
  if not 0 < _STRIDE.value < 1:
    raise ValueError(f'--stride: got {_STRIDE.value}; valid: a fraction of the window length in (0, 1)')
  for name, value in (('--tokens', _TOKENS.value), ('--batch_size', _BATCH_SIZE.value)):
    if value < 1:
      raise ValueError(f'{name}: got {value}; valid: a positive integer')
  streaming = _PROTOCOL.value == 'streaming'
  for name in ('sink_tokens', 'cache_size'):
    if flags.FLAGS[name].present and not streaming:
      raise ValueError(f'--{name}: set with --protocol={_PROTOCOL.value}; valid: only with --protocol=streaming')
  if streaming and not 0 <= _SINK_TOKENS.value < _CACHE_SIZE.value:
    raise ValueError(f'--cache_size: got {_CACHE_SIZE.value} with --sink_tokens={_SINK_TOKENS.value}; valid with '
                     '--protocol=streaming: more slots than sink tokens (the cache holds the sinks and the most '
                     'recent tokens)')
  position = long_context.parse_position(_POSITION.value)
  if _ROPE_SCALING.value:
    if 'longrope' not in methods:
      raise ValueError(f'--rope_scaling: got {_ROPE_SCALING.value!r} with --extension={",".join(methods)}; valid: '
                       'with --extension=longrope, whose factors it gives')
  longrope = rope_scaling.longrope_overrides(_ROPE_SCALING.value) if _ROPE_SCALING.value else ()
  return [long_context.Request(method=m, factor=_FACTOR.value if m in STATIC else 1.0, protocol=_PROTOCOL.value,
                               stride_fraction=_STRIDE.value, tokens=_TOKENS.value, batch_size=_BATCH_SIZE.value,
                               position_overrides=position + (longrope if m == 'longrope' else ()),
                               corpus=os.path.abspath(_CORPUS.value) if _CORPUS.value else '',
                               extension_layers=_EXTENSION_LAYERS.value if m != 'none' else 'all',
                               sink_tokens=_SINK_TOKENS.value if streaming else 0,
                               cache_size=_CACHE_SIZE.value if streaming else 0)
          for m in methods]


def _collect(lengths: list[int]):
  """(rows, the first run's training length, protocol) from evaluation directories, refusing a mix of protocols
  (and rows that would mix configurations: experiments/evaluation/length_table.py)."""
  evaluations, protocols, trained = [], set(), None
  for directory in (d for d in _COLLECT.value.split(',') if d):
    description, results = long_context.read_evaluation(directory, lengths)
    protocols.add(long_context.protocol_of(description))
    trained = trained or description['trained_length']
    evaluations.append((directory, description, results))
  if len(protocols) > 1:
    raise ValueError(f'--collect: the directories were evaluated under different protocols {sorted(protocols)} '
                     '(protocol, stride, tokens; or a task\'s batches and their size); valid: evaluations of one '
                     'protocol, comparable token for token')
  return length_table.group(evaluations), trained, long_context.protocol_text(protocols.pop())


def _lengths(text: str, minimum: int) -> list[int]:
  """--lengths: comma-separated integers of at least `minimum`, each once (as train's task.eval_lengths), sorted."""
  try:
    given = [int(part) for part in text.split(',') if part.strip()]
  except ValueError:
    given = []
  if not given or min(given) < minimum:
    raise ValueError(f'--lengths: got {text!r}; valid: comma-separated window lengths of at least {minimum}, '
                     f'e.g. 128,256,512')
  _refuse_repeats('--lengths', text, given)
  return sorted(given)


def _refuse_repeats(flag: str, text: str, values: list) -> None:
  repeated = sorted({value for value in values if values.count(value) > 1})
  if repeated:
    raise ValueError(f'{flag}: got {text!r}, which repeats {", ".join(f"{value:g}" for value in repeated)}; valid: '
                     f'each value once')


def _check_name(name) -> None:
  if name is not None and (not name or name in ('.', '..') or '/' in name or os.sep in name):
    raise ValueError(f'--name: got {name!r}; valid: one directory name under RUN/{long_context.EVALUATIONS}/, no '
                     f'slashes')


def _prepare(workdirs: list[str], lengths: list[int], requests) -> list:
  """Every (run, request) checked before any is evaluated: one bad run or request, and nothing is written."""
  prepared, data = [], {}
  for workdir in workdirs:
    config, task = checkpoints.run_model(workdir, requests[0].corpus if requests else '')
    kind = config.position.kind
    data[workdir] = (task.settings.name, task.data_identity())
    if data[workdir] != data[workdirs[0]]:
      named = {w: ' '.join(part for part in data[w] if part) for w in (workdir, workdirs[0])}
      raise ValueError(f'--workdir: {workdir} was trained on {named[workdir]} and {workdirs[0]} on '
                       f'{named[workdirs[0]]}; valid: runs of one task and data, so that one table compares them')
    if not task_lengths.reads_stream(task):
      for name in ('protocol', 'stride', 'tokens', 'sink_tokens', 'cache_size'):
        if flags.FLAGS[name].present:
          raise ValueError(f'--{name}: set for {workdir}, a {task.settings.name} run; valid: only for language models '
                           'scored over a held-out stream (a task run is scored on the trainer\'s own evaluation '
                           'batches)')
    rotary = long_context.rotary_layers(config)
    for request in requests:
      if request.method != 'none' and not rotary:
        print(f'{workdir}: {kind} is not rotary; --extension={request.method} skipped for it', flush=True)
        continue
      prepared.append(long_context.prepare_evaluation(workdir, lengths, request, _NAME.value))
  protocols = sorted({long_context.protocol_of(evaluation.description) for evaluation in prepared})
  if len(protocols) > 1:
    raise ValueError(f'--workdir: the runs would be scored under different protocols {protocols} (a task\'s '
                     'evaluation batches and their size come from each run); valid: runs scored alike')
  directories = [os.path.abspath(evaluation.directory) for evaluation in prepared]
  repeated = sorted({d for d in directories if directories.count(d) > 1})
  if repeated:
    raise ValueError(f'--name/--workdir: {repeated[0]} would hold more than one evaluation; valid: each run once, and '
                     f'--name only with one method')
  return prepared


def _depths(text: str) -> tuple:
  try:
    given = [float(part) for part in text.split(',') if part.strip()]
  except ValueError:
    given = []
  if not given or not all(0.0 <= depth <= 1.0 for depth in given):
    raise ValueError(f'--depths: got {text!r}; valid: comma-separated numbers in [0, 1], e.g. 0,0.25,0.5,0.75,1')
  _refuse_repeats('--depths', text, given)
  return tuple(sorted(given))


def _probe(workdirs: list[str], lengths: list[int], requests) -> None:
  """--probe: every (run, method) checked first, then probed; a table of rates by depth and length."""
  request = probes.ProbeRequest(lengths=tuple(lengths), depths=_depths(_DEPTHS.value), trials=_TRIALS.value,
                                filler=_PROBE_FILLER.value, batch_size=_BATCH_SIZE.value, probe=_PROBE.value,
                                needles=_NEEDLES.value)
  planned = []
  for workdir in workdirs:
    config, _ = checkpoints.run_model(workdir, requests[0].corpus if requests else '')
    rotary = long_context.rotary_layers(config)
    for extension in requests:
      if extension.method != 'none' and not rotary:
        print(f'{workdir}: {config.position.kind} is not rotary; --extension={extension.method} skipped for it')
        continue
      planned.append((workdir, extension, probes.run_probe(workdir, request, extension, _NAME.value,
                                                           check_only=True)))
  if not planned:
    raise ValueError(f'--extension: got {_EXTENSION.value!r}, which applies to none of the runs; valid: none, or runs '
                     'of a rotary variant')
  if _OUTPUT.value:
    probe_grid.group(checked for _, _, checked in planned)  # the grid's refusals, before any probe runs
  probed = []
  for workdir, extension, _ in planned:
    directory, description, cells = probes.run_probe(workdir, request, extension, _NAME.value,
                                                     log=lambda line: print(line, flush=True))
    probed.append((directory, description, cells))
    print(f'\n{workdir} {extension.method}: {request.probe} rate (95% Wilson interval), {request.trials} '
          f'trials per cell; {directory}')
    print('| depth | ' + ' | '.join(str(length) for length in lengths) + ' |')
    print('|---' * (len(lengths) + 1) + '|')
    for depth in request.depths:
      row = {cell['length']: cell for cell in cells if cell['depth'] == depth}
      print(f'| {depth:g} | ' + ' | '.join(f'{row[n]["rate"]:.2f} ({row[n]["low"]:.2f}-{row[n]["high"]:.2f})'
                                           for n in lengths) + ' |')
  if _OUTPUT.value:
    print('wrote ' + ', '.join(probe_grid.write(_OUTPUT.value, probe_grid.group(probed), request.probe,
                                                request.needles)))


def main(argv):
  del argv
  try:
    _check_name(_NAME.value)
    if _OUTPUT.value:
      cli.check_output_path('--output', _OUTPUT.value, directory=True)
    if _COLLECT.value and _PROBE.value != 'none':
      if not _OUTPUT.value:
        raise ValueError('--collect: needs --output, the directory for the retrieval grid')
      rows, questions = probe_grid.collect([d for d in _COLLECT.value.split(',') if d])
      print('wrote ' + ', '.join(probe_grid.write(_OUTPUT.value, rows, questions['probe'], questions['needles'])))
      return
    if _COLLECT.value:
      if not _LENGTHS.value or not _OUTPUT.value:
        raise ValueError('--collect: needs --lengths and --output')
      lengths = _lengths(_LENGTHS.value, 2)
      rows, trained, protocol = _collect(lengths)
      length_table.print_table(rows, lengths)
      print('wrote ' + ', '.join(length_table.write(_OUTPUT.value, rows, lengths, trained, protocol)))
      return
    if not _WORKDIR.value:
      raise ValueError('--workdir: missing; valid: one or more comma-separated training runs')
    workdirs = [w for w in _WORKDIR.value.split(',') if w]
    requests = _requests([m.strip() for m in _EXTENSION.value.split(',') if m.strip()])
    first = run_record.stored_config(workdirs[0])
    if first is None:
      raise FileNotFoundError(f'--workdir: {workdirs[0]} has no config.json; valid: a training run directory')
    lengths = _lengths(_LENGTHS.value, 2) if _LENGTHS.value else sorted(first['task']['eval_lengths'])
    if _PROBE.value != 'none':
      _probe(workdirs, lengths, requests)
      return
    prepared, evaluations = _prepare(workdirs, lengths, requests), []
    length_table.group((e.directory, e.description, {}) for e in prepared)  # the table's refusals, before any run
    protocol = long_context.protocol_text(long_context.protocol_of(prepared[0].description)) if prepared else ''
    for evaluation in prepared:
      directory, results = long_context.run_evaluation(evaluation, log=lambda line: print(line, flush=True))
      length_table.write(directory, length_table.group([(directory, evaluation.description, results)]), lengths,
                         evaluation.description['trained_length'], protocol)  # this run's view
      evaluations.append((directory, evaluation.description, results))
    rows = length_table.group(evaluations)
  except (OSError, KeyError, ValueError, FloatingPointError, cli.CommandError) as error:  # ProbeError too
    cli.fail(str(error))
  if not evaluations:
    cli.fail(f'--extension: got {_EXTENSION.value!r}, which applies to none of the runs; valid: none, or runs of a '
             f'rotary variant')
  length_table.print_table(rows, lengths)
  if _OUTPUT.value:
    written = length_table.write(_OUTPUT.value, rows, lengths, int(first['task']['max_length']), protocol)
    print('wrote ' + ', '.join(written))


if __name__ == '__main__':
  xla_cpu.schedule_for_memory()  # attention in blocks at long lengths, one block at a time
  cli.run(main)
