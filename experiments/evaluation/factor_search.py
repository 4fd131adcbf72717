"""LongRoPE's evolutionary search for per-pair rescale factors (Ding et al. 2024, section 3.2), with any
score to minimise; experiments/longrope_search.py scores a candidate by the runs' bits per character at the
target length (a language model), or by their cross-entropy on problems of the target length drawn after
the trainer's evaluation batches (a task that draws its own problems, such as copy). It searches the long
set, for lengths past the original one; or, for runs fine-tuned with longrope, the short set at a length
within the original one, their long set kept and the set chosen by length (Hugging Face's rule).

A candidate is lambda_1 .. lambda_P: pair p's frequency is divided by lambda_p (rope_extension=longrope,
transformer/positions/extension.py). The paper's search space: lambda_p in [1, 1.25 s] on a grid of 0.01,
non-decreasing in p (a lower frequency is interpolated at least as much as a higher one). The first
population holds the factors that PI, NTK, YaRN and Llama 3 imply (lambda_p = theta_p / theta_p') and
mutations of them. Each generation keeps the better half (the parents, never lost) and replaces the rest
with children: uniform crossover of two parents, then mutation (each factor, with probability
mutation_rate, multiplied by exp(N(0, mutation_scale^2))), projected back onto the space (clipped, rounded
to the grid, made non-decreasing by a running maximum). No candidate is scored twice.
"""

import dataclasses
import math
from typing import Callable, Optional

import numpy as np

import transformer
from experiments.runs import checkpoints, run_record, settings as run_settings
from experiments.evaluation import lineage, long_context, task_lengths
from transformer.positions.extension import ExtensionSettings, extended_frequencies, factor_list
from transformer.positions.rope import RotaryLayer

GRID = 0.01
UPPER = 1.25  # lambda_p <= UPPER * s


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  population: int = 16        # candidates per generation
  generations: int = 6        # generations after the first population
  mutation_rate: float = 0.3  # the chance that a factor of a child is mutated
  mutation_scale: float = 0.1  # the standard deviation of a mutation's log-factor
  seed: int = 0

  def check(self):
    """ValueError naming the first setting out of range."""
    for name, valid, ok in (('population', 'an integer >= 4', self.population >= 4),
                            ('generations', 'an integer >= 0', self.generations >= 0),
                            ('mutation_rate', 'a number in (0, 1]', 0.0 < self.mutation_rate <= 1.0),
                            ('mutation_scale', 'a number > 0', self.mutation_scale > 0.0)):
      if not ok:
        raise ValueError(f'--{name}: got {getattr(self, name)}; valid: {valid}')


def project(factors_P: np.ndarray, factor: float) -> tuple:
  """The nearest point of the space, as a tuple: clipped to [1, 1.25 s] (its highest grid point), on the grid,
  non-decreasing."""
  highest = math.floor(UPPER * factor / GRID + 1e-9) * GRID
  clipped = np.clip(np.asarray(factors_P, np.float64), 1.0, highest)
  gridded = np.round(clipped / GRID) * GRID
  return tuple(float(round(value, 2)) for value in np.maximum.accumulate(gridded))


def implied_factors(theta_P: np.ndarray, extended_P: np.ndarray) -> np.ndarray:
  """lambda_p = theta_p / theta_p' of a method that maps theta to theta' (1 for an unrotated pair)."""
  theta_P, extended_P = np.asarray(theta_P, np.float64), np.asarray(extended_P, np.float64)
  return np.where(theta_P > 0, theta_P / np.where(extended_P > 0, extended_P, 1.0), 1.0)


@dataclasses.dataclass(frozen=True)
class Candidate:
  factors: tuple
  score: float
  generation: int
  origin: str  # pi, ntk, yarn, llama3 (the first population's seeds), mutation, or child


def _mutate(factors_P: np.ndarray, settings: SearchSettings, rng: np.random.Generator) -> np.ndarray:
  mutated = rng.random(len(factors_P)) < settings.mutation_rate
  return factors_P * np.exp(np.where(mutated, rng.normal(0.0, settings.mutation_scale, len(factors_P)), 0.0))


def _novel(make: Callable[[], tuple], seen: set, attempts: int = 20):
  """A candidate not in `seen` from make(), or None after `attempts` tries."""
  for _ in range(attempts):
    candidate = make()
    if candidate not in seen:
      return candidate
  return None


def search(score: Callable[[tuple], float], starts: dict, factor: float, settings: SearchSettings,
           log: Callable[[Candidate], None] = lambda candidate: None) -> list:
  """Every candidate scored, best (lowest score) first. starts: {name: factors}, the first population's seeds
  (projected onto the space). score(factors) -> a finite number; log is called with each scored candidate."""
  settings.check()
  rng = np.random.default_rng(settings.seed)
  scored: dict = {}

  def evaluate(factors: tuple, generation: int, origin: str) -> None:
    value = float(score(factors))
    if not math.isfinite(value):
      raise FloatingPointError(f'the score of factors {factors} is {value}; nothing more was searched')
    scored[factors] = Candidate(factors, value, generation, origin)
    log(scored[factors])

  first = []
  for name, factors in starts.items():
    candidate = project(factors, factor)
    if candidate not in scored and len(first) < settings.population:
      evaluate(candidate, 0, name)
      first.append(candidate)
  while len(first) < settings.population:
    parent = np.asarray(first[rng.integers(len(first))])
    candidate = _novel(lambda: project(_mutate(parent, settings, rng), factor), set(scored))
    if candidate is None:
      break
    evaluate(candidate, 0, 'mutation')
    first.append(candidate)
  population = first
  for generation in range(1, settings.generations + 1):
    ranked = sorted(population, key=lambda f: scored[f].score)
    parents = ranked[:max(2, len(ranked) // 2)]
    children = []

    def child() -> tuple:
      mother, father = (np.asarray(parents[i]) for i in rng.choice(len(parents), 2, replace=False))
      mixed = np.where(rng.random(len(mother)) < 0.5, mother, father)
      return project(_mutate(mixed, settings, rng), factor)

    while len(parents) + len(children) < settings.population:
      candidate = _novel(child, set(scored))
      if candidate is None:
        break
      evaluate(candidate, generation, 'child')
      children.append(candidate)
    population = parents + children
  return sorted(scored.values(), key=lambda candidate: candidate.score)


# The problem experiments/longrope_search.py poses: runs of one RoPE configuration, scored at a length.

ROTARY = tuple(kind for kind, variant in transformer.VARIANTS.items() if issubclass(variant.layer, RotaryLayer))


def frequencies(config: transformer.ModelConfig) -> np.ndarray:
  """theta_p of the run's rotary variant for one head, from the variant's own layer (no parameters read)."""
  layer = config.position.variant.layer(settings=config.position.settings, num_heads=config.num_heads,
                                        head_dim=config.head_dim, model_dim=config.model_dim, num_layers=1,
                                        causal=True)
  return np.asarray(layer.frequencies(config.head_dim))


STARTS = ('pi', 'ntk', 'yarn', 'llama3')  # the methods whose implied factors seed the first population
TRAINED = 'trained'  # and, for a run trained with longrope (fine-tuned with searched factors), its long factors
ROPE = 'rope'  # a search of the short set also starts from factors of 1: RoPE as trained
SETS = ('long', 'short')  # the set searched: the long one past the original length, the short one within it


@dataclasses.dataclass(frozen=True)
class Problem:
  """What a candidate is scored on, checked before anything is written."""
  workdirs: tuple
  config: transformer.ModelConfig  # the runs' model
  resolved: dict                   # the first run's stored configuration
  task: object
  steps: tuple                     # each run's newest intact checkpoint
  original_length: int
  length: int
  text: Optional[np.ndarray]       # a language model: the last --tokens tokens of the held-out stream; else None
  first_token: int                 # where they start in it
  seeds: tuple = ()                # a task run: each run's seed, which draws its problems
  batches: int = 0                 # the evaluation batches scored per run, from first_batch on
  first_batch: int = 0             # the trainer's own evaluation batches end here: the search never reads them
  batch_size: int = 0
  factor_set: str = 'long'         # the set searched (SETS)
  long_factors: tuple = ()         # searching the short set: the long set, the run's own, kept as trained


def _check_seeds_of_one_configuration(workdirs: list) -> None:
  """ValueError unless the runs share one configuration and each seed comes once."""
  lineages = [lineage.of_run(workdir) for workdir in workdirs]
  for workdir, other in zip(workdirs[1:], lineages[1:]):
    if other.configuration != lineages[0].configuration:
      differing = sorted(k for k in set(other.configuration) | set(lineages[0].configuration)
                         if other.configuration.get(k) != lineages[0].configuration.get(k))
      raise ValueError(f'--workdir: {workdir} differs from {workdirs[0]} in {", ".join(differing[:3])}; valid: runs of '
                       f'one configuration (its seeds)')
  seeds = [run.seeds for run in lineages]
  if len(set(seeds)) < len(seeds):
    raise ValueError(f'--workdir: the runs\' seeds {seeds} repeat; valid: each seed once')


def pose_problem(workdirs: list, factor: float, length, tokens: int, batches: Optional[int] = None,
                 factor_set: str = 'long', corpus: str = '') -> Problem:
  """The runs (one configuration, each seed once, of a rotary variant), the factor s > 1, the length scored
  (None: the original length times s), and what is scored: a language model's held-out stream's last `tokens`
  (at most half of it; corpus: as checkpoints.run_model's), or a task run's `batches` evaluation batches after the
  trainer's own (None: as many as the trainer's); a ValueError names the flag and what would be valid. factor_set
  'short' searches the short set of runs trained with longrope at a length within the original one (None: the
  original length; a task's trained problem size), their long set kept, the set chosen by length."""
  _check_seeds_of_one_configuration(workdirs)
  config, task = checkpoints.run_model(workdirs[0], corpus)
  settings = config.position.settings
  if config.position.kind not in ROTARY or not isinstance(settings, ExtensionSettings):
    raise ValueError(f'--workdir: a {config.position.kind} run; valid: runs of {", ".join(ROTARY)}')
  if factor is None or not math.isfinite(factor) or factor <= 1.0:
    raise ValueError(f'--factor: got {factor}; valid: a finite number > 1, the length served over the original one')
  if factor_set not in SETS:
    raise ValueError(f'--set: got {factor_set!r}; valid: {", ".join(SETS)}')
  short = factor_set == 'short'
  if short and not (settings.rope_extension == 'longrope' and settings.longrope_long_factors):
    raise ValueError(f'--set: short for runs trained with rope_extension={settings.rope_extension}; valid: long, or '
                     'short for runs trained with longrope, whose long factors the search keeps')
  long_factors = factor_list(settings.longrope_long_factors) if short else ()
  resolved = run_record.stored_config(workdirs[0])
  original = settings.original_length or long_context.trained_positions(task)
  steps = tuple(checkpoints.newest_intact_step(workdir) for workdir in workdirs)
  if not task_lengths.reads_stream(task):  # lengths count a problem's size, not its tokens
    trained_size = int(resolved['task']['max_length'])
    length = length or (trained_size if short else int(round(trained_size * factor)))
    if short and length >= 1 and task.sequence_length(length) > original:
      raise ValueError(f'--length: got {length} with --set=short; valid: problems whose sequence is within the original '
                       f'length {original} (up to {trained_size}), which the short set serves')
    trained_batches = int(resolved['task']['eval_batches'])
    batches = trained_batches if batches is None else batches
    if batches < 1:
      raise ValueError(f'--batches: got {batches}; valid: a positive number of evaluation batches')
    if length < 1:
      raise ValueError(f'--length: got {length}; valid: a positive problem length')
    return Problem(tuple(workdirs), config, resolved, task, steps, original, length, None, 0,
                   seeds=tuple(int(run_record.stored_config(w)['seed']) for w in workdirs), batches=batches,
                   first_batch=trained_batches, batch_size=int(resolved['train']['batch_size']),
                   factor_set=factor_set, long_factors=long_factors)
  if batches is not None:
    raise ValueError(f'--batches: got {batches} for a {task.settings.name} run; valid: only for a task that draws its '
                     'own problems (a language model is scored on --tokens of its held-out stream)')
  length = length or (original if short else int(round(original * factor)))
  if short and length > original:
    raise ValueError(f'--length: got {length} with --set=short; valid: at most the original length {original}, '
                     'which the short set serves')
  stream = task.stream('eval')
  if not 0 < tokens <= len(stream) // 2:
    raise ValueError(f'--tokens: got {tokens}; valid: 1 to {len(stream) // 2}, half the held-out stream (the search '
                     f'reads its end, evaluations its start)')
  if not 2 <= length <= tokens:
    raise ValueError(f'--length: got {length}; valid: 2 to --tokens ({tokens})')
  return Problem(tuple(workdirs), config, resolved, task, steps, original, length,
                 np.asarray(stream[len(stream) - tokens:]), len(stream) - tokens, factor_set=factor_set,
                 long_factors=long_factors)


def factor_sets(problem: Problem, factors: tuple) -> tuple:
  """(short, long) with the candidate in the set searched: short factors of 1 (RoPE as trained up to the
  original length) beside a long candidate, or the run's long set beside a short one."""
  if problem.factor_set == 'short':
    return tuple(factors), tuple(problem.long_factors)
  return (1.0,) * len(factors), tuple(factors)


def request(problem: Problem, factor: float, factors: tuple, batch_size: int = 8) -> long_context.Request:
  """longrope at s with the candidate in its set (factor_sets), over non-overlapping windows of the text; a
  short candidate is read with the set chosen by length, so the length scored takes it."""
  short, long = (' '.join(map(repr, values)) for values in factor_sets(problem, factors))
  by_length = (('longrope_by_length', True),) if problem.factor_set == 'short' else ()
  return long_context.Request(
      method='longrope', factor=factor, protocol='windows', stride_fraction=0.5,
      tokens=0 if problem.text is None else len(problem.text),  # a task run reads its batches, not a stream
      batch_size=batch_size,
      position_overrides=(('longrope_short_factors', short), ('longrope_long_factors', long)) + by_length)


def method_starts(problem: Problem, factor: float) -> dict:
  """{method: the factors it implies} for the first population, and {'trained': its long factors} for runs
  trained with longrope: a search after fine-tuning (the paper's order for its longest models) starts from
  the factors the model was fine-tuned with, so it can only improve on them on the search's text. A search
  of the short set starts from factors of 1 ('rope') and from the run's long set ('trained')."""
  settings = problem.config.position.settings
  theta_P = frequencies(problem.config)
  if problem.factor_set == 'short':  # within the original length: RoPE as trained, and the long set it was tuned with
    return {ROPE: np.ones(len(theta_P)), TRAINED: np.asarray(problem.long_factors)}
  implied = {}
  for method in STARTS:
    method_settings = dataclasses.replace(settings, rope_extension=method, extension_factor=factor,
                                          original_length=problem.original_length)
    implied[method] = implied_factors(theta_P, extended_frequencies(theta_P, method_settings)[0])
  if settings.rope_extension == 'longrope' and settings.longrope_long_factors:
    implied[TRAINED] = np.asarray(factor_list(settings.longrope_long_factors))
  return implied


def scorer(problem: Problem, factor: float, params: list, batch_size: int = 8):
  """factors -> the runs' mean bits per character (per byte for a corpus) at the length; for a task run, their
  mean cross-entropy on the problems of the search's batches."""

  def score(factors: tuple) -> float:
    scored = request(problem, factor, factors, batch_size)
    config, _ = long_context.extended_config(problem.config, problem.original_length, scored)
    if problem.text is None:
      kind = problem.task.settings.model_kind
      sums = task_lengths.sums_function(transformer.build_model(config, kind), problem.task)
      records = [task_lengths.evaluate_length(sums, run_params, problem.task, seed, problem.length, problem.batch_size,
                                              problem.batches, problem.first_batch, run_settings.width_cap(config, kind))
                 for run_params, seed in zip(params, problem.seeds)]
      return float(np.mean([record['cross_entropy'] for record in records]))
    bits = long_context.bits_function(transformer.build_model(config, 'decoder_only'))
    records = [long_context.evaluate_length(bits, run_params, problem.text, problem.task.bos, problem.length, scored,
                                            getattr(problem.task, 'token_bytes', None),
                                            getattr(problem.task, 'packed_rows', None)) for run_params in params]
    return float(np.mean([record[long_context.record_metric(record)] for record in records]))

  return score
