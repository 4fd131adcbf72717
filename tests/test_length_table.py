"""The long-context table over seeds (experiments/evaluation/length_table.py) and the lineage that decides which
runs are replicates (experiments/evaluation/lineage.py): rows by configuration and method, a fine-tune's seeds
as its source's and its own, the mean over seeds against numpy and Student's t from scipy, and the mixes
it refuses."""

import csv
import io
import json
import os

import numpy as np
import pytest
from scipy import stats

from experiments.evaluation import length_table, lineage

LENGTHS = (16, 32)


def _run(directory, seed: int, width: int = 32, init_from: str = '', **position) -> str:
  """A run directory with only its config.json (and init_from.json for a fine-tune): what lineage reads."""
  os.makedirs(directory)
  config = dict(seed=seed, task=dict(name='shakespeare', max_length=32 if init_from else 16),
                model=dict(model_dim=width, position=dict(dict(kind='rope', rope_extension='none',
                                                            extension_factor=1.0), **position)),
                train=dict(steps=1200, init_from=init_from, log_every=10))
  with open(os.path.join(directory, 'config.json'), 'w') as file:
    json.dump(config, file)
  if init_from:
    with open(os.path.join(directory, 'init_from.json'), 'w') as file:
      json.dump(dict(workdir=os.path.abspath(init_from), step=1200, finished_step=1200), file)
  return str(directory)


def _evaluation(run: str, bits_by_length: dict, method: str = 'none', factor: float = 1.0,
                checkpoint_step: int = 1200) -> tuple:
  """(directory, evaluation.json, results by length) as long_context writes them; bits by position are
  the score repeated, then doubled for the window's second half."""
  results = {length: dict(bits_per_character=bits, scored_tokens=100,
                          bits_by_position=[bits] * (length // 2 - 1) + [2 * bits] * (length // 2))
             for length, bits in bits_by_length.items()}
  description = dict(run=run, method=method, factor=factor, position_overrides=[], trained_length=16,
                     checkpoint_step=checkpoint_step)
  return os.path.join(run, 'evaluations', method), description, results


BASE = {0: {16: 2.40, 32: 4.10}, 1: {16: 2.45, 32: 3.90}, 2: {16: 2.38, 32: 4.60}}
TUNED = {0: {16: 2.36, 32: 2.39}, 1: {16: 2.37, 32: 2.41}, 2: {16: 2.35, 32: 2.36}}


@pytest.fixture
def sweep(tmp_path):
  """Three rope seeds, each fine-tuned once with yarn x2 (own seed 0): evaluations of both, and yarn at
  evaluation on seed 0 only."""
  evaluations = []
  for seed in (0, 1, 2):
    base = _run(tmp_path / f'rope-seed{seed}', seed)
    tuned = _run(tmp_path / f'rope-yarn-seed{seed}', 0, init_from=base, rope_extension='yarn', extension_factor=2.0)
    evaluations += [_evaluation(base, BASE[seed]), _evaluation(tuned, TUNED[seed])]
  return evaluations + [_evaluation(str(tmp_path / 'rope-seed0'), {16: 2.5, 32: 2.6}, 'yarn', 2.0)]


def test_a_fine_tune_carries_its_sources_configuration_and_seed(tmp_path):
  base = _run(tmp_path / 'base', seed=2)
  tuned = lineage.of_run(_run(tmp_path / 'tuned', seed=5, init_from=base, rope_extension='yarn', extension_factor=2.0))
  assert tuned.seeds == (2, 5)
  assert tuned.configuration['init_from.model.model_dim'] == 32 and tuned.configuration['init_from.step'] == 1200
  assert 'train.init_from' not in tuned.configuration and 'init_from.seed' not in tuned.configuration
  assert 'train.log_every' not in tuned.configuration and 'train.steps' not in tuned.configuration  # restartable
  assert lineage.label(tuned.configuration) == 'rope + yarn x2, fine-tuned at 32'
  assert lineage.label(lineage.of_run(base).configuration, 'ntk', 4.0) == 'rope + ntk x4'
  os.remove(os.path.join(base, 'config.json'))
  with pytest.raises(FileNotFoundError, match=r'tuned was fine-tuned from .*base, which is gone'):
    lineage.of_run(os.path.join(tmp_path, 'tuned'))


def test_rows_take_seeds_as_replicates_and_a_fine_tune_is_a_row_of_its_own(sweep):
  rows = length_table.group(sweep)
  assert [(row.label, sorted(row.by_seeds)) for row in rows] == [
      ('rope', [(0,), (1,), (2,)]), ('rope + yarn x2, fine-tuned at 32', [(0, 0), (1, 0), (2, 0)]),
      ('rope + yarn x2', [(0,)])]
  assert length_table.seed_values(rows[0], 32, 'bits_per_character') == [4.10, 3.90, 4.60]


def test_the_table_gives_the_mean_over_seeds_with_its_student_t_interval_and_each_seed(sweep):
  results, by_position, csv_text = length_table.tables(length_table.group(sweep), list(LENGTHS), 16, 'sliding')
  bits = np.array([4.10, 3.90, 4.60])
  half_width = stats.t.ppf(0.975, 2) * bits.std(ddof=1) / np.sqrt(3)
  assert f'| rope | 3 | {np.mean([2.40, 2.45, 2.38]):.3f} ± ' in results
  assert f' | {bits.mean():.3f} ± {half_width:.3f} |' in results
  assert '| rope + yarn x2 | 1 | 2.500 | 2.600 |' in results  # one seed: no interval
  assert '| rope + yarn x2, fine-tuned at 32 | 1/0 | 2.370 | 2.410 |' in results  # each seed's line
  records = list(csv.DictReader(io.StringIO(csv_text)))
  assert [(r['run'], r['seed'], r['32']) for r in records[:2]] == [('rope', '0', '4.10000'), ('rope', '1', '3.90000')]
  assert records[0]['evaluation'].endswith('rope-seed0/evaluations/none')
  second_half = 2 * bits  # positions 16-31 of a window of 32 score twice the length's bits
  band_half_width = stats.t.ppf(0.975, 2) * second_half.std(ddof=1) / np.sqrt(3)
  assert f'| {second_half.mean():.3f} ± {band_half_width:.3f} |' in by_position.splitlines()[2]
  assert '| run | 1-15 | 16-31 |' in by_position


def test_a_long_override_is_named_by_its_hash_in_the_label(sweep):
  directory, description, results = _evaluation(sweep[0][1]['run'], BASE[0], 'longrope', 2.0)
  description['position_overrides'] = [['longrope_long_factors', ' '.join(['1.5'] * 16)]]
  label = length_table.group([(directory, description, results)])[0].label
  assert label.startswith('rope + longrope x2 + longrope_long_factors=sha') and len(label) < 60


def test_the_files_are_written(sweep, tmp_path):
  paths = length_table.write(str(tmp_path / 'table'), length_table.group(sweep), list(LENGTHS), 16, 'sliding')
  assert [os.path.basename(p) for p in paths] == ['results.md', 'by_position.md', 'results.csv',
                                                  'plot_extension.png']
  assert os.path.getsize(paths[3]) > 1000


def test_a_row_that_would_mix_configurations_or_hold_one_run_twice_is_refused(sweep, tmp_path):
  wider = _run(tmp_path / 'rope-wider-seed3', 3, width=64)
  with pytest.raises(ValueError) as raised:
    length_table.group(sweep + [_evaluation(wider, BASE[0])])
  assert ('the rope row would mix configurations: model.model_dim is 64 in ' in str(raised.value)
          and 'valid: runs that differ only in their seed' in str(raised.value))
  earlier = _evaluation(os.path.join(tmp_path, 'rope-seed1'), BASE[1], checkpoint_step=600)
  with pytest.raises(ValueError, match=r'the rope row would mix configurations: checkpoint_step is 600 in '):
    length_table.group(sweep[:2] + [earlier])
  with pytest.raises(ValueError, match=r'are both rope \+ yarn x2, fine-tuned at 32 seed 1/0; valid: each run once'):
    length_table.group(sweep + [sweep[3]])


def test_a_model_of_local_and_global_layers_is_named_by_its_design():
  """configs/hybrid.py's designs get rows of their own: the local layers' variant, the cycle with its window or
  chunk, sinks, QK-norm and sandwich norms; full attention keeps the variant's name alone."""
  from experiments.evaluation import lineage  # pylint: disable=import-outside-toplevel
  plain = {'model.position.kind': 'rope', 'model.layer_types': 'full', 'model.local_position': None}
  assert lineage.label(plain) == 'rope'
  rnope = dict(plain, **{'model.position.kind': 'layer_pattern', 'model.position.layer_pattern': 'rope,rope,rope,none'})
  assert lineage.label(rnope) == 'layer_pattern rope,rope,rope,none'
  gpt_oss = dict(plain, **{'model.layer_types': 'sliding,full', 'model.sliding_window': 32,
                           'model.attention_sinks': True})
  assert lineage.label(gpt_oss) == 'rope (sliding,full window 32; sinks)'
  irope = dict(plain, **{'model.position.kind': 'none', 'model.local_position.kind': 'rope',
                         'model.layer_types': 'chunked,chunked,chunked,full', 'model.attention_chunk_size': 32})
  assert lineage.label(irope, 'yarn', 4.0) == 'none (rope local; chunked,chunked,chunked,full chunk 32) + yarn x4'
  tuned = dict(irope, **{'model.position.temperature_scale': 0.1, 'model.position.temperature_floor': 128})
  assert lineage.label(tuned) == 'none (temperature 0.1 from 128; rope local; chunked,chunked,chunked,full chunk 32)'
  gemma = dict(plain, **{'model.qk_norm': 'head', 'model.sandwich_norm': True})
  assert lineage.label(gemma) == 'rope (QK-norm; sandwich norm)'
  two_bases = dict(gemma, **{'model.local_position.kind': 'rope', 'model.local_position.rope_base': 1e4,
                             'model.position.rope_base': 1e6})
  assert lineage.label(two_bases) == 'rope (rope local base 10000, global base 1e+06; QK-norm; sandwich norm)'
  one_base = dict(two_bases, **{'model.position.rope_base': 1e4})
  assert lineage.label(one_base) == 'rope (rope local; QK-norm; sandwich norm)'
