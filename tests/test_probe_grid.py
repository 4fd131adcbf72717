"""The passkey grid over a sweep (experiments/evaluation/probe_grid.py): rows by variant and method with seeds as
replicates, their rates against a count by hand and Student's t from scipy, and the mixes it refuses."""

import csv
import io
import json

import numpy as np
import pytest
from scipy import stats

from experiments.evaluation import probe_grid

LENGTHS, DEPTHS, TRIALS = (256, 512), (0.0, 0.5, 1.0), 4


def _probe(variant: str, seed: int, correct_by_length: dict, method: str = 'none', factor: float = 1.0,
           **changes) -> tuple:
  """(directory, evaluation.json, cells) of one run's probe; correct_by_length[length][depth index]."""
  configuration = {'model.position.kind': variant, 'train.steps': 2400, 'model.num_decoder_layers': 3}
  configuration.update(changes.pop('configuration', {}))
  description = dict(dict(probe='passkey', variant=variant, method=method, factor=factor, run_seed=seed,
                          checkpoint_step=2400,
                          run_configuration=configuration, lengths=list(LENGTHS), depths=list(DEPTHS), trials=TRIALS,
                          filler='heldout', seed=0), **changes)
  cells = [dict(length=length, depth=depth, trials=TRIALS, correct=correct_by_length[length][d],
                rate=correct_by_length[length][d] / TRIALS) for length in LENGTHS for d, depth in enumerate(DEPTHS)]
  return f'runs/{variant}-seed{seed}/evaluations/passkey-{method}', description, cells


ROPE = {0: {256: [4, 4, 3], 512: [0, 1, 0]}, 1: {256: [4, 2, 4], 512: [0, 0, 0]}, 2: {256: [4, 4, 4], 512: [2, 0, 0]}}
ALIBI = {0: {256: [1, 0, 4], 512: [0, 0, 4]}, 1: {256: [0, 1, 4], 512: [0, 0, 3]}}


def _sweep():
  return ([_probe('rope', seed, counts) for seed, counts in ROPE.items()] +
          [_probe('alibi', seed, counts) for seed, counts in ALIBI.items()] +
          [_probe('rope', 0, ROPE[0], method='yarn', factor=2.0)])


def test_rows_group_seeds_by_variant_and_method_and_rate_over_every_depth():
  rows = probe_grid.group(_sweep())
  assert [(row.label, sorted(row.by_seeds)) for row in rows] == [('rope', [(0,), (1,), (2,)]),
                                                                 ('alibi', [(0,), (1,)]), ('rope + yarn x2', [(0,)])]
  rope = rows[0]
  assert probe_grid.seed_rates(rope, 256) == [11 / 12, 10 / 12, 12 / 12]
  assert probe_grid.seed_rates(rope, 512) == [1 / 12, 0.0, 2 / 12]
  assert probe_grid.pooled(rope, 256, 0.5) == (10, 12) and probe_grid.pooled(rope, 512, 0.0) == (2, 12)


def _fine_tune(source_seed: int, seed: int, counts: dict, method: str = 'yarn') -> tuple:
  """A probe of a run fine-tuned at 512 with `method` from rope seed `source_seed` (experiments/evaluation/lineage.py)."""
  source = {f'init_from.{name}': value for name, value in
            {'model.position.kind': 'rope', 'train.steps': 2400, 'model.num_decoder_layers': 3}.items()}
  configuration = {'task.max_length': 512, 'model.position.rope_extension': method,
                   'model.position.extension_factor': 16.0, 'init_from.step': 2400, **source}
  directory, description, cells = _probe('rope', seed, counts, configuration=configuration,
                                         source_seeds=[source_seed])
  return directory.replace('rope-seed', f'rope-{method}-512-from{source_seed}-seed'), description, cells


def test_fine_tunes_are_a_row_of_their_own_with_their_sources_seeds_as_replicates():
  rows = probe_grid.group(_sweep() + [_fine_tune(source, 0, ROPE[source]) for source in (0, 1, 2)])
  assert [(row.label, sorted(row.by_seeds)) for row in rows][-1] == ('rope + yarn x16, fine-tuned at 512',
                                                                     [(0, 0), (1, 0), (2, 0)])
  assert probe_grid.seed_rates(rows[-1], 256) == probe_grid.seed_rates(rows[0], 256)
  with pytest.raises(ValueError, match=r'both rope \+ yarn x16, fine-tuned at 512 seed 1/0; valid: each run once'):
    probe_grid.group([_fine_tune(1, 0, ROPE[1]), _fine_tune(1, 0, ROPE[1])])
  other = _fine_tune(2, 0, ROPE[2])
  other[1]['run_configuration']['init_from.train.steps'] = 1200
  with pytest.raises(ValueError, match=r'would mix configurations: init_from.train.steps is 1200'):
    probe_grid.group([_fine_tune(0, 0, ROPE[0]), other])


def test_the_table_gives_the_mean_over_seeds_with_its_student_t_interval_and_each_seed():
  rows = probe_grid.group(_sweep())
  text = probe_grid.tables(rows, list(LENGTHS), list(DEPTHS), TRIALS)
  rates = np.array([11, 10, 12]) / 12
  half_width = stats.t.ppf(0.975, 2) * rates.std(ddof=1) / np.sqrt(3)
  assert f'| rope | 3 | {rates.mean():.2f} ± {half_width:.2f} (0.92, 0.83, 1.00) |' in text
  assert '| rope + yarn x2 | 1 | 0.92 (0.92) | 0.08 (0.08) |' in text  # one seed: no interval
  low, high = stats.binomtest(10, 12).proportion_ci(method='wilson')
  assert f'| 0.5 | 10/12 ({low:.2f}-{high:.2f}) |' in text
  assert 'over 3 depths x 4 trials per seed' in text


def test_the_grid_files_are_written_and_the_csv_holds_every_cell(tmp_path):
  paths = probe_grid.write(str(tmp_path / 'grid'), probe_grid.group(_sweep()))
  assert [p.split('/')[-1] for p in paths] == ['results.md', 'results.csv', 'heatmaps.png']
  records = list(csv.DictReader(io.StringIO((tmp_path / 'grid' / 'results.csv').read_text())))
  assert len(records) == (3 + 2 + 1) * len(LENGTHS) * len(DEPTHS)
  assert sum(int(r['correct']) for r in records if r['row'] == 'alibi' and r['length'] == '512') == 7
  assert (tmp_path / 'grid' / 'heatmaps.png').stat().st_size > 1000


@pytest.mark.parametrize('mix,expected', [
    (lambda p: _probe('rope', 3, ROPE[0], trials=5), 'was probed with trials 5 and runs/rope-seed0/evaluations/'
                                                     'passkey-none with 4; valid: probes that asked the same questions'),
    (lambda p: _probe('rope', 3, ROPE[0], configuration={'train.steps': 3000}),
     'the rope row would mix configurations: train.steps is 3000 in runs/rope-seed3/evaluations/passkey-none and '
     '2400 in runs/rope-seed0/evaluations/passkey-none; valid: runs that differ only in their seed'),
    (lambda p: _probe('rope', 3, ROPE[0], checkpoint_step=1200),
     'the rope row would mix configurations: checkpoint_step is 1200 in runs/rope-seed3/evaluations/passkey-none'),
    (lambda p: p[1], 'runs/rope-seed1/evaluations/passkey-none and runs/rope-seed1/evaluations/passkey-none are both '
                     'rope seed 1; valid: each run once'),
])
def test_a_mix_is_refused_naming_what_differs(mix, expected):
  probes = _sweep()
  with pytest.raises(ValueError) as raised:
    probe_grid.group(probes + [mix(probes)])
  assert expected in str(raised.value) and '\n' not in str(raised.value)


def test_collect_refuses_a_directory_without_a_finished_probe(tmp_path):
  perplexity = tmp_path / 'perplexity'
  perplexity.mkdir()
  (perplexity / 'evaluation.json').write_text(json.dumps(dict(method='none', protocol='sliding')))
  with pytest.raises(ValueError, match=r'^--collect: .*perplexity holds no finished retrieval probe'):
    probe_grid.collect([str(perplexity)])
  old = tmp_path / 'old'
  old.mkdir()
  directory, description, cells = _probe('rope', 0, ROPE[0])
  del description['run_configuration']
  (old / 'evaluation.json').write_text(json.dumps(description))
  (old / 'results.json').write_text(json.dumps(dict(cells=cells)))
  with pytest.raises(ValueError, match=r'was probed before probes recorded their run\'s configuration'):
    probe_grid.collect([str(old)])
