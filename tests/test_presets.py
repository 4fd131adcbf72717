"""The GPT-2-shaped presets (configs/gpt2.py): their shapes and their parameters split over 8 devices (traced
abstractly), and two training steps of each at length 32 on the CPU. Not their speed. The hybrid presets
(configs/hybrid.py): each layer's window and position."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import transformer
from configs import gpt2
from experiments.runs import sharding, steps
from experiments.runs.parallel import placement_for
from experiments.runs.settings import from_config_dict
from experiments.tasks import TASKS
from tests.helpers import with_overrides

SHORT = {'task.max_length': 32, 'task.eval_lengths': (32,), 'train.batch_size': 8}


@pytest.mark.parametrize('size, layer_parameters', [('small', 85_056_000), ('medium', 302_311_424)])
def test_a_preset_has_gpt2s_shapes_and_an_eighth_of_its_matrices_per_device(size, layer_parameters):
  """The whole preset traced abstractly (nothing allocated): its parameter count by GPT-2's formula and its
  bytes per device with fsdp=8."""
  experiment = from_config_dict(with_overrides(gpt2.get_config(size), SHORT), jax.device_count())
  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(experiment.model, experiment.task.model_kind)
  shapes = jax.eval_shape(lambda: steps.create_train_state(experiment, model, task))
  width, vocabulary = experiment.model.model_dim, experiment.model.vocab_size
  # per layer: 4 w^2 + 4 w attention, 8 w^2 + 5 w feed-forward, 4 w for two norms; a final norm of 2 w
  layers = experiment.model.num_decoder_layers
  assert layers * (12 * width ** 2 + 13 * width) + 2 * width == layer_parameters
  assert sum(leaf.size for leaf in jax.tree_util.tree_leaves(shapes.params)) == layer_parameters + vocabulary * width
  _, memory = sharding.plan(experiment, model, task, shapes, jax.device_count())
  assert memory['mesh'] == {'data': 1, 'fsdp': 8, 'tensor': 1}
  split = sum(leaf.size * 4 for leaf in jax.tree_util.tree_leaves(shapes.params) if leaf.ndim == 2)
  whole = sum(leaf.size * 4 for leaf in jax.tree_util.tree_leaves(shapes.params) if leaf.ndim < 2)
  assert memory['parameters'] == split // 8 + whole


@pytest.mark.slow
@pytest.mark.parametrize('size', ['small', 'medium'])
def test_a_preset_steps_split_over_eight_devices(size):
  """Two training steps split over 8 devices of the preset with two of its layers: every shape and every split
  the preset has (its layers are alike), at a CPU's cost."""
  two_layers = from_config_dict(with_overrides(gpt2.get_config(size), {**SHORT, 'model.num_decoder_layers': 2}),
                                jax.device_count())
  task = TASKS[two_layers.task.name](two_layers.task)
  model = transformer.build_model(two_layers.model, two_layers.task.model_kind)
  host_state = jax.device_get(steps.create_train_state(two_layers, model, task))
  specs, _ = sharding.plan(two_layers, model, task, host_state, jax.device_count())
  placement = placement_for(two_layers.parallel, jax.devices(), state_specs=specs)
  state = placement.put_state(host_state)
  train_step = placement.compile_train_step(lambda state, batch, seed, axis_name=None: steps.train_step(
      state, batch, seed, model=model, task=task, experiment=two_layers, axis_name=axis_name))
  losses = []
  for step in range(2):
    batch = placement.put_batch(task.batch(two_layers.seed, step, 'train', two_layers.train.batch_size),
                                two_layers.train.batch_size)
    state, metrics = train_step(state, batch, np.uint32(two_layers.seed))
    sums = placement.to_host(metrics)
    losses.append(float(sums['loss_sum'] / sums['weight_sum']))
  assert np.all(np.isfinite(losses)), losses
  before = jax.tree_util.tree_leaves(host_state.params['decoder']['layer_0'])  # the warm-up's second step moves them
  after = jax.tree_util.tree_leaves(placement.host_state(state).params['decoder']['layer_0'])
  assert any(not np.array_equal(a, b) for a, b in zip(before, after))
  assert state.params['decoder']['layer_0']['feed_forward']['hidden_kernel'].sharding.spec == PartitionSpec('fsdp', None)


def test_the_smollm2_preset_has_smollm2_135ms_parameters():
  """configs/llama.py:smollm2_135m traced abstractly: 30 layers of grouped-query attention (9 heads, 3 key and value
  heads of 64), SwiGLU 1536 wide, RMSNorm, no biases, tied embeddings. Its layers hold 106,203,456 parameters,
  HuggingFaceTB/SmolLM2-135M's 134,515,008 less its 49,152 x 576 embedding; here the vocabulary is the corpus's."""
  from configs import llama
  experiment = from_config_dict(with_overrides(llama.get_config('smollm2_135m'), SHORT), jax.device_count())
  model_config = experiment.model
  assert (model_config.num_heads, model_config.key_value_heads, model_config.head_dim) == (9, 3, 64)
  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(model_config, experiment.task.model_kind)
  shapes = jax.eval_shape(lambda: steps.create_train_state(experiment, model, task))
  total = sum(leaf.size for leaf in jax.tree_util.tree_leaves(shapes.params))
  assert total - model_config.vocab_size * 576 == 134_515_008 - 49_152 * 576 == 106_203_456


@pytest.mark.parametrize('size', ['small', 'medium'])
def test_the_llama_presets_split_their_key_and_value_heads_over_the_tensor_axis(size):
  """configs/llama.py at GPT-2's sizes traced abstractly with tensor=4: the key and value projections (4 heads) split
  their heads over 'tensor' as the query projection does, and every layer's feed-forward has its gate."""
  from configs import llama
  config = with_overrides(llama.get_config(size), {**SHORT, 'parallel.fsdp': 2, 'parallel.tensor': 4})
  experiment = from_config_dict(config, jax.device_count())
  task = TASKS[experiment.task.name](experiment.task)
  model = transformer.build_model(experiment.model, experiment.task.model_kind)
  shapes = jax.eval_shape(lambda: steps.create_train_state(experiment, model, task))
  specs, _ = sharding.plan(experiment, model, task, shapes, jax.device_count())
  attention = specs.params['decoder']['layer_0']['self_attention']
  assert tuple(attention['query']['kernel']) == tuple(attention['key']['kernel']) == ('fsdp', 'tensor')
  key_kernel = shapes.params['decoder']['layer_0']['self_attention']['key']['kernel']
  assert key_kernel.shape == (experiment.model.model_dim, 4 * experiment.model.head_dim)
  assert 'gate_kernel' in shapes.params['decoder']['layer_0']['feed_forward']


@pytest.mark.parametrize('preset', ['rope', 'nope', 'swa', 'rnope', 'rnope_swa', 'irope', 'gemma3', 'gpt_oss',
                                    'smollm3'])
def test_a_hybrid_preset_places_its_windows_and_positions_by_layer(preset):
  """configs/hybrid.py at every budget: six layers of the Llama block, the window or chunk a quarter of the training
  length, each layer's kind and position as the docstring's table says; a narrow copy runs forward."""
  from configs import hybrid  # pylint: disable=import-outside-toplevel
  expected_types = {'swa': 'sliding', 'rnope_swa': 'sliding,sliding,sliding,full',
                    'irope': 'chunked,chunked,chunked,full', 'gemma3': 'sliding,sliding,sliding,sliding,sliding,full',
                    'gpt_oss': 'sliding,full'}.get(preset, 'full')
  for budget, length in (('', 128), (',corpus', 256), (',passkey', 256)):
    model = from_config_dict(hybrid.get_config(preset + budget), 1).model
    assert (model.num_decoder_layers, model.norm_type, model.activation) == (6, 'rmsnorm', 'swiglu')
    assert model.layer_types == expected_types
    assert model.sliding_window == (length // 4 if 'sliding' in expected_types else 0)
    assert model.attention_chunk_size == (length // 4 if 'chunked' in expected_types else 0)
    kinds = [model.layer_position(index).kind for index in range(6)]
    local_base = model.local_position.settings.rope_base if model.local_position else None
    assert (model.attention_sinks, model.sandwich_norm, model.qk_norm) == (
        preset == 'gpt_oss', preset == 'gemma3', 'head' if preset == 'gemma3' else 'none')
    if preset in ('rnope_swa', 'irope'):
      assert kinds == ['rope', 'rope', 'rope', 'none', 'rope', 'rope']
    elif preset == 'gemma3':
      assert kinds == ['rope'] * 6 and local_base == 1e4 and model.position.settings.rope_base == 1e6
    elif preset in ('rnope', 'smollm3'):
      assert model.position.settings.layer_pattern == 'rope,rope,rope,none'
    else:
      assert kinds == ['none' if preset == 'nope' else 'rope'] * 6
  assert (model.position.settings.temperature_scale, model.position.settings.temperature_floor) == (
      (0.1, 256) if preset == 'irope' else (0.0, 8192))
  narrow = model.replace(model_dim=32, num_heads=4, num_kv_heads=2, feed_forward_dim=64, vocab_size=64)
  inputs = jnp.zeros((1, 80), jnp.int32)
  logits = transformer.DecoderOnly(narrow).apply(
      transformer.DecoderOnly(narrow).init(jax.random.PRNGKey(0), inputs), inputs)
  assert logits.shape == (1, 80, 64) and bool(jnp.all(jnp.isfinite(logits)))
