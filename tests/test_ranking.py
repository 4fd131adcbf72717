"""Mean reciprocal rank over tasks (experiments/sweeps/ranking.py, python -m experiments.rank), against
rankings worked by hand, and the protocol's configs (configs/length_generalization.py)."""

import json
import os
import pathlib
import sys

import pytest

from experiments.sweeps import ranking, results
from tests import command_server

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ranks_share_the_mean_rank_of_a_tie():
  assert ranking.ranks({'a': 0.9, 'b': 0.5, 'c': 0.9, 'd': 0.1}, higher_is_better=True) == {
      'a': 1.5, 'c': 1.5, 'b': 3, 'd': 4}
  assert ranking.ranks({'a': 2.4, 'b': 2.9, 'c': 2.6}, higher_is_better=False) == {'a': 1, 'c': 2, 'b': 3}


def _run(sweep, variant, seed, training_length, accuracies, task='copy'):
  """A finished run whose final evaluation has sequence_accuracy accuracies[length]."""
  workdir = sweep / f'{variant}-seed{seed}'
  workdir.mkdir(parents=True)
  config = {'seed': seed, 'task': {'name': task, 'max_length': training_length},
            'model': {'architecture': 'transformer', 'position': {'kind': variant}}, 'train': {'steps': 10}}
  (workdir / 'config.json').write_text(json.dumps(config))
  (workdir / 'metrics.jsonl').write_text(''.join(
      json.dumps({'step': 10, 'split': 'eval', 'length': length, 'sequence_accuracy': value}) + '\n'
      for length, value in accuracies.items()))
  (workdir / 'summary.json').write_text(json.dumps({'step': 10, 'evaluation': {}}))


# Scores beyond the training length (the mean over lengths > L) by task, variant and seed:
#   copy (L=4):   a 0.9/0.7, b 0.5/0.8, c 0.1/0.1  -> ranks seed 0: a1 b2 c3; seed 1: b1 a2 c3
#   parity (L=2): a 0.2/0.2, b 0.6/0.6, c 0.6/0.1  -> seed 0: b,c tie 1.5, a3; seed 1: b1 a2 c3
SCORES = {'copy': {'a': (0.9, 0.7), 'b': (0.5, 0.8), 'c': (0.1, 0.1)},
          'parity': {'a': (0.2, 0.2), 'b': (0.6, 0.6), 'c': (0.6, 0.1)}}
MRR_BY_HAND = {'a': {0: (1 + 1 / 3) / 2, 1: (1 / 2 + 1 / 2) / 2},
               'b': {0: (1 / 2 + 1 / 1.5) / 2, 1: (1 + 1) / 2},
               'c': {0: (1 / 3 + 1 / 1.5) / 2, 1: (1 / 3 + 1 / 3) / 2}}


def _sweeps(tmp_path):
  lengths = {'copy': 4, 'parity': 2}
  for task, by_variant in SCORES.items():
    for variant, per_seed in by_variant.items():
      for seed, score in enumerate(per_seed):
        # at L the score is perfect (ignored); beyond it two lengths whose mean is the score
        _run(tmp_path / task, variant, seed, lengths[task],
             {lengths[task]: 1.0, 2 * lengths[task]: score + 0.05, 3 * lengths[task]: score - 0.05}, task)
  return [str(tmp_path / task) for task in SCORES]


def test_mean_reciprocal_rank_by_hand(tmp_path):
  tables = {task: results.aggregate(sweep, ['a', 'b', 'c'], 2) for task, sweep in zip(SCORES, _sweeps(tmp_path))}
  ranked = ranking.rank_sweeps(tables, 'sequence_accuracy')
  assert ranked.seeds == [0, 1] and ranked.beyond == {'copy': [8, 12], 'parity': [4, 6]}
  for variant, per_seed in MRR_BY_HAND.items():
    for seed, value in per_seed.items():
      assert ranked.reciprocal_ranks[variant][seed] == pytest.approx(value, abs=1e-12)
  text = ranking.markdown(ranked)
  assert text.index('| b | ') < text.index('| a | ') < text.index('| c | ')  # by mean MRR: b 0.79, a 0.58, c 0.42


@pytest.mark.slow
def test_the_rank_command_prints_and_writes_the_table(tmp_path):
  output = tmp_path / 'ranking.md'
  result = command_server.run([sys.executable, '-m', 'experiments.rank', f'--sweeps={",".join(_sweeps(tmp_path))}',
                               f'--output={output}'], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert output.read_text() in result.stdout
  assert 'Mean reciprocal rank over 2 tasks (sequence_accuracy beyond the training length' in result.stdout
  assert '| variant | MRR | copy rank | parity rank |' in result.stdout


@pytest.mark.slow
def test_a_sweep_whose_runs_differ_is_refused(tmp_path):
  sweeps = _sweeps(tmp_path)
  config_path = tmp_path / 'parity' / 'c-seed1' / 'config.json'
  config = json.loads(config_path.read_text())
  config['train']['steps'] = 20
  config_path.write_text(json.dumps(config))
  (tmp_path / 'parity' / 'c-seed1' / 'summary.json').write_text(json.dumps({'step': 20, 'evaluation': {}}))
  result = command_server.run([sys.executable, '-m', 'experiments.rank', f'--sweeps={",".join(sweeps)}'], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip() == (f'error: {tmp_path / "parity"}: c-seed1 and a-seed0 differ in train.steps (20 and '
                                   f'10); a ranking would mix configurations')


def test_sweeps_of_other_variants_are_refused(tmp_path):
  _run(tmp_path / 'one', 'a', 0, 2, {4: 0.5})
  _run(tmp_path / 'two', 'b', 0, 2, {4: 0.5})
  tables = {'one': results.aggregate(str(tmp_path / 'one'), ['a'], 1),
            'two': results.aggregate(str(tmp_path / 'two'), ['b'], 1)}
  with pytest.raises(ranking.RankingError, match=r'two: its variants \(b\) are not those of one \(a\)'):
    ranking.rank_sweeps(tables, 'sequence_accuracy')


@pytest.mark.parametrize('task,training,longest', [('copy', 20, 40), ('reverse', 20, 40), ('addition', 8, 16),
                                                   ('sort', 8, 16), ('parity', 8, 16)])
def test_the_protocol_configs_have_kazemnejads_lengths(task, training, longest):
  from configs import length_generalization  # pylint: disable=g-import-not-at-top
  config = length_generalization.get_config(task)
  assert config.task.name == task and config.task.model_kind == 'decoder_only'
  assert config.task.min_length == 1 and config.task.max_length == training
  assert max(config.task.eval_lengths) == longest and any(l > training for l in config.task.eval_lengths)
