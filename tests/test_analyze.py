"""experiments.analyze: the figures exist for each kind of variant; the sqrt(d_k) statistics hold."""

import math
import os
import pathlib
import sys

import jax
import pytest

from configs import smoke
from experiments import analyze
from experiments.runs import settings, trainer
from tests import command_server

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_sqrt_dk_statistics_follow_the_theory():
  stats = analyze.sqrt_dk_statistics(dims=(4, 64, 1024), samples=128)
  for dim, unscaled, scaled in zip(stats['dims'], stats['std_unscaled'], stats['std_scaled']):
    assert unscaled == pytest.approx(math.sqrt(dim), rel=0.15)
    assert scaled == pytest.approx(1.0, rel=0.15)
  assert stats['max_weight_unscaled'][-1] > 0.8 > 0.2 > stats['max_weight_scaled'][-1]
  assert stats['max_weight_unscaled'] == sorted(stats['max_weight_unscaled'])


@pytest.mark.parametrize('kind,expected', [
    ('sinusoidal', {'attention_maps.png', 'decomposition.png', 'sinusoidal_table.png', 'sqrt_dk.png'}),
    ('tupe_r', {'attention_maps.png', 'position_terms.png', 'sinusoidal_table.png', 'sqrt_dk.png'}),
    ('alibi', {'attention_maps.png', 'position_terms.png', 'sinusoidal_table.png', 'sqrt_dk.png'}),
])
@pytest.mark.slow
def test_analyze_writes_the_figures_of_a_run(tmp_path, kind, expected):
  config = smoke.get_config()
  config.train.steps = 2
  config.model.position.kind = kind
  trainer.run(settings.from_config_dict(config, jax.device_count()), str(tmp_path))
  result = command_server.run([sys.executable, '-m', 'experiments.analyze', f'--workdir={tmp_path}'], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True,
                              text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  written = set(os.listdir(tmp_path / 'analysis'))
  assert written == expected
  for name in written:
    assert (tmp_path / 'analysis' / name).stat().st_size > 5000


def test_analyze_without_a_checkpoint_is_a_one_line_error(tmp_path):
  (tmp_path / 'config.json').write_text('{}')
  result = command_server.run([sys.executable, '-m', 'experiments.analyze', f'--workdir={tmp_path}'], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True,
                              text=True, timeout=300)
  assert result.returncode == 2 and result.stderr.startswith('error:'), result.stderr[-1000:]
