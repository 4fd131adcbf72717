"""A finished run of a task that draws its own problems (copy) evaluated at any lengths, with or without a
context extension (experiments/evaluation/task_lengths.py through long_context.py and experiments.evaluate)."""

import json
import os
import sys

import numpy as np
import pytest
from scipy import stats

import transformer
from experiments.runs import checkpoints, trainer
from experiments.evaluation import length_table, long_context, task_lengths
from tests import command_server
from tests.helpers import ROOT, smoke_experiment, subprocess_environment
from tests.test_long_context import _request  # a task run's evaluation ignores its stream fields

TINY_COPY = {'task.model_kind': 'decoder_only', 'task.eval_batches': 2, 'model.position.kind': 'rope', 'seed': 3}


@pytest.fixture(scope='module')
def copy_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('runs') / 'rope')
  trainer.run(smoke_experiment(**TINY_COPY), workdir)
  return workdir


def test_a_task_runs_table_shows_its_headline_metric_over_seeds_with_no_position_view(tmp_path):
  """Results lines as a task run's evaluation writes them (the task's metrics, and which one a table shows):
  the table's score is token accuracy, its mean and t interval over seeds from scipy, no by_position.md."""
  evaluations = []
  for seed, accuracies in enumerate(((1.0, 0.25), (0.98, 0.5), (1.0, 0.75))):
    run = tmp_path / f'rope-seed{seed}'
    run.mkdir()
    (run / 'config.json').write_text(json.dumps(dict(seed=seed, task=dict(name='copy', max_length=16),
                                                     model=dict(position=dict(kind='rope')), train=dict(steps=10))))
    results = {length: dict(length=length, token_accuracy=accuracy, sequence_accuracy=0.0, loss=1.0,
                            headline='token_accuracy', examples=128)
               for length, accuracy in zip((16, 32), accuracies)}
    description = dict(run=str(run), method='none', factor=1.0, position_overrides=[], trained_length=16,
                       checkpoint_step=10, protocol='task', eval_batches=2, eval_batch_size=64)
    evaluations.append((str(run / 'evaluations' / 'none-batches2x64'), description, results))
  rows = length_table.group(evaluations)
  assert length_table.metric_of(rows) == ('token_accuracy', 'token accuracy')
  protocol = long_context.protocol_text(long_context.protocol_of(evaluations[0][1]))
  written = length_table.write(str(tmp_path / 'table'), rows, [16, 32], 16, protocol)
  assert [os.path.basename(path) for path in written] == ['results.md', 'results.csv', 'plot_extension.png']
  table = (tmp_path / 'table' / 'results.md').read_text()
  half_width = stats.t.ppf(0.975, 2) * np.std([0.25, 0.5, 0.75], ddof=1) / np.sqrt(3)
  assert f'| rope | 3 | 0.993 ± {stats.t.ppf(0.975, 2) * np.std([1.0, 0.98, 1.0], ddof=1) / np.sqrt(3):.3f} | ' \
         f'0.500 ± {half_width:.3f} |' in table
  assert ("Token accuracy on each run's evaluation problems (the trainer's 2 evaluation batches of 64 problems, "
          "drawn from each run's seed; the first run was trained at 16)") in table
  assert long_context.default_name(_request('yarn', 4.0), (2, 64)) == 'yarn-x4-batches2x64'


def _trainer_records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as file:
    records = [json.loads(line) for line in file]
  final = max(r['step'] for r in records if r['split'] == 'eval')
  return {r['length']: r for r in records if r['split'] == 'eval' and r['step'] == final}


@pytest.mark.slow
def test_the_run_as_trained_gives_the_trainers_own_evaluation_numbers(copy_run):
  """The same problems (the run's seed, its evaluation batches) through the trainer's loop and through
  this evaluation: the same token and sequence accuracy and loss at every evaluation length."""
  trained = _trainer_records(copy_run)
  directory, results = long_context.evaluate_run(copy_run, [6, 12], _request(), log=lambda line: None)
  assert directory == os.path.join(copy_run, 'evaluations', 'none-batches2x16')
  for length in (6, 12):
    assert results[length]['examples'] == 32 and results[length]['headline'] == 'token_accuracy'
    for metric in ('token_accuracy', 'sequence_accuracy', 'loss', 'cross_entropy'):
      np.testing.assert_allclose(results[length][metric], trained[length][metric], rtol=1e-6, err_msg=metric)
  with open(os.path.join(directory, 'evaluation.json')) as file:
    description = json.load(file)
  assert (description['protocol'], description['seed'], description['eval_batches'],
          description['eval_batch_size']) == ('task', 3, 2, 16)
  assert 'tokens' not in description and 'stride_fraction' not in description
  assert (description['trained_length'], description['original_length']) == (6, 14)  # copy at 6: 14 tokens


@pytest.mark.slow
def test_an_extension_changes_the_model_beyond_its_length_and_factor_one_does_not(copy_run):
  _, plain = long_context.evaluate_run(copy_run, [12], _request(), log=lambda line: None)
  _, pi_one = long_context.evaluate_run(copy_run, [12], _request('pi', 1.0), name='pi-one', log=lambda line: None)
  assert pi_one[12]['loss'] == plain[12]['loss']
  directory, yarn = long_context.evaluate_run(copy_run, [12], _request('yarn', 4.0), log=lambda line: None)
  assert directory.endswith(os.path.join('evaluations', 'yarn-x4-batches2x16'))
  assert yarn[12]['loss'] != plain[12]['loss']
  with open(os.path.join(directory, 'results.jsonl'), 'rb') as file:
    written = file.read()
  _, again = long_context.evaluate_run(copy_run, [12], _request('yarn', 4.0), log=lambda line: None)
  assert again == yarn
  with open(os.path.join(directory, 'results.jsonl'), 'rb') as file:
    assert file.read() == written
  with pytest.raises(ValueError, match='records another evaluation.*factor'):
    long_context.evaluate_run(copy_run, [12], _request('yarn', 8.0), name='yarn-x4-batches2x16')


@pytest.mark.slow
def test_the_command_tabulates_a_task_run_by_its_headline_metric_and_refuses_stream_flags(copy_run, tmp_path):
  output = tmp_path / 'table'
  command = [sys.executable, '-m', 'experiments.evaluate', f'--workdir={copy_run}', '--lengths=6,12,24',
             '--extension=none,ntk', '--factor=4', f'--output={output}']
  done = command_server.run(command, env=subprocess_environment(), capture_output=True, text=True, cwd=ROOT,
                            check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  table = (output / 'results.md').read_text()
  assert '| rope | 1 |' in table and '| rope + ntk x4 | 1 |' in table
  assert "Token accuracy on each run's evaluation problems (the trainer's 2 evaluation batches of 16" in table
  own = json.loads((ROOT / copy_run / 'evaluations' / 'ntk-x4-batches2x16' / 'results.jsonl').read_text()
                   .splitlines()[-1])
  assert own['length'] == 24 and f'{own["token_accuracy"]:.3f}' in table.split('| rope + ntk x4 | 1 |')[1]
  assert not (output / 'by_position.md').exists() and (output / 'plot_extension.png').stat().st_size > 0
  for flag in ('--tokens=300', '--protocol=windows'):
    refused = command_server.run(command[:-1] + [flag, f'--output={tmp_path / "refused"}'],
                                 env=subprocess_environment(), capture_output=True, text=True, cwd=ROOT, check=False)
    assert refused.returncode != 0 and f'{flag.split("=")[0]}: set for {copy_run}, a copy run' in refused.stderr
    assert not (tmp_path / 'refused').exists()


@pytest.mark.slow
def test_the_factor_search_scores_problems_after_the_trainers_own_and_evaluate_reads_its_factors(copy_run, tmp_path):
  output = tmp_path / 'search'
  search = [sys.executable, '-m', 'experiments.longrope_search', f'--workdir={copy_run}', '--factor=4',
            '--population=4', '--generations=1']
  done = command_server.run(search + [f'--output={output}'], env=subprocess_environment(), capture_output=True,
                            text=True, cwd=ROOT, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  searched = json.loads((output / 'config.json').read_text())['longrope_search']
  assert (searched['length'], searched['seeds'], searched['batches'], searched['first_batch'],
          searched['batch_size']) == (24, [3], 2, 2, 16)
  lines = [json.loads(line) for line in (output / 'search.jsonl').read_text().splitlines()]
  best = min(lines, key=lambda line: line['score'])
  assert searched['score'] == best['score'] and [line['origin'] for line in lines[:2]] == ['pi', 'ntk']

  factors = ' '.join(map(repr, best['factors']))
  request = _request('longrope', 4.0, position_overrides=(
      ('longrope_short_factors', ' '.join('1.0' for _ in best['factors'])), ('longrope_long_factors', factors)))
  evaluation = long_context.prepare_evaluation(copy_run, [24], request)
  model = transformer.build_model(evaluation.config, 'decoder_only')
  params = checkpoints.restore_params(copy_run, evaluation.step)
  sums = task_lengths.sums_function(model, evaluation.task)
  after = task_lengths.evaluate_length(sums, params, evaluation.task, 3, 24, 16, 2, first_batch=2)
  assert best['score'] == pytest.approx(after['cross_entropy'], rel=1e-6)
  _, reported = long_context.evaluate_run(copy_run, [24], request, log=lambda line: None)  # the trainer's batches
  assert reported[24]['cross_entropy'] != pytest.approx(after['cross_entropy'], rel=1e-3)

  refused = command_server.run(search + ['--tokens=256', f'--output={tmp_path / "refused"}'],
                               env=subprocess_environment(), capture_output=True, text=True, cwd=ROOT, check=False)
  assert refused.returncode == 2 and 'error: --tokens: set for a copy run' in refused.stderr
  assert not (tmp_path / 'refused').exists()
