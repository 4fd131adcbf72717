"""Grouped-query attention (model.num_kv_heads, Ainslie et al. 2023): every variant and every core against the
same model with its key and value heads repeated explicitly (the multi-head model that grouped-query attention
is), cached decoding against the whole pass, the cache's bytes, the Pallas kernel's gradients, and the
refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import attention_core
from transformer.attention import grouped_logits, grouped_output, scaled_dot_product_attention
from transformer.attention_request import AttentionMask, AttentionRequest, CoreSettings
from transformer.flash_attention import flash_attention
from tests.helpers import cached_logits, init, random_positions, tiny, tokens

HEADS = 4
REFLECTIONS = ('w_up', 'beta_kernel', 'beta_bias')  # PaTH's, one per key head


def repeat_key_value_heads(params, groups: int, heads: int = HEADS):
  """The parameters of the multi-head model that a grouped-query model with `groups` key and value heads is:
  each key and value head's columns (the key and value projections, PaTH's reflections) repeated for every
  query head of its group, head h taking head h // (heads / groups). Every other parameter as it is."""
  def expand(path, leaf):
    owner, name = (str(getattr(entry, 'key', '')) for entry in path[-2:])
    if owner not in ('key', 'value') and name not in REFLECTIONS:
      return leaf
    axis = leaf.ndim - 1  # the output features: heads x head width, or heads
    width = leaf.shape[axis] // groups
    split = leaf.reshape(*leaf.shape[:axis], groups, width)
    return jnp.repeat(split, heads // groups, axis=axis).reshape(*leaf.shape[:axis], heads * width)
  return jax.tree_util.tree_map_with_path(expand, params)


def _model(kind, groups, **changes):
  return T.DecoderOnly(tiny(kind, num_heads=HEADS, num_kv_heads=groups, num_decoder_layers=1, **changes))


@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('kind', sorted(T.VARIANTS))
def test_every_variant_is_the_multi_head_model_with_its_key_and_value_heads_repeated(kind, groups):
  """A decoder-only model with 1 or 2 key and value heads for 4 query heads gives the logits of the 4-head model
  whose key and value heads are its own repeated (explicit attention, and blocks of 4 over key blocks of 4); the
  grouped model really has fewer key and value parameters, and its cached decoding gives the whole pass."""
  ids = tokens(2, 11)
  grouped = _model(kind, groups)
  params = random_positions(init(grouped, ids))
  multi_head = _model(kind, 0)
  repeated = repeat_key_value_heads(params, groups)
  key_kernel = params['params']['decoder']['layer_0']['self_attention']['key']['kernel']
  assert key_kernel.shape == (32, groups * 8)
  expected = multi_head.apply(repeated, ids)
  np.testing.assert_allclose(grouped.apply(params, ids), expected, atol=2e-5, rtol=2e-5)
  blocks = _model(kind, groups, attention_block_size=4, attention_key_block_size=4)
  np.testing.assert_allclose(blocks.apply(params, ids), expected, atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(cached_logits(grouped, params, ids, (3, 1, 1, 6)), expected, atol=2e-5, rtol=2e-5)
  if groups == 1:  # the repeat is not a no-op: distinct heads give other logits
    def distinct(path, leaf):
      return leaf.at[:, 8:].multiply(-1.0) if jax.tree_util.keystr(path).endswith("['value']['kernel']") else leaf
    other = jax.tree_util.tree_map_with_path(distinct, repeated)
    assert not np.allclose(multi_head.apply(other, ids), expected, atol=1e-4)


def _request(groups, length=12, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  query = jax.random.normal(keys[0], (2, length, HEADS, 8))
  key = jax.random.normal(keys[1], (2, length, groups, 8))
  value = jax.random.normal(keys[2], (2, length, groups, 8))
  return query, key, value


@pytest.mark.parametrize('groups', [1, 2, HEADS])
@pytest.mark.parametrize('core', ['explicit', 'blockwise', 'xla', 'pallas'])
def test_every_core_reads_key_head_h_over_the_group_size(core, groups):
  """Each core on 1, 2 and 4 key and value heads for 4 query heads, causal with a padded key, equals explicit
  attention on the keys and values repeated per query head (jnp.repeat: head h reads h // (H / G)).
  cuDNN's core is jax.nn.dot_product_attention's on a GPU (not run on a CPU)."""
  query, key, value = _request(groups)
  valid = jnp.ones((2, 12), bool).at[1, 10:].set(False)
  mask = T.self_attention_mask(valid, 12, causal=True)
  attention_mask = AttentionMask(mask, causal=True, in_parts=True, key_valid_BxLk=valid)
  settings = CoreSettings('cpu', block_size=4, key_block_size=4)
  grouped = attention_core.CORES[core](AttentionRequest(query, key, value, 8 ** -0.5, attention_mask), settings)
  repeats = HEADS // groups
  expected = scaled_dot_product_attention(query, jnp.repeat(key, repeats, axis=2), jnp.repeat(value, repeats, axis=2),
                                          mask=mask, scale=8 ** -0.5)
  np.testing.assert_allclose(grouped.output_BxLqxHxV, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize('groups', [1, 2])
def test_the_pallas_kernel_sums_each_key_heads_gradient_over_its_group(groups):
  """The gradients of the kernel's output (with ALiBi's term computed inside) in the queries, keys and values
  equal those of explicit attention on the repeated keys and values, whose key and value gradients are summed
  over each group (the chain rule through jnp.repeat)."""
  from transformer.positions.alibi import alibi_bias, alibi_kernel_term
  query, key, value = _request(groups, length=10, seed=3)
  cotangent = jax.random.normal(jax.random.PRNGKey(4), (2, 10, HEADS, 8))
  positions = jnp.arange(10)[None]

  def kernel(q, k, v):
    out = flash_attention(q, k, v, causal=True, term=alibi_kernel_term(HEADS, True), block_q=4, block_k=4)
    return jnp.sum(out * cotangent)

  def explicit(q, k, v):
    repeats = HEADS // groups
    out = scaled_dot_product_attention(q, jnp.repeat(k, repeats, axis=2), jnp.repeat(v, repeats, axis=2),
                                       mask=T.causal_mask(10), bias=alibi_bias(positions, positions, HEADS, True))
    return jnp.sum(out * cotangent)

  got, expected = jax.grad(kernel, (0, 1, 2))(query, key, value), jax.grad(explicit, (0, 1, 2))(query, key, value)
  for name, a, b in zip('qkv', got, expected):
    assert a.shape == b.shape, name
    np.testing.assert_allclose(a, b, atol=5e-5, rtol=5e-5, err_msg=name)


def test_grouped_products_are_the_repeated_einsum():
  """grouped_logits and grouped_output against jnp.repeat and the plain einsum, for every divisor of 4."""
  for groups in (1, 2, 4):
    q = jax.random.normal(jax.random.PRNGKey(groups), (2, HEADS, 5, 8))
    k = jax.random.normal(jax.random.PRNGKey(10 + groups), (2, groups, 7, 8))
    w = jax.random.normal(jax.random.PRNGKey(20 + groups), (2, HEADS, 5, 7))
    repeated = jnp.repeat(k, HEADS // groups, axis=1)
    np.testing.assert_allclose(grouped_logits(q, k), jnp.einsum('bhqk,bhsk->bhqs', q, repeated), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(grouped_output(w, k), jnp.einsum('bhqs,bhsv->bhqv', w, repeated), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kind', ['rope', 'fox', 'path'])
def test_the_cache_holds_the_key_and_value_heads_only(kind):
  """The decoding cache's keys and values have G heads: its bytes shrink by the group size (H / G)."""
  ids = tokens(2, 16)

  def cache_bytes(groups):
    model = _model(kind, groups)
    cache = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids, use_cache=True)['cache'])
    leaves = jax.tree_util.tree_flatten_with_path(cache)[0]
    return sum(leaf.size * leaf.dtype.itemsize for path, leaf in leaves
               if jax.tree_util.keystr(path).endswith(("'cached_key']", "'cached_value']")))

  multi_head = cache_bytes(0)
  assert multi_head == 2 * 2 * 16 * 32 * 4  # keys and values, batch, length, width, float32
  assert cache_bytes(2) * 2 == multi_head and cache_bytes(1) * 4 == multi_head


def test_key_value_heads_that_do_not_divide_the_heads_are_refused():
  with pytest.raises(ValueError, match='num_kv_heads: got 3; valid: a divisor of num_heads=4'):
    tiny(num_heads=4, num_kv_heads=3)
  with pytest.raises(ValueError, match='num_kv_heads: got -1'):
    tiny(num_kv_heads=-1)
  with pytest.raises(ValueError, match='num_kv_heads: got 3 key and value heads for 4 query heads'):
    T.MultiHeadAttention(num_heads=4, num_kv_heads=3).init(jax.random.PRNGKey(0), jnp.zeros((1, 3, 32)),
                                                            jnp.zeros((1, 3, 32)))


def test_grouped_query_attention_split_over_eight_devices_gives_the_losses_of_one(tmp_path):
  """2 key and value heads for 4 query heads, the parameters split over fsdp=2 and the heads (query and key and
  value alike, rules heads and kv_heads) over tensor=2 on 8 devices: the losses of one device to 1e-5, with the
  key projection's head axis really split over 'tensor'."""
  from experiments.runs import sharding, steps, trainer
  from experiments.runs.metrics import read_metrics
  from experiments.tasks import TASKS
  from tests.helpers import smoke_experiment
  grouped = {'model.num_heads': 4, 'model.num_kv_heads': 2, 'train.log_every': 1, 'train.steps': 10}
  trainer.run(smoke_experiment(**grouped), str(tmp_path / 'one'), devices=jax.devices()[:1])
  split = smoke_experiment(**grouped, **{'parallel.mode': 'mesh', 'parallel.fsdp': 2, 'parallel.tensor': 2})
  trainer.run(split, str(tmp_path / 'split'), devices=jax.devices())
  one, many = ([r['loss'] for r in read_metrics(str(tmp_path / name))] for name in ('one', 'split'))
  assert len(one) >= 10
  np.testing.assert_allclose(many, one, rtol=1e-5)
  task = TASKS[split.task.name](split.task)
  model = T.build_model(split.model, split.task.model_kind)
  state = jax.eval_shape(lambda: steps.create_train_state(split, model, task))
  specs, _ = sharding.plan(split, model, task, state, jax.device_count())
  key_spec = specs.params['decoder']['layer_0']['self_attention']['key']['kernel']
  assert tuple(key_spec) == ('fsdp', 'tensor'), key_spec


def test_the_preflight_counts_the_key_and_value_heads_before_anything_is_spent():
  """The parameter and optimizer bytes the preflight says before a run (runs/preflight.planned, from shapes) shrink
  by the key and value projections' dropped heads: 2 x D x (H - G) x K weights and their biases per layer."""
  from configs import smoke
  from experiments.runs import preflight, settings
  from tests.helpers import with_overrides

  def planned(**changes):
    experiment = settings.from_config_dict(with_overrides(smoke.get_config(), {'model.num_heads': 4, **changes}), 1)
    return experiment.model, preflight.planned(experiment, 1)[4]

  model, multi_head = planned()
  _, multi_query = planned(**{'model.num_kv_heads': 1})
  dropped = model.num_decoder_layers * 2 * (model.model_dim + 1) * (4 - 1) * model.head_dim * 4
  assert multi_head['parameters'] - multi_query['parameters'] == dropped
  assert multi_head['optimizer_state'] - multi_query['optimizer_state'] == 2 * dropped  # Adam's two moments


def test_a_command_line_with_key_and_value_heads_that_do_not_divide_the_heads_is_refused_naming_the_field():
  from configs import smoke
  from experiments.runs import settings
  from tests.helpers import with_overrides
  with pytest.raises(settings.ConfigError, match=r'^model.num_kv_heads: got 3; valid: a divisor of num_heads=4'):
    settings.from_config_dict(with_overrides(smoke.get_config(), {'model.num_heads': 4, 'model.num_kv_heads': 3}), 1)
