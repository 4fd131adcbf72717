"""LongRoPE's factor search: the space (bounds, grid, monotone), the factors PI and NTK imply (closed forms),
the evolution on a score with a known optimum, and the command on a trained run, scored by hand."""

import json
import math
import sys

import jax
import numpy as np
import pytest

import transformer
from experiments.runs import checkpoints, trainer
from experiments.evaluation import factor_search, rope_scaling
from tests import command_server
from tests.helpers import ROOT, smoke_experiment, subprocess_environment
from tests.test_long_context import TINY_SHAKESPEARE
from transformer.positions.extension import extended_frequencies, ExtensionSettings
from transformer.positions.rope import rope_frequencies


def test_projection_clips_rounds_and_makes_the_factors_non_decreasing():
  assert factor_search.project([0.5, 3.333, 2.0, 40.0], 8.0) == (1.0, 3.33, 3.33, 10.0)
  rng = np.random.default_rng(0)
  for _ in range(50):
    factor = float(rng.uniform(1.5, 32))
    projected = np.array(factor_search.project(np.exp(rng.normal(0, 2, 16)), factor))
    assert np.all(np.diff(projected) >= 0) and projected.min() >= 1.0 and projected.max() <= 1.25 * factor + 1e-9
    np.testing.assert_allclose(projected * 100, np.round(projected * 100), atol=1e-6)


@pytest.mark.parametrize('head_dim,factor', [(32, 16.0), (64, 4.0)])
def test_the_factors_pi_and_ntk_imply_are_their_closed_forms(head_dim, factor):
  theta_P = np.asarray(rope_frequencies(head_dim))
  for method, expected_P in (('pi', np.full(head_dim // 2, factor)),
                             # NTK: base' = base s^(d / (d - 2)), so theta_p / theta_p' = s^(2p / (d - 2))
                             ('ntk', factor ** (2 * np.arange(head_dim // 2) / (head_dim - 2)))):
    settings = ExtensionSettings(rope_extension=method, extension_factor=factor, original_length=128)
    implied = factor_search.implied_factors(theta_P, np.asarray(extended_frequencies(theta_P, settings)[0]))
    np.testing.assert_allclose(implied, expected_P, rtol=1e-4)


def _distance_to(target):
  log_target = np.log(target)
  return lambda factors: float(np.sum((np.log(factors) - log_target) ** 2))


def test_the_search_approaches_a_known_optimum_and_keeps_to_its_space():
  factor, pairs = 8.0, 12
  target = factor_search.project(1.0 + 9.0 / (1.0 + np.exp(-(np.arange(pairs) - 6.0))), factor)
  starts = {'pi': np.full(pairs, factor), 'flat': np.ones(pairs)}
  settings = factor_search.SearchSettings(population=12, generations=25, seed=3)
  logged = []
  ranked = factor_search.search(_distance_to(target), starts, factor, settings, logged.append)
  assert [c.factors for c in logged[:2]] == [factor_search.project(f, factor) for f in starts.values()]
  assert [c.origin for c in logged[:2]] == ['pi', 'flat'] and logged[2].origin == 'mutation'
  best_start = min(c.score for c in ranked if c.origin in starts)
  assert ranked[0].score < 0.2 * best_start
  assert len({c.factors for c in ranked}) == len(ranked) == len(logged)  # nothing scored twice
  assert len(ranked) <= 12 + 25 * 6
  for candidate in ranked:
    assert candidate.factors == factor_search.project(candidate.factors, factor)
  again = factor_search.search(_distance_to(target), starts, factor, settings)
  assert [c.factors for c in again] == [c.factors for c in ranked]  # the seed decides


def test_a_score_that_is_not_finite_stops_the_search():
  with pytest.raises(FloatingPointError, match='score of factors'):
    factor_search.search(lambda factors: math.nan, {'pi': [2.0, 2.0]}, 2.0, factor_search.SearchSettings(4, 1))


def test_a_run_trained_with_longrope_starts_the_search_from_its_own_factors():
  """A search after fine-tuning: the first population holds the long factors the run was trained with,
  beside the factors PI, NTK, YaRN and Llama 3 imply; a run trained without them adds nothing."""
  trained = '1.0 1.5 2.0 4.0 8.0 16.0 16.0 20.0'
  starts = {}
  for extension in ({}, dict(rope_extension='longrope', extension_factor=16.0, original_length=16,
                             longrope_short_factors=' '.join(['1.0'] * 8), longrope_long_factors=trained)):
    config = transformer.ModelConfig(model_dim=32, num_heads=2, position=transformer.PositionConfig('rope', **extension))
    problem = factor_search.Problem(workdirs=('run',), config=config, resolved={}, task=None, steps=(1,),
                                    original_length=16, length=256, text=None, first_token=0)
    starts[bool(extension)] = factor_search.method_starts(problem, 16.0)
  assert list(starts[False]) == list(factor_search.STARTS)
  assert list(starts[True]) == [*factor_search.STARTS, factor_search.TRAINED]
  np.testing.assert_array_equal(starts[True]['trained'], [float(f) for f in trained.split()])
  np.testing.assert_array_equal(starts[True]['pi'], starts[False]['pi'])


@pytest.mark.parametrize('field,value,message', [('population', 3, '--population: got 3'),
                                                 ('mutation_rate', 0.0, '--mutation_rate: got 0.0')])
def test_bad_search_settings_name_the_flag(field, value, message):
  with pytest.raises(ValueError, match=message):
    factor_search.SearchSettings(**{field: value}).check()


def _search(*arguments):
  return command_server.run([sys.executable, '-m', 'experiments.longrope_search', *arguments], cwd=ROOT,
                            env=subprocess_environment(1), capture_output=True, text=True, timeout=600)


def _bits_by_hand(workdir: str, factors: tuple, factor: float, length: int, tokens: int, original: int = 16,
                  short: tuple = None, by_length: bool = False) -> float:
  """Mean bits per character over non-overlapping windows of the held-out stream's last `tokens`, each
  window BOS then its tokens, position 0 unscored, from a model configured here: longrope at `factor` with
  long `factors` and `short` ones (None: 1)."""
  config, task = checkpoints.run_model(workdir)
  short = short or (1,) * len(factors)
  fields = dict(config.position.fields(), rope_extension='longrope', extension_factor=factor, original_length=original,
                longrope_short_factors=' '.join(str(f) for f in short),
                longrope_long_factors=' '.join(str(f) for f in factors), longrope_by_length=by_length)
  kind = fields.pop('kind')
  model = transformer.build_model(config.replace(position=transformer.PositionConfig(kind, **fields)), 'decoder_only')
  params = checkpoints.restore_params(workdir, checkpoints.newest_intact_step(workdir))
  apply = jax.jit(lambda inputs: model.apply({'params': params}, inputs, valid_BxL=jax.numpy.ones(inputs.shape, bool)))
  text = np.asarray(task.stream('eval'))[-tokens:]
  total, count = 0.0, 0
  for start in range(0, tokens - length + 1, length):
    targets = text[start:start + length]
    inputs = np.concatenate([[task.bos], targets[:-1]])[None].astype(np.int32)
    logits = apply(inputs)
    log_probabilities = np.asarray(jax.nn.log_softmax(logits[0].astype(np.float32)), np.float64)
    total += -sum(log_probabilities[p, targets[p]] for p in range(1, length)) / math.log(2)
    count += length - 1
  return total / count


@pytest.mark.slow
def test_the_command_writes_factors_that_evaluate_reads_and_scores_them_as_computed_by_hand(tmp_path):
  rope, alibi = str(tmp_path / 'rope'), str(tmp_path / 'alibi')
  trainer.run(smoke_experiment(**TINY_SHAKESPEARE), rope)
  output = tmp_path / 'search'
  searched = _search(f'--workdir={rope}', '--factor=4', '--tokens=256', '--population=4', '--generations=1',
                     f'--output={output}')
  assert searched.returncode == 0, searched.stderr[-2000:]
  written = json.loads((output / 'config.json').read_text())
  overrides = dict(rope_scaling.longrope_overrides(str(output / 'config.json')))
  factors = tuple(written['rope_scaling']['long_factor'])
  assert overrides['longrope_short_factors'] == ' '.join(['1.0'] * len(factors)) and len(factors) == 8  # heads of 16
  assert list(factors) == sorted(factors) and min(factors) >= 1.0 and max(factors) <= 5.0
  lines = [json.loads(line) for line in (output / 'search.jsonl').read_text().splitlines()]
  assert [line['origin'] for line in lines[:4]] == ['pi', 'ntk', 'yarn', 'llama3'] and len(lines) == 6
  search = written['longrope_search']
  assert search['length'] == 64 and search['score'] == min(line['score'] for line in lines)
  assert search['first_token'] >= len(checkpoints.run_model(rope)[1].stream('eval')) // 2  # never where evaluate reads
  for line in (lines[0], min(lines, key=lambda line: line['score'])):
    assert line['score'] == pytest.approx(_bits_by_hand(rope, tuple(line['factors']), 4.0, 64, 256), rel=1e-5)

  again = _search(f'--workdir={rope}', '--factor=4', f'--output={output}')
  assert again.returncode == 2 and again.stderr.startswith(f'error: --output: {output} is not empty; valid: a new')
  assert [line['factors'] for line in map(json.loads, (output / 'search.jsonl').read_text().splitlines())] == [
      line['factors'] for line in lines]  # the refused search wrote nothing

  trainer.run(smoke_experiment(**dict(TINY_SHAKESPEARE, **{'model.position.kind': 'alibi'})), alibi)
  for workdirs, factor, tokens, expected in (
      ([rope, alibi], 4.0, 256, f'--workdir: {alibi} differs from {rope} in model.position.'),
      ([alibi], 4.0, 256, '--workdir: a alibi run; valid: runs of rope, xpos, p_rope'),
      ([rope, rope], 4.0, 256, "--workdir: the runs' seeds [(0,), (0,)] repeat"),
      ([rope], 1.0, 256, '--factor: got 1.0; valid: a finite number > 1'),
      ([rope], float('nan'), 256, '--factor: got nan; valid: a finite number > 1'),
      ([rope], float('inf'), 256, '--factor: got inf; valid: a finite number > 1'),
      ([rope], 4.0, 10 ** 7, '--tokens: got 10000000; valid: 1 to'),
      ([rope], 4.0, 32, '--length: got 64; valid: 2 to --tokens (32)')):
    with pytest.raises(ValueError) as refused:
      factor_search.pose_problem(workdirs, factor, None, tokens)
    assert str(refused.value).startswith(expected), refused.value


TRAINED_LONG = (1.0, 1.2, 1.5, 2.0, 2.0, 2.5, 2.5, 2.5)


@pytest.mark.slow
def test_the_short_set_is_searched_within_the_original_length_beside_the_runs_long_set(tmp_path):
  """A run trained at 16 with longrope (L = 8, s = 2, its long set): --set=short scores candidates at 8 with
  the set chosen by length, starts from ones and the run's long set, and writes the short set found beside
  the run's long one; the best score is the bits computed here with that short set. A run without longrope,
  a length past L and an unknown set are refused naming the flag."""
  run = str(tmp_path / 'run')
  trainer.run(smoke_experiment(**dict(TINY_SHAKESPEARE, **{
      'model.position.rope_extension': 'longrope', 'model.position.extension_factor': 2.0,
      'model.position.original_length': 8, 'model.position.longrope_short_factors': ' '.join(['1.0'] * 8),
      'model.position.longrope_long_factors': ' '.join(map(str, TRAINED_LONG))})), run)
  output = tmp_path / 'search'
  searched = _search(f'--workdir={run}', '--factor=2', '--set=short', '--tokens=256', '--population=4',
                     '--generations=1', f'--output={output}')
  assert searched.returncode == 0, searched.stderr[-2000:]
  written = json.loads((output / 'config.json').read_text())
  lines = [json.loads(line) for line in (output / 'search.jsonl').read_text().splitlines()]
  best = min(lines, key=lambda line: line['score'])
  assert [line['origin'] for line in lines[:2]] == ['rope', 'trained'] and lines[1]['factors'] == list(TRAINED_LONG)
  assert written['rope_scaling']['long_factor'] == list(TRAINED_LONG)
  assert written['rope_scaling']['short_factor'] == best['factors']
  assert written['longrope_search']['set'] == 'short' and written['longrope_search']['length'] == 8
  for line in (lines[0], best):
    assert line['score'] == pytest.approx(_bits_by_hand(run, TRAINED_LONG, 2.0, 8, 256, original=8,
                                                        short=tuple(line['factors']), by_length=True), rel=1e-5)
  assert lines[0]['score'] != pytest.approx(_bits_by_hand(run, TRAINED_LONG, 2.0, 8, 256, original=8), rel=1e-3)

  plain = str(tmp_path / 'plain')
  trainer.run(smoke_experiment(**TINY_SHAKESPEARE), plain)
  for workdir, length, factor_set, expected in (
      (plain, None, 'short', '--set: short for runs trained with rope_extension=none; valid: long, or short'),
      (run, 9, 'short', '--length: got 9 with --set=short; valid: at most the original length 8'),
      (run, None, 'medium', "--set: got 'medium'; valid: long, short")):
    with pytest.raises(ValueError) as refused:
      factor_search.pose_problem([workdir], 2.0, length, 256, factor_set=factor_set)
    assert str(refused.value).startswith(expected), refused.value
