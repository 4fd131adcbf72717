"""The retrieval probes context-extension papers report beside perplexity: can a language model still find
something far back? The passkey (Mohtashami & Jaggi 2023; experiments/tasks/passkey.py), scored by exact
match of the first digits the model writes, and RULER's several needles with one asked for (Hsieh et al.
2024; experiments/tasks/needles.py), scored by whether the asked number appears in what it writes. The
model decodes greedily. Each (length, depth) cell's rate comes with its 95% Wilson interval over the
trials (scipy.stats).
"""

import dataclasses
import re

import numpy as np

from experiments.tasks import needles as needles_prompts
from experiments.tasks.passkey import (ANSWER_SLACK, KEY_DIGITS, Codec, ProbeError, Prompt, codec_for, filler_for,
                                       filler_room, passkey_key, passkey_prompt)

PROBES = ('passkey', 'needle')


def answered_key(text: str) -> str:
  """The first run of digits in a decoded answer ('' if none)."""
  found = re.search(r'\d+', text)
  return found.group(0) if found else ''


def wilson_interval(correct: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
  """The Wilson score interval of a rate (scipy.stats.binomtest)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top  (a second to import; commands that only train need none)
  interval = stats.binomtest(correct, trials).proportion_ci(confidence_level=confidence, method='wilson')
  return float(interval.low), float(interval.high)


def probe_prompt(probe: str, codec: Codec, stream: np.ndarray, length: int, depth: float, seed: int, trial: int,
                 classic: bool = False, needles: int = 4) -> Prompt:
  """The prompt of one trial of `probe`: its filler, needle(s) and question, `length` tokens in all."""
  if probe == 'needle':
    pairs = needles_prompts.needle_pairs(seed, trial, needles)
    filler = filler_for(codec, stream, needles_prompts.filler_room(codec, length, pairs), seed, trial, classic)
    return needles_prompts.needle_prompt(codec, filler, length, depth, pairs, seed, trial)
  key = passkey_key(seed, trial)
  filler = filler_for(codec, stream, filler_room(codec, length, key), seed, trial, classic)
  return passkey_prompt(codec, filler, length, depth, key)


def scored(probe: str, prompt: Prompt, text: str) -> tuple[str, bool]:
  """(the answer recorded, whether it is right): the passkey's first digits exactly; a needle's number
  anywhere in what was written."""
  if probe == 'needle':
    return text.strip(), prompt.key in text
  answer = answered_key(text)
  return answer, answer == prompt.key


def probe_cell(codec: Codec, continuations, stream: np.ndarray, length: int, depth: float, trials: int, seed: int,
               classic: bool = False, batch_size: int = 8, probe: str = 'passkey', needles: int = 4) -> dict:
  """One (length, depth) cell: `trials` prompts, decoded in batches by continuations(prompts_BxL, tokens) ->
  B x tokens; the rate of right answers and its interval."""
  correct, answers = 0, []
  for first in range(0, trials, batch_size):
    prompts = [probe_prompt(probe, codec, stream, length, depth, seed, trial, classic, needles)
               for trial in range(first, min(trials, first + batch_size))]
    tokens = max(p.answer_tokens for p in prompts)
    written = continuations(np.stack([p.ids for p in prompts]), tokens)
    for prompt, row in zip(prompts, written):
      answer, right = scored(probe, prompt, codec.decode(row.tolist()))
      answers.append(answer)
      correct += right
  low, high = wilson_interval(correct, trials)
  return dict(length=length, depth=depth, trials=trials, correct=correct, rate=correct / trials, low=low,
              high=high, answers=answers)


@dataclasses.dataclass(frozen=True)
class ProbeRequest:
  lengths: tuple          # prompt lengths in tokens
  depths: tuple           # needle depths in [0, 1]
  trials: int             # prompts per cell
  filler: str = 'heldout'  # 'heldout' (the run's held-out text) or 'classic'
  seed: int = 0           # keys and filler are drawn from (seed, trial)
  batch_size: int = 8     # prompts decoded at once (changes no number)
  probe: str = 'passkey'  # 'passkey' or 'needle'
  needles: int = 4        # needle: the needles in each prompt, one asked for


FILLERS = ('heldout', 'classic')


def default_name(extension, request: ProbeRequest) -> str:
  """probe, method, factor, position overrides and the layers stretched (where not all), filler, trials."""
  from experiments.evaluation import long_context  # pylint: disable=g-import-not-at-top
  factor = '' if extension.method in ('none', 'dynamic_ntk') else f'-x{extension.factor:g}'
  needles = f'-{request.needles}needles' if request.probe == 'needle' else ''
  return (f'{request.probe}-{extension.method}{factor}{long_context.name_settings(extension)}-{request.filler}-'
          f'{request.trials}{needles}')


def cached_continuations(model, params, most_tokens: int):
  """continuations(prompts_BxL, tokens): the B x tokens greedy continuation of each prompt, decoded through
  the model's cache (transformer.decoder_only_generate: one pass over the prompt, then a token per step).
  Every call decodes `most_tokens` and keeps the first `tokens` (greedy decoding writes the same first tokens
  however many follow), so each prompt length compiles once."""
  import jax  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top
  generate = jax.jit(lambda params, prompts_BxL: transformer.decoder_only_generate(
      model, {'params': params}, prompts_BxL, most_tokens))

  def continuations(prompts_BxL, tokens: int) -> np.ndarray:
    if tokens > most_tokens:
      raise ValueError(f'an answer of {tokens} tokens; valid: at most {most_tokens}, the decoder\'s budget')
    generated = np.asarray(generate(params, np.asarray(prompts_BxL, np.int32)))
    return generated[:, prompts_BxL.shape[1]:prompts_BxL.shape[1] + tokens]

  return continuations


def _refuse_bad_request(request: ProbeRequest) -> None:
  """A ProbeError naming the flag for a probe, filler, trial count or depth the probes cannot take."""
  if request.probe not in PROBES:
    raise ProbeError(f'--probe: got {request.probe!r}; valid: {", ".join(PROBES)}')
  if request.filler not in FILLERS:
    raise ProbeError(f'--probe_filler: got {request.filler!r}; valid: {", ".join(FILLERS)}')
  if request.trials < 1:
    raise ProbeError(f'--trials: got {request.trials}; valid: a positive integer')
  for depth in request.depths:
    if not 0.0 <= depth <= 1.0:
      raise ProbeError(f'--depths: got {depth}; valid: numbers in [0, 1] (0: right after the first token)')


def decoding_bytes_at_least(config, batch: int, capacity: int) -> int:
  """A lower bound of the memory greedy decoding holds: every layer's cached keys and values, for `capacity`
  positions of `batch` prompts, in the compute dtype (the prompt's activations, logits and attention come on
  top)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  key_value_width = config.key_value_heads * config.head_dim
  return config.num_decoder_layers * 2 * batch * capacity * key_value_width * jnp.dtype(config.compute_dtype).itemsize


def _refuse_lengths_the_run_cannot_take(request: ProbeRequest, config, codec: Codec, stream_tokens: int) -> None:
  """A prompt too short for its needles and question, longer than the held-out stream its filler is drawn from,
  one (with its answer) longer than the run's variant takes, or one whose decoding cache alone would outgrow the
  device's memory: a ProbeError or ValueError naming --lengths."""
  from experiments.runs.preflight import device_memory  # pylint: disable=g-import-not-at-top
  for length in request.lengths:
    if request.probe == 'needle':
      room = needles_prompts.filler_room(codec, length, needles_prompts.needle_pairs(request.seed, 0, request.needles))
    else:
      room = filler_room(codec, length, passkey_key(request.seed, 0))
    if request.filler == 'heldout' and stream_tokens <= room:
      raise ProbeError(f'--lengths: {length} needs {room} filler tokens of a held-out stream of {stream_tokens}; valid: '
                       f'lengths whose filler fits it, or --probe_filler=classic')
  longest = max(request.lengths) + KEY_DIGITS + 1 + ANSWER_SLACK * 4
  try:
    config.position.settings.check_positions(longest)
  except ValueError as error:
    raise ValueError(f'--lengths: {max(request.lengths)} for this {config.position.kind} run: {error}') from None
  rows = config.position.settings.longest_sequence()
  if rows is not None and longest > rows:
    raise ValueError(f'--lengths: {max(request.lengths)} and its answer exceed the {rows} positions the '
                     f'{config.position.kind} table has; valid: lengths up to {rows - (longest - max(request.lengths))}')
  batch = min(request.batch_size, request.trials)
  needed, available = decoding_bytes_at_least(config, batch, longest), device_memory()
  if available and needed > available:
    raise ValueError(f'--lengths: {max(request.lengths)} would cache at least {needed / 2**30:,.1f} GiB of keys and '
                     f'values for {batch} prompts, more than the device\'s {available / 2**30:,.1f} GiB; valid: shorter '
                     f'lengths, or a smaller --batch_size')


def _description(workdir: str, request: ProbeRequest, extension, config, resolved: dict, original: int,
                 step: int) -> dict:
  """What evaluation.json records of a probe: the run (its checkpoint step, variant and lineage), the
  extension and the request, as they read back from JSON."""
  # pylint: disable=g-import-not-at-top
  import json
  import os
  from experiments.evaluation import lineage
  run_lineage = lineage.of_run(workdir)
  description = dict(run=os.path.abspath(workdir), checkpoint_step=int(step),
                     variant=config.position.kind, position=config.position.fields(), original_length=original,
                     trained_length=int(resolved['task']['max_length']), method=extension.method,
                     factor=extension.factor, run_seed=run_lineage.seeds[-1],
                     **({'position_overrides': [list(pair) for pair in extension.position_overrides]}
                        if extension.position_overrides else {}),
                     **({'extension_layers': extension.extension_layers} if extension.extension_layers != 'all'
                        else {}),
                     run_configuration=run_lineage.configuration,
                     **({'source_seeds': list(run_lineage.seeds[:-1])} if len(run_lineage.seeds) > 1 else {}),
                     **{k: v for k, v in dataclasses.asdict(request).items()
                        if k != 'batch_size' and (k != 'needles' or request.probe == 'needle')})
  return json.loads(json.dumps(description))  # tuples as the lists they read back as


def run_probe(workdir: str, request: ProbeRequest, extension, name=None, log=print,
              check_only: bool = False) -> tuple[str, dict, list]:
  """The probe's grid of one run under one extension (experiments/evaluation/long_context.Request's method and
  factor): RUN/evaluations/NAME/ gets evaluation.json (what was probed), results.json (every cell) and
  heatmap.png. A directory that records another probe is refused; one that records this one and has its
  results is read, not recomputed. Returns (the directory, what it records of the probe, the cells); with
  check_only, every check and (the directory, the record, []) without writing anything."""
  # pylint: disable=g-import-not-at-top
  import json
  import os
  from experiments.runs import checkpoints, run_record
  from experiments.evaluation import long_context
  from experiments.shared.files import exclusive_lock, write_json_atomically
  _refuse_bad_request(request)
  resolved = run_record.stored_config(workdir)
  if resolved is None:
    raise FileNotFoundError(f'--workdir: {workdir} has no {run_record.CONFIG_FILE}; valid: a training run directory')
  config, task = checkpoints.run_model(workdir, extension.corpus)
  codec = codec_for(task)
  config, original = long_context.extended_config(config, long_context.trained_positions(task), extension)
  stream = task.stream('eval')
  _refuse_lengths_the_run_cannot_take(request, config, codec, len(stream))
  step = checkpoints.newest_intact_step(workdir)
  description = _description(workdir, request, extension, config, resolved, original, step)
  description.update(corpus=extension.corpus, corpus_name=long_context.corpus_name(task))
  directory = os.path.join(workdir, long_context.EVALUATIONS,
                           name or default_name(extension, request) + long_context.on_corpus(extension.corpus, task))
  spec_path, results_path = os.path.join(directory, 'evaluation.json'), os.path.join(directory, 'results.json')
  if os.path.exists(spec_path):
    with open(spec_path) as file:
      recorded = long_context.with_corpus_defaults(json.load(file), description)
    differing = sorted(key for key in set(recorded) | set(description) if recorded.get(key) != description.get(key))
    if differing:
      found = '; '.join(f'{key}: {recorded.get(key)!r} there, {description.get(key)!r} now' for key in differing[:3])
      raise ValueError(f'{directory}: records another evaluation ({found}); valid: --name=<a new name>')
    if os.path.exists(results_path) and not check_only:
      with open(results_path) as file:
        return directory, description, json.load(file)['cells']
  if check_only:
    return directory, description, []
  os.makedirs(directory, exist_ok=True)
  with exclusive_lock(os.path.join(directory, long_context.LOCK_FILE), directory):
    write_json_atomically(spec_path, description)
    cells = _probe_grid(workdir, request, extension, config, task, codec, stream, step, log)
    write_json_atomically(results_path, dict(cells=cells))
    draw_heatmap(os.path.join(directory, 'heatmap.png'), cells, f'{os.path.basename(os.path.abspath(workdir))} '
                 f'{extension.method}: {request.probe} retrieval')
  return directory, description, cells


def _probe_grid(workdir: str, request: ProbeRequest, extension, config, task, codec: Codec, stream, step: int,
                log) -> list:
  """Every (length, depth) cell of the probe, decoded by the run's checkpoint at `step`."""
  # pylint: disable=g-import-not-at-top
  import transformer
  from experiments.runs import checkpoints
  most_tokens = 1 + max(KEY_DIGITS, needles_prompts.VALUE_DIGITS) + ANSWER_SLACK  # a token holds a character or more
  continuations = cached_continuations(transformer.build_model(config, 'decoder_only'),
                                       checkpoints.restore_params(workdir, step), most_tokens)
  cells = []
  for length in request.lengths:
    for depth in request.depths:
      cells.append(probe_cell(codec, continuations, stream, length, depth, request.trials, request.seed,
                              classic=request.filler == 'classic', batch_size=request.batch_size,
                              probe=request.probe, needles=request.needles))
      log(f'{workdir} {extension.method}: {request.probe} at length {length}, depth {depth:g}: '
          f'{cells[-1]["correct"]}/{cells[-1]["trials"]} ({cells[-1]["low"]:.2f}-{cells[-1]["high"]:.2f})')
  return cells


def draw_heatmap(path: str, cells: list, title: str) -> None:
  """The rate of each (depth, length) cell, with its count, as a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from experiments.shared.files import save_figure_atomically  # pylint: disable=g-import-not-at-top
  lengths = sorted({cell['length'] for cell in cells})
  depths = sorted({cell['depth'] for cell in cells})
  rate_DxL = np.full((len(depths), len(lengths)), np.nan)
  figure, axes = plt.subplots(figsize=(1.2 * len(lengths) + 2, 0.6 * len(depths) + 1.5))
  for cell in cells:
    row, column = depths.index(cell['depth']), lengths.index(cell['length'])
    rate_DxL[row, column] = cell['rate']
    axes.text(column, row, f'{cell["correct"]}/{cell["trials"]}', ha='center', va='center', fontsize=8)
  image = axes.imshow(rate_DxL, vmin=0.0, vmax=1.0, cmap='RdYlGn', aspect='auto')
  axes.set_xticks(range(len(lengths)), [str(length) for length in lengths])
  axes.set_yticks(range(len(depths)), [f'{depth:g}' for depth in depths])
  axes.set_xlabel('prompt length (tokens)')
  axes.set_ylabel('needle depth')
  axes.set_title(title, fontsize=9)
  figure.colorbar(image, ax=axes, label='exact-match rate')
  figure.tight_layout()
  save_figure_atomically(figure, path, dpi=100)
  plt.close(figure)
