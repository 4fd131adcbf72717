"""python -m experiments.benchmark (step, attention, matmul): a row per (variant, length), a table and a JSON file."""

import json
import math
import os
import pathlib
import re
import sys

import pytest

from experiments.benchmarks import flops, step
from tests import command_server

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_model_flops_follow_the_palm_formula():
  # 1,000 parameters, 2 layers, width 8, length 4, batch 3: 12 tokens x (6,000 + 12 * 2 * 8 * 4)
  assert flops.model_flops_per_step(1000, 2, 8, 4, 3) == 12 * (6000 + 768)


@pytest.mark.slow
def test_benchmark_prints_a_table_and_writes_json(tmp_path):
  output = tmp_path / 'bench.json'
  result = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', '--positions=alibi,rope+ssmax', '--lengths=16', '--steps=2',
       '--warmup=1', '--model_dim=32', '--feed_forward_dim=64', '--num_layers=1', '--batch_size=2', f'--json={output}'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "matmul peak (float32, measured in each row's process after its steps)" in result.stdout
  assert '\nalibi ' in result.stdout and '\nrope+ssmax ' in result.stdout
  report = json.loads(output.read_text())
  row, with_ssmax = report['rows']
  assert with_ssmax['variant'] == 'rope+ssmax' and with_ssmax['parameters'] == row['parameters'] + 4  # s_h per head
  assert row['matmul_peak_flops'] > 0
  assert row['model_flops_utilisation'] == row['model_flops_per_second'] / row['matmul_peak_flops']
  assert row['variant'] == 'alibi' and row['length'] == 16
  assert row['step_seconds_min'] <= row['step_seconds_median'] <= row['step_seconds_max']
  assert row['tokens_per_second'] == 2 * 16 / row['step_seconds_median']
  assert 0 < row['model_flops_utilisation'] < 1 and row['peak_memory_bytes'] > 0


@pytest.mark.slow
def test_benchmark_runs_bfloat16_with_remat_and_grouped_query_attention_against_the_bfloat16_peak(tmp_path):
  output = tmp_path / 'bench.json'
  result = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', '--positions=rope', '--lengths=16', '--steps=2', '--warmup=1',
       '--model_dim=32', '--feed_forward_dim=64', '--num_layers=1', '--batch_size=2', '--compute_dtype=bfloat16',
       '--remat=block', '--num_kv_heads=2', '--cache_length=64', f'--json={output}'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "matmul peak (bfloat16, measured in each row's process" in result.stdout and 'layers rematerialised' in result.stdout
  report = json.loads(output.read_text())
  assert report['compute_dtype'] == 'bfloat16' and report['remat'] == 'block'
  row, = report['rows']
  assert row['variant'] == 'rope' and row['tokens_per_second'] > 0
  # 2 key and value heads of 4 (width 32 / 4 heads = 8 each): keys and values of 64 tokens in bfloat16, one layer
  assert row['kv_heads'] == 2 and row['key_value_cache_bytes'] == 2 * 64 * 2 * 8 * 2
  assert row['cache_bytes'] >= row['key_value_cache_bytes']


def test_peer_without_pytorch_says_how_to_install_it(tmp_path):
  shadow = tmp_path / 'torch'  # an import of torch that fails, whether or not PyTorch is installed
  shadow.mkdir()
  (shadow / '__init__.py').write_text("raise ImportError('no PyTorch in this test')\n")
  result = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', '--positions=none', '--lengths=16', '--peer'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=f'{tmp_path}{os.pathsep}{ROOT}', JAX_PLATFORMS='cpu'),
      capture_output=True, text=True, timeout=300)
  assert result.returncode != 0
  assert "--peer needs PyTorch and x-transformers: pip install -e '.[peer]'" in result.stderr


def test_peer_table_divides_ours_by_their_fastest_setting(capsys):
  ours = [dict(variant='rope', length=256, tokens_per_second=6000.0),
          dict(variant='shaw', length=256, tokens_per_second=5000.0)]
  theirs = [dict(variant='rope', length=256, implementation='x-transformers', tokens_per_second=4000.0,
                 model_flops_utilisation=0.5),
            dict(variant='rope', length=256, implementation='x-transformers attn_flash', tokens_per_second=5000.0,
                 model_flops_utilisation=0.6)]
  step.print_peer_table(ours, theirs)
  lines = capsys.readouterr().out.splitlines()
  rope, = [line for line in lines if line.startswith('rope')]
  assert rope.split() == ['rope', '256', '6000', '4000', '5000', '60.0%', '1.20x']
  assert not any(line.startswith('shaw') for line in lines)  # no x-transformers counterpart


def test_peer_model_starts_at_the_uniform_loss():
  pytest.importorskip('x_transformers')  # the optional extra; absent in CI
  from experiments.benchmarks import peer  # pylint: disable=g-import-not-at-top
  for variant in peer.PEER_VARIANTS:
    for compute_dtype in ('float32', 'bfloat16'):
      row = peer.run_peer_row(variant, 16, 2, 1, 0, fused=variant not in peer.PEER_UNFUSABLE, vocab_size=64,
                              model_dim=32, num_layers=1, num_heads=2, feed_forward_dim=64,
                              compute_dtype=compute_dtype)
      assert row['variant'] == variant and row['tokens_per_second'] > 0
      assert abs(row['loss'] - math.log(64)) < 0.5, (variant, row['loss'])  # a fresh LM predicts ~uniformly


@pytest.mark.slow
def test_attention_benchmark_prints_a_row_per_relative_term_and_attention_core_and_checks_the_cores_agree():
  result = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', 'attention', '--length=16', '--batch_size=1', '--num_heads=2',
       '--head_dim=4', '--clip_distance=2', '--repeats=1', '--block_size=8', '--pallas_rows'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = [line.split() for line in result.stdout.splitlines()[2:-1]]
  assert [' '.join(row[:-2]) for row in rows] == [
      'plain', 'shaw (gather)', 'shaw (distance layout)', 'shaw (causal band, blocks)', 't5 (gather)',
      't5 (distance layout)', 'alibi (bias)',
      'jax.nn.dot_product_attention', 'scaled_dot_product_attention', 'blockwise_attention (8)',
      'plain (pallas kernel)', 'alibi (pallas kernel)', 't5 (pallas kernel)']
  assert result.stdout.splitlines()[-1].startswith('the attention cores and the kernel agree with plain attention')
  assert rows[0][-1] == '1.00x' and all(float(row[-2]) > 0 for row in rows)


def test_the_window_benchmark_prints_full_and_sliding_by_length_and_refuses_a_length_within_the_window():
  environment = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu')
  base = [sys.executable, '-m', 'experiments.benchmark', 'attention', '--batch_size=1', '--num_heads=2', '--head_dim=4',
          '--repeats=1', '--block_size=8', '--window=8']
  result = command_server.run(base + ['--lengths=32,64'], cwd=ROOT, env=environment, capture_output=True, text=True,
                              timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert 'full against a sliding window of 8' in lines[0]
  rows = [line.split() for line in lines[2:]]
  assert [row[0] for row in rows] == ['32', '64'] and rows[0][-1] == '1.00x'
  assert all(float(value) > 0 for row in rows for value in row[1:3])  # times; memory may round to 0.0 MB here
  assert all(float(value) >= 0 for row in rows for value in row[3:5])
  refused = command_server.run(base + ['--lengths=8,64'], cwd=ROOT, env=environment, capture_output=True, text=True,
                               timeout=300)
  assert refused.returncode == 2 and 'longer than --window=8' in refused.stderr


def test_matmul_benchmark_counts_the_dense_flops_of_6n_per_token():
  batch, length, width, layers, ff, vocab = 3, 32, 16, 2, 48, 10
  kernels = flops.step_kernels(batch, length, width, layers, 4, ff, vocab, block_size=0)
  dense = sum(k['flops'] * k['count'] for k in kernels if k['kind'] == 'dense')
  weights = layers * (4 * width * width + 2 * width * ff) + width * vocab
  assert dense == 6 * weights * batch * length
  # Attention in one block: PaLM's 12 x layers x d x L per token are the forward's two matmuls and
  # the backward's four; the blocks recompute the logits once more, 7/6 of that.
  attention = sum(k['flops'] * k['count'] for k in kernels if k['kind'] == 'attention')
  assert attention * 6 == 7 * 12 * layers * width * length * batch * length


def test_matmul_benchmark_skips_the_keys_after_each_causal_block():

  def attention_flops(block_size):
    kernels = flops.step_kernels(2, 64, 16, 1, 4, 32, 8, block_size=block_size)
    return sum(k['flops'] * k['count'] for k in kernels if k['kind'] == 'attention')
  # Blocks of 32 of 64 positions: the first block sees 32 keys, the second all 64, 3/4 of the square;
  # blocks of 16: (1 + 2 + 3 + 4) / 16 = 10/16.
  assert attention_flops(32) * 4 == attention_flops(0) * 3
  assert attention_flops(16) * 16 == attention_flops(0) * 10


@pytest.mark.slow
def test_matmul_benchmark_prints_every_kernel_on_all_cores_and_on_one():
  result = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', 'matmul', '--length=16', '--batch_size=2', '--block_size=8',
       '--model_dim=16', '--num_heads=2', '--feed_forward_dim=32', '--vocab_size=8', '--num_layers=1',
       '--repeats=1'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  rows = lines[2:-1]
  assert len(rows) == 15 + 2 * 6  # 5 dense layers x 3 matmuls, 2 block shapes x 6
  assert all(float(row.split()[-1].rstrip('x')) > 0 for row in rows)
  assert lines[-1].startswith('per step: dense matmuls') and lines[-1].endswith('MFU')
  bad = command_server.run([sys.executable, '-m', 'experiments.benchmark', 'matmul', '--model_dim=30', '--num_heads=4'],
                           cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                           timeout=300)
  assert bad.returncode != 0 and '--model_dim: got 30' in bad.stderr


def test_the_peer_is_our_model_but_for_the_differences_it_lists():
  """Parameter for parameter: x-transformers' model has ours less the attention projections' and layer
  norms' biases (DIFFERENCES), plus the learned scale of its sinusoidal embedding; its rotary
  embedding covers the whole head, and its feed-forward is a ReLU."""
  pytest.importorskip('x_transformers')  # the optional extra; absent in CI
  import torch  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import peer  # pylint: disable=g-import-not-at-top
  from tests.helpers import own_settings  # pylint: disable=g-import-not-at-top
  width, layers, heads, hidden, vocabulary = 32, 2, 2, 64, 64
  for variant in peer.PEER_VARIANTS:
    config = transformer.ModelConfig(
        vocab_size=vocabulary, model_dim=width, num_heads=heads, feed_forward_dim=hidden, num_decoder_layers=layers,
        num_encoder_layers=0, norm='pre', position=transformer.PositionConfig(variant, **own_settings(variant, max_length=512)))
    ours = transformer.DecoderOnly(config).init(jax.random.PRNGKey(0), jax.numpy.ones((1, 8), jax.numpy.int32))
    theirs = peer.build_peer_model(variant, 512, fused=False, vocab_size=vocabulary, model_dim=width,
                                   num_layers=layers, num_heads=heads, feed_forward_dim=hidden)
    biases = layers * 4 * width + (2 * layers + 1) * width  # q, k, v, out; two norms a layer and the final one
    learned_scale = 1 if variant == 'sinusoidal' else 0
    assert sum(p.numel() for p in theirs.parameters()) == sum(
        int(p.size) for p in jax.tree_util.tree_leaves(ours)) - biases + learned_scale, variant
    if variant == 'rope':
      assert theirs.attn_layers.rotary_pos_emb.inv_freq.numel() == width // heads // 2  # a frequency per pair
    assert any(isinstance(m, torch.nn.ReLU) for m in theirs.modules()) and not any(
        isinstance(m, torch.nn.GELU) for m in theirs.modules())


@pytest.mark.slow
def test_seeds_benchmark_times_each_replica_count_against_one_seed_alone(tmp_path):
  output = tmp_path / 'seeds.json'
  result = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', 'seeds', '--configs=configs/smoke.py', '--seeds=2',
       '--steps=2', '--warmup=1', f'--json={output}'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(output.read_text())
  assert [row['seeds'] for row in rows] == [1, 2]  # one seed alone, the baseline, is always measured
  for row in rows:
    assert row['step_min_ms'] <= row['step_ms'] <= row['step_max_ms'] and row['parameters'] > 0
  ratio = rows[1]['step_ms'] / rows[0]['step_ms']
  assert f'| configs/smoke.py | 2 | {rows[1]["compile_s"]:.1f} | {rows[1]["step_ms"]:.1f} ' in result.stdout
  assert f'| {ratio:.2f} | {rows[1]["step_ms"] / 2:.1f} | {2 / ratio:.2f} |' in result.stdout


def test_seeds_benchmark_names_a_bad_count():
  result = command_server.run([sys.executable, '-m', 'experiments.benchmark', 'seeds', '--seeds=0,2'], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip() == "error: --seeds: got '0,2'; valid: comma-separated positive integers, e.g. 1,2,4,8"


@pytest.mark.slow
def test_sharding_benchmark_measures_a_split_state_and_the_memory_savers(tmp_path):
  output = tmp_path / 'sharding.json'
  result = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', 'sharding', '--config=configs/smoke.py',
       '--model=model.feed_forward_dim=128', '--steps=2', '--warmup=0', f'--sharding_json={output}'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = {row['name']: row for row in json.loads(output.read_text())}
  assert [rows[name]['devices'] for name in rows] == [8, 8, 8, 1, 1, 1, 1]
  assert rows['fsdp=8']['mesh'] == {'data': 1, 'fsdp': 8, 'tensor': 1}
  # Activations stay split over the batch (transformer.layers.batch_split): the split state's compiled step needs
  # about the replicated one's temporaries, not the several times more of gathered activations.
  assert rows['fsdp=8']['compiled_temporary_bytes'] < 1.5 * rows['replicated (mesh)']['compiled_temporary_bytes']
  # Every matrix split eight ways, the vectors whole: well under a quarter of the replicated state.
  assert rows['fsdp=8']['state_bytes_on_first_device'] < rows['replicated (mesh)']['state_bytes_on_first_device'] / 4
  assert (rows['one device, gradient_accumulation=4']['compiled_temporary_bytes']
          < rows['one device']['compiled_temporary_bytes'])
  for name, row in rows.items():
    assert f'| {name} | {row["devices"]} | ' in result.stdout
    tokens = row['batch_size'] * row['length']
    assert row['tokens_per_s'] == pytest.approx(tokens / (row['step_ms'] / 1e3), rel=1e-6)
    assert row['device_peak_bytes'] is None and row['model_flops_per_step'] > 6 * row['parameters'] * tokens
  assert result.stdout.count('| not asked | n/a (CPU: peak RSS) |') == 7

  chosen = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', 'sharding', '--config=configs/smoke.py', '--steps=2',
       '--warmup=0', '--model=model.feed_forward_dim=128', '--rows=one device', '--peak_flops=1e9'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=600)
  assert chosen.returncode == 0, chosen.stderr[-2000:]
  table = [line for line in chosen.stdout.splitlines() if line.startswith('| one device')]
  assert len(table) == 1 and table[0].split(' | ')[-2].endswith('%')
  unknown = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', 'sharding', '--rows=two devices'], cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
  assert unknown.returncode == 2 and unknown.stderr.startswith("error: --rows: got 'two devices'; valid: 'replicated")


@pytest.mark.slow
def test_sweep_benchmark_times_each_jobs_value_and_compares_the_tables(tmp_path):
  result = command_server.run(
      [sys.executable, '-m', 'experiments.benchmark', 'sweep', '--config=configs/smoke.py', '--positions=none,alibi',
       '--jobs=2,1', '--repeats=1', '--overrides=train.steps=4,train.eval_every=4', f'--workdir={tmp_path}'],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = [line.split(' | ') for line in result.stdout.splitlines() if line.startswith('| ') and line[2].isdigit()]
  assert [(row[0], row[1], row[2]) for row in rows] == [('| 1', '2', '1'), ('| 1', '1', '1')]
  assert all(row[-1] == 'same |' for row in rows) and all(float(row[3]) > 0 for row in rows)
  assert float(rows[0][4]) == 1.0
  assert float(rows[1][4]) == pytest.approx(float(rows[1][3]) / float(rows[0][3]), rel=0.05)  # from 0.1 s roundings
  assert sorted(path.name for path in tmp_path.iterdir()) == ['repeat0-jobs1x1', 'repeat0-jobs2x1']
  refused = command_server.run([sys.executable, '-m', 'experiments.benchmark', 'sweep', '--jobs=1,1x0'], cwd=ROOT,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
  assert refused.returncode == 2 and refused.stderr.strip() == (
      'error: --jobs: got 1,1x0; valid: comma-separated J or JxC, positive integers, e.g. 1,2,1x2')


@pytest.mark.slow
def test_the_streaming_benchmark_keeps_streamingllms_memory_flat_where_the_whole_cache_grows():
  """Two stream lengths (1x and 8x the 8 slots), each cache in its own process: StreamingLLM's compiled scan needs the
  same temporary memory at both, the whole cache more at the longer one."""
  environment = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu')
  result = command_server.run([sys.executable, '-m', 'experiments.benchmark', 'streaming',
                               '--config=configs/llama.py:smoke', '--cache_size=8', '--sink_tokens=2',
                               '--multiples=1,8', '--repeats=1'], cwd=ROOT, env=environment, capture_output=True,
                              text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = {(row[0], int(row[1])): [float(value) for value in row[3:]] for row in
          (line.split() for line in result.stdout.splitlines()[2:])}
  assert sorted(rows) == [('streaming', 8), ('streaming', 64), ('whole', 8), ('whole', 64)]
  assert rows['streaming', 64][1] == rows['streaming', 8][1]  # XLA's temporary memory, MB
  assert rows['whole', 64][1] > rows['whole', 8][1]


@pytest.mark.slow
def test_the_pretrained_benchmark_times_both_sides_of_one_checkpoint_each_in_its_own_process(tmp_path):
  """A tiny Llama folder made by transformers, imported: a forward row and a decoding row for each side, each with its
  time, rate and the peak memory of its own process, ours under evaluate's XLA schedule; a source that is no imported run is refused."""
  transformers = pytest.importorskip('transformers', reason='the other side is transformers')
  torch = pytest.importorskip('torch', reason='the other side is transformers on PyTorch')
  torch.manual_seed(0)
  config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                    num_attention_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
  transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / 'llama', safe_serialization=True)
  environment = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu')
  imported = command_server.run([sys.executable, '-m', 'experiments.import_checkpoint', f'--source={tmp_path / "llama"}',
                                 f'--workdir={tmp_path / "run"}'], cwd=ROOT, env=environment, capture_output=True,
                                text=True, timeout=300)
  assert imported.returncode == 0, imported.stderr[-2000:]
  result = command_server.run([sys.executable, '-m', 'experiments.benchmark', 'pretrained',
                               f'--source={tmp_path / "run"}', '--lengths=16', '--prompt_length=8',
                               '--new_tokens=2', '--repeats=1'], cwd=ROOT, env=environment, capture_output=True,
                              text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'ours on cpu, XLA scheduled for memory as evaluate' in result.stdout.splitlines()[0], result.stdout
  rows = [line.split() for line in result.stdout.splitlines()[2:]]
  assert [(row[0], row[1], row[2]) for row in rows] == [('ours', 'forward', '16'), ('transformers', 'forward', '16'),
                                                        ('ours', '2', 'after'), ('transformers', '2', 'after')]
  for row in rows:
    _, rate, _, peak = (float(value) for value in row[-4:])
    assert rate > 0 and peak > 50, row
  (tmp_path / 'trained').mkdir()
  (tmp_path / 'trained' / 'config.json').write_text('{}')
  for source in (tmp_path / 'missing', tmp_path / 'trained', tmp_path / 'llama'):
    refused = command_server.run([sys.executable, '-m', 'experiments.benchmark', 'pretrained', f'--source={source}'],
                                 cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and re.search(r'--source: got .*, which is no run imported from a checkpoint; '
                                                 r'valid: a run made by experiments.import_checkpoint',
                                                 refused.stderr), refused.stderr[-1000:]
