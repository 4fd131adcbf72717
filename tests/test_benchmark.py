"""experiments.benchmark: a row per (variant, length), a table and a JSON file."""

import json
import os
import pathlib
import subprocess
import sys

from experiments import benchmark

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_model_flops_follow_the_palm_formula():
  # 1,000 parameters, 2 layers, width 8, length 4, batch 3: 12 tokens x (6,000 + 12 * 2 * 8 * 4)
  assert benchmark.model_flops_per_step(1000, 2, 8, 4, 3) == 12 * (6000 + 768)


def test_benchmark_prints_a_table_and_writes_json(tmp_path):
  output = tmp_path / 'bench.json'
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.benchmark', '--positions=alibi', '--lengths=16', '--steps=2', '--warmup=1',
       '--model_dim=32', '--feed_forward_dim=64', '--num_layers=1', '--batch_size=2', f'--json={output}'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'matmul peak (float32, measured now)' in result.stdout and '\nalibi ' in result.stdout
  report = json.loads(output.read_text())
  assert report['matmul_peak_flops'] > 0
  row, = report['rows']
  assert row['variant'] == 'alibi' and row['length'] == 16
  assert row['step_seconds_min'] <= row['step_seconds_median'] <= row['step_seconds_max']
  assert row['tokens_per_second'] == 2 * 16 / row['step_seconds_median']
  assert 0 < row['model_flops_utilisation'] < 1 and row['peak_memory_bytes'] > 0


def test_benchmark_runs_bfloat16_with_remat_against_the_bfloat16_peak(tmp_path):
  output = tmp_path / 'bench.json'
  result = subprocess.run(
      [sys.executable, '-m', 'experiments.benchmark', '--positions=rope', '--lengths=16', '--steps=2', '--warmup=1',
       '--model_dim=32', '--feed_forward_dim=64', '--num_layers=1', '--batch_size=2', '--compute_dtype=bfloat16',
       '--remat', f'--json={output}'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'matmul peak (bfloat16, measured now)' in result.stdout and 'layers rematerialised' in result.stdout
  report = json.loads(output.read_text())
  assert report['compute_dtype'] == 'bfloat16' and report['remat'] is True
  row, = report['rows']
  assert row['variant'] == 'rope' and row['tokens_per_second'] > 0
