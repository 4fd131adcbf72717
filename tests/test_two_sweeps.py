"""Two sweeps under one treatment (experiments/sweeps/two_sweeps.py, python -m experiments.compare_sweeps): the paired
differences against scipy's paired t-test, the ranks and Kendall's tau against orders worked by hand, and the
refusal of sweeps of another task or budget. The sweeps are finished runs written here, without training."""

import json
import os
import pathlib
import sys

import numpy as np
import pytest
from scipy import stats

from experiments.sweeps import stored_sweep, two_sweeps
from tests import command_server

ROOT = pathlib.Path(__file__).resolve().parent.parent

# bits per character at lengths 4 (trained) and 8, seeds 0-2, in A (norm_type layernorm) and B (rmsnorm):
# at 4 both orders are a < b < c; at 8 B reverses A's order.
SCORES = {'A': {'a': {4: (1.0, 1.1, 1.2), 8: (1.0, 1.2, 1.1)}, 'b': {4: (2.0, 2.1, 2.2), 8: (2.0, 2.2, 2.1)},
                'c': {4: (3.0, 3.1, 3.2), 8: (3.0, 3.2, 3.1)}},
          'B': {'a': {4: (1.5, 1.5, 1.9), 8: (3.6, 3.6, 3.7)}, 'b': {4: (2.0, 2.2, 2.2), 8: (2.5, 2.6, 2.4)},
                'c': {4: (3.1, 3.0, 3.3), 8: (1.1, 1.2, 1.1)}}}


def _sweep(path, scores, norm_type, steps=10):
  for variant, by_length in scores.items():
    for seed in range(3):
      workdir = path / f'{variant}-seed{seed}'
      workdir.mkdir(parents=True)
      config = {'seed': seed, 'task': {'name': 'shakespeare', 'max_length': 4},
                'model': {'architecture': 'transformer', 'norm_type': norm_type, 'position': {'kind': variant}},
                'train': {'steps': steps}}
      (workdir / 'config.json').write_text(json.dumps(config))
      (workdir / 'metrics.jsonl').write_text(''.join(
          json.dumps({'step': steps, 'split': 'eval', 'length': length, 'bits_per_character': values[seed]}) + '\n'
          for length, values in by_length.items()))
      (workdir / 'summary.json').write_text(json.dumps({'step': steps, 'evaluation': {}}))
  return str(path)


def _compared(tmp_path, steps_b=10):
  read = [stored_sweep.read(_sweep(tmp_path / label, SCORES[label], norm, steps))
          for label, norm, steps in (('A', 'layernorm', 10), ('B', 'rmsnorm', steps_b))]
  return two_sweeps.compare(('A', 'B'), tuple(t for _, t, _ in read), tuple(c for _, _, c in read),
                            'bits_per_character')


def test_paired_differences_are_scipys_paired_t_test(tmp_path):
  compared = _compared(tmp_path)
  for variant in 'abc':
    for length in (4, 8):
      b, a = np.array(SCORES['B'][variant][length]), np.array(SCORES['A'][variant][length])
      mean, half_width, seeds, significant = compared.differences[variant][length]
      assert seeds == 3 and mean == pytest.approx(np.mean(b - a), abs=1e-12)
      interval = stats.ttest_rel(b, a).confidence_interval(0.95)
      assert half_width == pytest.approx((interval.high - interval.low) / 2, rel=1e-9)
      assert significant == (stats.ttest_rel(b, a).pvalue < 0.05)
  assert compared.differences['a'][8][3] and not compared.differences['b'][4][3]  # both cases occur
  assert compared.treatment == [('model.norm_type', 'layernorm', 'rmsnorm')]


def test_ranks_and_kendalls_tau_follow_the_orders(tmp_path):
  compared = _compared(tmp_path)
  assert compared.ranks['A'][8] == {'a': 1, 'b': 2, 'c': 3}
  assert compared.ranks['B'][4] == {'a': 1, 'b': 2, 'c': 3} and compared.ranks['B'][8] == {'c': 1, 'b': 2, 'a': 3}
  assert compared.kendall[4][0] == pytest.approx(1.0) and compared.kendall[8][0] == pytest.approx(-1.0)
  text = two_sweeps.markdown(compared)
  assert 'They differ in: model.norm_type (\'layernorm\' in A, \'rmsnorm\' in B)' in text
  assert '| a | 1 -> 1 | 1 -> 3 |' in text


def test_sweeps_of_another_budget_are_refused(tmp_path):
  with pytest.raises(two_sweeps.SweepsError, match=r'a: train.steps is 10 in one sweep and 20 in the other; valid: '
                                                   r'sweeps of the same task and training budget'):
    _compared(tmp_path, steps_b=20)


@pytest.mark.slow
def test_the_command_prints_and_writes_the_tables(tmp_path):
  output = tmp_path / 'blocks.md'
  sweeps = [_sweep(tmp_path / label, SCORES[label], norm) for label, norm in (('A', 'layernorm'), ('B', 'rmsnorm'))]
  result = command_server.run([sys.executable, '-m', 'experiments.compare_sweeps', f'--sweeps={",".join(sweeps)}',
                               f'--output={output}'], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert output.read_text() in result.stdout
  assert '### bits_per_character: B - A, paired over the seeds both finished' in result.stdout
  one = command_server.run([sys.executable, '-m', 'experiments.compare_sweeps', f'--sweeps={sweeps[0]}'], cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
  assert one.returncode == 2 and 'valid: two compare sweep directories, A,B' in one.stderr
