"""A finished run evaluated at any lengths, with or without a context extension: a language model on its
held-out stream (windows.py says which window scores which token), a task that draws its own problems
(copy, reverse, ...) on its evaluation batches (task_lengths.py). What experiments/evaluate.py runs.

Each (run, extension) writes RUN/evaluations/NAME/: evaluation.json (what was evaluated: the method
and its settings, the original length read from the run, the checkpoint's step, the protocol) and
results.jsonl, one line per length, appended once that length is done: bits per character over the
scored tokens (a corpus run: bits per byte, and per token), and the bits at each window position averaged
over every window (the curve that shows where a model breaks down); for a task run, the task's metrics
(the trainer's, on the same batches) and which of them a table shows. A directory that describes another evaluation is refused, never rewritten;
one that describes this one is resumed (lengths already there are kept, not recomputed).
"""

import dataclasses
import functools
import hashlib
import json
import math
import os
import time
import typing
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import transformer
from experiments.runs import checkpoints, corpus_choice, run_record, settings as run_settings
from experiments.evaluation import streaming, task_lengths, windows
from experiments.runs.metrics import whole_lines
from experiments.shared.files import append_line_durably, exclusive_lock, write_json_atomically, write_text_atomically
from transformer.positions.extension import ExtensionSettings, METHODS

EVALUATIONS = 'evaluations'
LOCK_FILE = '.lock'  # in an evaluation directory while an evaluation writes it


@dataclasses.dataclass(frozen=True)
class Request:
  method: str           # a rope_extension, or 'none' (the run as trained)
  factor: float         # s for the static methods (1 for none and dynamic_ntk)
  protocol: str         # windows.PROTOCOLS
  stride_fraction: float  # sliding: the stride as a fraction of each length
  tokens: int           # the first this many tokens of the held-out stream are scored
  batch_size: int       # windows per batch
  position_overrides: tuple = ()  # (field, value) pairs set on the run's model.position: another variant's analogue
  #                       (interpolation_factor of sinusoidal and learned, the NoPE temperature)
  corpus: str = ''      # a corpus directory of the run's tokenizer to score instead of the run's own ('')
  extension_layers: str = 'all'  # which layers the extension stretches: all, global (full) or local (sliding, chunked)
  sink_tokens: int = 0  # streaming: the first tokens the cache keeps (streaming.py)
  cache_size: int = 0   # streaming: the cache's slots, sinks included


def override_text(value) -> str:
  """A position override's value as names and labels show it: a long one (LongRoPE's factor lists) as the
  first 8 hex digits of its SHA-256."""
  text = str(value)
  return text if len(text) <= 24 and ' ' not in text else 'sha' + hashlib.sha256(text.encode()).hexdigest()[:8]


def name_settings(request) -> str:
  """What a name adds for the position overrides and the layers an extension stretches (none for all of them):
  '-yarn_beta64-global'."""
  settings = ''.join(f'-{field}{override_text(value)}' for field, value in request.position_overrides)
  return settings + (f'-{request.extension_layers}' if request.extension_layers != 'all' else '')


def label_overrides(description: dict) -> list:
  """(field, value) pairs a table row's label adds for an evaluation or probe: its position overrides and the
  layers its extension stretched where not all (evaluation.json's fields), then its corpus."""
  pairs = [(field, override_text(value)) for field, value in description.get('position_overrides') or ()]
  if description.get('extension_layers', 'all') != 'all':
    pairs.append(('extension_layers', description['extension_layers']))
  if description.get('corpus_name'):
    pairs.append(('corpus', description['corpus_name']))
  return pairs


def default_name(request: Request, task_batches: Optional[tuple] = None) -> str:
  """method, factor, overrides, then how it was scored: the protocol and tokens of a stream, or a task's
  (evaluation batches, batch size), e.g. yarn-x4-sliding0.5-600, none-streaming-s4-c128-8192 or
  yarn-x4-batches4x32."""
  factor = '' if request.method in ('none', 'dynamic_ntk') else f'-x{request.factor:g}'
  settings = name_settings(request)
  if task_batches is not None:
    return f'{request.method}{factor}{settings}-batches{task_batches[0]}x{task_batches[1]}'
  protocol = {'windows': 'windows', 'sliding': f'sliding{request.stride_fraction:g}',
              'streaming': f'streaming-s{request.sink_tokens}-c{request.cache_size}'}[request.protocol]
  return f'{request.method}{factor}{settings}-{protocol}-{request.tokens}'


EXTENSION_FIELDS = ('rope_extension', 'extension_factor', 'original_length')  # what --extension and --factor set


def parse_position(text: str) -> tuple:
  """'field=value,field=value' -> ((field, value), ...), values as the number or word they spell;
  extended_config checks each against the run's variant."""
  pairs = []
  for item in (part.strip() for part in text.split(',') if part.strip()):
    field, separator, value = item.partition('=')
    if not separator or not field.strip() or not value.strip():
      raise ValueError(f'--position: got {item!r}; valid: FIELD=VALUE pairs separated by commas, e.g. '
                       'interpolation_factor=4')
    field, value = field.strip(), value.strip()
    if field in EXTENSION_FIELDS:
      raise ValueError(f'--position: got {field}={value}; valid: the extension through --extension and --factor '
                       f'(they set {", ".join(EXTENSION_FIELDS)}, and name the evaluation by them)')
    for convert in (int, float):
      try:
        value = convert(value)
        break
      except ValueError:
        continue
    pairs.append((field, value))
  fields = [field for field, _ in pairs]
  repeated = sorted({field for field in fields if fields.count(field) > 1})
  if repeated:
    raise ValueError(f'--position: got {text!r}, which sets {repeated[0]} twice; valid: each field once')
  return tuple(pairs)


def _typed(field: str, value, hint, kind: str):
  """The override's value as the setting's type; a ValueError names the flag, the field and the type."""
  if hint is bool and value in ('true', 'false', 'True', 'False', 0, 1):
    return value in ('true', 'True', 1)
  if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
    value = float(value)
  if not isinstance(value, hint) or (hint is int and isinstance(value, bool)) or (
      hint is float and not math.isfinite(value)):
    valid = 'a finite number' if hint is float else f'a {hint.__name__}'
    raise ValueError(f'--position: got {field}={value!r}; valid: {valid} ({kind}\'s {field} is a {hint.__name__})')
  return value


def _with_position(config: transformer.ModelConfig, pairs: tuple) -> transformer.ModelConfig:
  if not pairs:
    return config
  fields = dict(config.position.fields())
  kind = fields.pop('kind')
  hints = typing.get_type_hints(config.position.variant.settings)
  for field, value in pairs:
    if field not in hints:
      raise ValueError(f'--position: {field}: not a setting of {kind}, whose settings are: '
                       f'{", ".join(sorted(hints)) or "(none)"}')
    fields[field] = _typed(field, value, hints[field], kind)
  try:
    return config.replace(position=transformer.PositionConfig(kind, **fields))
  except ValueError as error:
    raise ValueError(f'--position: {" ".join(str(error).split())}') from None


def trained_positions(task) -> int:
  """The longest sequence the run trained on: task.max_length for a language model, and for a task the
  sequence its longest problems make (copy at 16, decoder-only: 34 tokens)."""
  return task.sequence_length(task.settings.max_length)


EXTENSION_LAYERS = ('all', 'global', 'local')


def rotary_layers(config: transformer.ModelConfig) -> bool:
  """Whether any layer's position takes a context extension (model.position or model.local_position rotary)."""
  return any(position is not None and isinstance(position.settings, ExtensionSettings)
             for position in (config.position, config.local_position))


def extended_config(config: transformer.ModelConfig, trained_length: int, request: Request) -> tuple:
  """(model config, original length): the run's model with the requested extension, on the layers
  request.extension_layers names (global: the full layers' model.position; local: the sliding and chunked layers'
  model.local_position, which is the run's model.position where it has none of its own; all: both). The original
  length is the run's own (position.original_length when it was trained with an extension, else trained_length, the
  trained_positions of its task)."""
  config = _with_position(config, request.position_overrides)
  if request.extension_layers not in EXTENSION_LAYERS:
    raise ValueError(f'--extension_layers: got {request.extension_layers!r}; valid: {", ".join(EXTENSION_LAYERS)}')
  has_local = config.layer_type_cycle != ('full',)
  shared = config.local_position is None and request.extension_layers == 'all'  # one position, stretched once
  local = None if shared else config.local_position or (config.position if has_local else None)
  targets = {'all': ('position', 'local_position'), 'global': ('position',),
             'local': ('local_position',)}[request.extension_layers]
  positions = {'position': config.position, 'local_position': local}
  rotary = [name for name in targets if positions[name] is not None
            and isinstance(positions[name].settings, ExtensionSettings)]
  settings = config.position.settings if 'position' in rotary or not rotary else positions[rotary[0]].settings
  if request.method == 'none':
    return config, getattr(settings, 'original_length', 0) or trained_length
  if not rotary or (request.extension_layers != 'all' and len(rotary) != len(targets)):
    names = ', '.join(kind for kind, variant in transformer.VARIANTS.items()
                      if issubclass(variant.settings, ExtensionSettings))
    kinds = ' and '.join(dict.fromkeys(positions[name].kind for name in targets if positions[name] is not None))
    raise ValueError(f'--extension: got {request.method!r} for a {kinds or "full-attention"} run '
                     f'(--extension_layers={request.extension_layers}); valid: none, or layers of a rotary variant '
                     f'({names})')
  original = settings.original_length or trained_length
  for name in rotary:
    fields = dict(positions[name].fields(), rope_extension=request.method, extension_factor=request.factor,
                  original_length=original)
    positions[name] = transformer.PositionConfig(fields.pop('kind'), **fields)
  return config.replace(position=positions['position'], local_position=positions['local_position']), original


LOGITS_CHUNK_BYTES = 1 << 28  # the float32 logits formed at once when scoring a long window


def _target_bits(logits, targets):
  log_probabilities = jax.nn.log_softmax(logits.astype(jnp.float32))
  return -jnp.take_along_axis(log_probabilities, targets[..., None], axis=-1)[..., 0] / math.log(2.0)


def bits_function(model):
  """bits(params, inputs_BxL, targets_BxL, packed) -> -log2 p(target) B x L. A decoder of tokens forms its logits
  over chunks of positions (LOGITS_CHUNK_BYTES of them at a time: 16k positions of a 49k vocabulary would be 3.2 GB
  at once); the same numbers as one pass."""

  @jax.jit
  def bits(params, inputs_BxL, targets_BxL, packed: dict):
    """packed: {} or the rows' positions_BxL and segments_BxL (a corpus run packed by document)."""
    valid = jnp.ones(inputs_BxL.shape, bool)
    if not isinstance(model, transformer.DecoderOnly):
      return _target_bits(model.apply({'params': params}, inputs_BxL, valid_BxL=valid, **packed), targets_BxL)
    hidden_BxLxD = model.apply({'params': params}, inputs_BxL, valid_BxL=valid,
                               method=transformer.DecoderOnly.hidden_states, **packed)
    batch, length, _ = hidden_BxLxD.shape
    chunk = max(1, min(length, LOGITS_CHUNK_BYTES // (4 * batch * model.config.vocab_size)))
    chunks = -(-length // chunk)
    padding = chunks * chunk - length
    hidden_NxBxCxD = jnp.pad(hidden_BxLxD, ((0, 0), (0, padding), (0, 0))).reshape(
        batch, chunks, chunk, -1).transpose(1, 0, 2, 3)
    targets_NxBxC = jnp.pad(targets_BxL, ((0, 0), (0, padding))).reshape(batch, chunks, chunk).transpose(1, 0, 2)

    def chunk_bits(pair):
      hidden_BxCxD, targets_BxC = pair
      logits = model.apply({'params': params}, hidden_BxCxD, method=transformer.DecoderOnly.logits)
      return _target_bits(logits, targets_BxC)
    bits_NxBxC = jax.lax.map(chunk_bits, (hidden_NxBxCxD, targets_NxBxC))
    return bits_NxBxC.transpose(1, 0, 2).reshape(batch, chunks * chunk)[:, :length]
  return bits


METRIC_LABELS = {'bits_per_character': 'bits per character', 'bits_per_byte': 'bits per byte'}


def record_metric(record: dict) -> str:
  """The score a results line holds: a task run's headline metric; bits_per_byte for a corpus (tokens of
  several bytes); else bits_per_character."""
  if 'headline' in record:
    return record['headline']
  return 'bits_per_byte' if 'bits_per_byte' in record else 'bits_per_character'


def metric_label(metric: str) -> str:
  return METRIC_LABELS.get(metric, metric.replace('_', ' '))


def corpus_name(task) -> str:
  """The corpus a language model of tokens is scored on, as names and table rows show it (its folder's name and
  the first 8 hex digits of its identity); '' for a task without a prepared corpus."""
  identity = task.data_identity() if task.settings.name == 'corpus' else None
  return corpus_choice.corpus_label(task.settings.path, identity) if identity else ''


def on_corpus(corpus: str, task) -> str:
  """What a default evaluation name gets for a corpus other than the run's own: '-on-' and its corpus_name."""
  return f'-on-{corpus_name(task)}' if corpus else ''


def with_corpus_defaults(recorded: dict, now: Optional[dict] = None) -> dict:
  """An evaluation.json written before corpora were recorded: the run's own corpus (whose identity the run itself
  pins), named as now."""
  recorded.setdefault('corpus', '')
  if 'corpus_name' not in recorded and not recorded['corpus']:
    recorded['corpus_name'] = (now or {}).get('corpus_name', '')
  return recorded


def evaluate_length(bits_function, params, stream: np.ndarray, bos: int, length: int, request: Request,
                    token_bytes: Optional[np.ndarray] = None, packed_rows=None) -> dict:
  """Bits per character over the scored tokens, and by window position, at one length. With token_bytes
  (each token's UTF-8 bytes, a corpus's tokens): bits per byte over the scored tokens' bytes, and per token.
  packed_rows: the task's, for a run that packed documents in its rows (inputs -> positions and segments)."""
  stride = min(length - 1, max(1, int(round(request.stride_fraction * length))))
  plan = windows.plan(len(stream), length, request.protocol, stride)
  total, scored, scored_bytes = 0.0, 0, 0
  by_position, counted = np.zeros(length), 0
  for first in range(0, len(plan), request.batch_size):
    chunk = plan[first:first + request.batch_size]
    batch = windows.window_batch(stream, chunk + [chunk[-1]] * (request.batch_size - len(chunk)), length, bos)
    packed = {f'{name}_BxL': value for name, value in (packed_rows(batch['inputs']) if packed_rows else {}).items()}
    bits = np.asarray(bits_function(params, batch['inputs'], batch['targets'], packed), np.float64)[:len(chunk)]
    if not np.all(np.isfinite(bits)):
      raise FloatingPointError(f'length {length}: the model gave non-finite log-probabilities (windows starting at '
                               f'{[w.start for w in chunk][:3]}); nothing was written for this length')
    mask = batch['scored'][:len(chunk)]
    total += float(bits[mask].sum())
    scored += int(mask.sum())
    if token_bytes is not None:
      scored_bytes += int(token_bytes[batch['targets'][:len(chunk)]][mask].sum())
    by_position += bits.sum(axis=0)
    counted += len(chunk)
  by_position /= counted
  scores = dict(bits_per_character=total / scored) if token_bytes is None else dict(
      bits_per_byte=total / scored_bytes, bits_per_token=total / scored, scored_bytes=scored_bytes)
  return dict(length=length, **scores, scored_tokens=scored, windows=len(plan),
              stride=stride if request.protocol == 'sliding' else length,
              bits_by_position=[round(float(b), 5) for b in by_position[1:]])  # position 1 .. L-1


def position_bands(length: int, trained: int) -> list[tuple[int, int]]:
  """Window positions [first, last) in bands: up to the training length, then doubling to the window's end."""
  bands, first, last = [], 1, min(trained, length)
  while first < length:
    bands.append((first, last))
    first, last = last, min(2 * last, length)
  return bands


def protocol_of(description: dict) -> tuple:
  """What decides which tokens an evaluation scored: (protocol, stride, tokens) over a stream, or ('task',
  evaluation batches, batch size) for a task run's own problems. Evaluations compare only under one."""
  if description['protocol'] == 'task':
    return 'task', description['eval_batches'], description['eval_batch_size']
  if description['protocol'] == 'streaming':
    return 'streaming', f'{description["sink_tokens"]}/{description["cache_size"]}', description['tokens']
  return description['protocol'], description['stride_fraction'], description['tokens']


def protocol_text(protocol: tuple) -> str:
  kind, first, second = protocol
  if kind == 'task':
    return f'the trainer\'s {first} evaluation batches of {second} problems, drawn from each run\'s seed'
  if kind == 'streaming':
    sinks, size = first.split('/')
    return f'token by token through a cache of {size} ({sinks} sink tokens, the rest the most recent), the first ' \
           f'L of {second} tokens'
  windows_text = 'non-overlapping windows' if kind == 'windows' else f'sliding windows, stride {first:g} of the length'
  return f'{windows_text}, the first {second} tokens'


def _read_results(path: str) -> dict:
  """Results by length. A torn last line (an evaluation killed while appending) is dropped with a warning
  and cut from the file, so the next length appends after whole lines; damage before the end is refused
  (metrics.MetricsDamaged)."""
  if not os.path.exists(path):
    return {}
  lines = whole_lines(path)
  with open(path) as file:
    if file.read() != ''.join(lines):
      write_text_atomically(path, ''.join(lines))
  records = [json.loads(line) for line in lines]
  return {record['length']: record for record in records}


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """One (run, request), checked and described, before anything is written."""
  workdir: str
  lengths: tuple
  request: Request
  config: transformer.ModelConfig  # the run's model with the request's extension and overrides
  task: object
  step: int
  directory: str
  description: dict
  exists: bool  # the directory already describes this evaluation: resume it


def prepare_evaluation(workdir: str, lengths: list[int], request: Request, name: Optional[str] = None) -> Evaluation:
  """Every check of one (run, request) that can fail, reading only: the run, its checkpoint, the
  extension and overrides against its variant, the lengths against its table, the tokens against its
  stream, and an evaluation directory of that name that describes another evaluation."""
  resolved = run_record.stored_config(workdir)
  if resolved is None:
    raise FileNotFoundError(f'--workdir: {workdir} has no {run_record.CONFIG_FILE}; valid: a training run directory')
  config, task = checkpoints.run_model(workdir, request.corpus)
  streamed = task_lengths.reads_stream(task)
  step = checkpoints.newest_intact_step(workdir)
  if request.method not in METHODS:
    raise ValueError(f'--extension: got {request.method!r}; valid: {", ".join(METHODS)}')
  config, original = extended_config(config, trained_positions(task), request)
  longest = max(lengths) if streamed else task.sequence_length(max(lengths))  # a task's problems hold more tokens
  if request.protocol == 'streaming':
    _check_streaming(config, request, streamed)
    longest = request.cache_size  # positions by slot
  try:
    config.position.settings.check_positions(longest - 1)
  except ValueError as error:
    raise ValueError(f'--lengths: {max(lengths)} for this {config.position.kind} run: {error}') from None
  rows = config.position.settings.longest_sequence()
  if rows is not None and longest > rows:
    raise ValueError(f'--lengths: {max(lengths)} needs {longest} positions, more than the {rows} the '
                     f'{config.position.kind} table of {workdir} has; valid: lengths whose sequences fit {rows}')
  description = dict(run=os.path.abspath(workdir), checkpoint_step=int(step),
                     finished_step=run_record.finished_step(workdir), variant=config.position.kind,
                     position=config.position.fields(), original_length=original,
                     trained_length=int(resolved['task']['max_length']),
                     init_from=resolved['train'].get('init_from', ''), **dataclasses.asdict(request))
  description['position_overrides'] = [list(pair) for pair in request.position_overrides]
  description['corpus_name'] = corpus_name(task)
  description.pop('batch_size')  # how many windows run at once does not change a number
  for field in ('sink_tokens', 'cache_size') if request.protocol != 'streaming' else ('stride_fraction',):
    description.pop(field)  # what this protocol does not read
  if request.extension_layers == 'all':
    description.pop('extension_layers')  # as every evaluation before the field existed
  if config.local_position is not None:
    description['local_position'] = config.local_position.fields()
  task_batches = None
  if streamed:
    available = len(task.stream('eval'))
    if request.tokens > available:
      raise ValueError(f'--tokens: got {request.tokens}; valid: at most {available}, the held-out stream\'s length')
    if max(lengths) > request.tokens:
      raise ValueError(f'--lengths: {max(lengths)} is longer than the {request.tokens} tokens scored (--tokens); '
                       f'valid: lengths up to {request.tokens}')
  else:  # the trainer's evaluation batches: their count, size and seed decide the problems, not the request
    task_batches = (int(resolved['task']['eval_batches']), int(resolved['train']['batch_size']))
    for field in ('protocol', 'stride_fraction', 'tokens'):
      description.pop(field, None)
    description.update(protocol='task', seed=int(resolved['seed']), eval_batches=task_batches[0],
                       eval_batch_size=task_batches[1])
  directory = os.path.join(workdir, EVALUATIONS,
                           name or default_name(request, task_batches) + on_corpus(request.corpus, task))
  exists = _records_this_evaluation(directory, description)
  return Evaluation(workdir=workdir, lengths=tuple(lengths), request=request, config=config, task=task, step=step,
                    directory=directory, description=description, exists=exists)


def _check_streaming(config: transformer.ModelConfig, request: Request, streamed: bool) -> None:
  """ValueError for a streaming evaluation that cannot run: a task run, a cache that holds nothing but sinks, a
  variant that keeps a per-token cache of its own (transformer/rolling_cache.py)."""
  if not streamed:
    raise ValueError('--protocol: got \'streaming\' for a task run; valid: a language model scored over a stream')
  if not 0 <= request.sink_tokens < request.cache_size:
    raise ValueError(f'--sink_tokens, --cache_size: got {request.sink_tokens} and {request.cache_size}; valid: '
                     '0 <= sink tokens < cache size (the cache holds the sinks and at least one recent token)')
  refused = sorted({config.layer_position(index).kind for index in range(config.num_decoder_layers)
                    if not config.layer_position(index).rolling_cache})
  if refused or config.randomized_max_length:
    raise ValueError(f'--protocol: got \'streaming\' for a run of {refused[0] if refused else "randomized positions"};'
                     ' valid: runs of a variant that keeps no per-token cache of its own, at positions 0 .. L - 1')


def _records_this_evaluation(directory: str, description: dict) -> bool:
  """Whether the directory already records this evaluation (to resume); a ValueError when it records another, or
  its results are damaged before their end."""
  spec_path = os.path.join(directory, 'evaluation.json')
  if not os.path.exists(spec_path):
    return False
  with open(spec_path) as file:
    recorded = with_corpus_defaults(json.load(file), description)
  recorded.setdefault('position_overrides', [])  # written before overrides existed: none
  differing = sorted(key for key in set(recorded) | set(description) if recorded.get(key) != description.get(key))
  if differing:
    found = '; '.join(f'{key}: {recorded.get(key)!r} there, {description.get(key)!r} now' for key in differing[:3])
    raise ValueError(f'{directory}: records another evaluation ({found}); valid: --name=<a new name>')
  results_path = os.path.join(directory, 'results.jsonl')
  if os.path.exists(results_path):
    whole_lines(results_path)  # damage before the end is refused here, not later; a torn tail is cut when run
  return True


def _length_scorer(evaluation: Evaluation, params):
  """length -> its results line: a task run on its evaluation batches, a language model over its stream."""
  task, description, request = evaluation.task, evaluation.description, evaluation.request
  if description['protocol'] == 'task':
    sums = task_lengths.sums_function(transformer.build_model(evaluation.config, task.settings.model_kind), task)
    cap = run_settings.width_cap(evaluation.config, task.settings.model_kind)
    return functools.partial(task_lengths.evaluate_length, sums, params, task, description['seed'],
                             batch_size=description['eval_batch_size'], batches=description['eval_batches'],
                             width_cap=cap)
  stream = task.stream('eval')[:request.tokens]
  if request.protocol == 'streaming':
    stream_bits = streaming.bits_function(transformer.build_model(evaluation.config, 'decoder_only'),
                                          request.sink_tokens, request.cache_size)
    return functools.partial(streaming.evaluate_length, stream_bits, params, stream, task.bos,
                             token_bytes=getattr(task, 'token_bytes', None))
  bits = bits_function(transformer.build_model(evaluation.config, 'decoder_only'))
  return functools.partial(evaluate_length, bits, params, stream, task.bos, request=request,
                           token_bytes=getattr(task, 'token_bytes', None), packed_rows=getattr(task, 'packed_rows', None))


def run_evaluation(evaluation: Evaluation, log=print) -> tuple[str, dict]:
  """Runs a prepared evaluation: (its directory, results by length). Lengths already there are kept."""
  directory, request = evaluation.directory, evaluation.request
  results_path = os.path.join(directory, 'results.jsonl')
  os.makedirs(directory, exist_ok=True)
  with exclusive_lock(os.path.join(directory, LOCK_FILE), directory):  # one writer of results.jsonl at a time
    spec_path = os.path.join(directory, 'evaluation.json')
    if not os.path.exists(spec_path):
      write_json_atomically(spec_path, evaluation.description)
    elif not evaluation.exists:
      with open(spec_path) as file:
        if json.load(file) != json.loads(json.dumps(evaluation.description)):
          raise ValueError(f'{directory}: another evaluate has just recorded another evaluation there; valid: '
                           f'--name=<a new name>')
    results = _read_results(results_path)
    score = _length_scorer(evaluation, checkpoints.restore_params(evaluation.workdir, evaluation.step))
    for length in evaluation.lengths:
      if length in results:
        continue
      started = time.time()
      record = score(length)
      record['seconds'] = round(time.time() - started, 1)
      append_line_durably(results_path, json.dumps(record, sort_keys=True, allow_nan=False))
      results[length] = record
      metric = record_metric(record)
      scored = (f'{record["examples"]} problems' if 'examples' in record else
                f'{record["scored_tokens"]} tokens, {record["windows"]} windows')
      log(f'{evaluation.workdir} {request.method}: length {length}: {record[metric]:.4f} {metric_label(metric)} '
          f'({scored}, {record["seconds"]} s)')
  return directory, {length: results[length] for length in evaluation.lengths}


def evaluate_run(workdir: str, lengths: list[int], request: Request, name: Optional[str] = None,
                 log=print) -> tuple[str, dict]:
  """Evaluates one run under one request; returns (its evaluation directory, results by length)."""
  return run_evaluation(prepare_evaluation(workdir, lengths, request, name), log)


def read_evaluation(directory: str, lengths: list[int]) -> tuple[dict, dict]:
  """(evaluation.json, results by length) of an evaluation directory; a ValueError names missing lengths."""
  spec_path = os.path.join(directory, 'evaluation.json')
  if not os.path.exists(spec_path):
    raise FileNotFoundError(f'--collect: {directory} has no evaluation.json; valid: a RUN/{EVALUATIONS}/NAME '
                            'directory that experiments.evaluate wrote')
  with open(spec_path) as file:
    description = with_corpus_defaults(json.load(file))
  description.setdefault('position_overrides', [])  # written before overrides existed: none
  results = _read_results(os.path.join(directory, 'results.jsonl'))
  missing = [length for length in lengths if length not in results]
  if missing:
    raise ValueError(f'--collect: {directory} has no result at lengths {missing}; valid: lengths it has, '
                     f'{sorted(results)}, or evaluate it there first')
  return description, {length: results[length] for length in lengths}
