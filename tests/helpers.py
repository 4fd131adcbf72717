"""Shared test helpers: tiny models, inputs, and a handle on a stack's embedded input."""

import os
import zlib
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp

import transformer as T
from tests.xla_flags import xla_flags


def tiny(kind: str = 'sinusoidal', **changes) -> T.ModelConfig:
  position_changes = changes.pop('position', {})
  return T.tiny_preset(T.PositionConfig(kind=kind, **position_changes), **changes)


def own_settings(kind: str, **fields) -> dict:
  """The fields that are settings of `kind` (a test giving every variant the same small sizes)."""
  return T.VARIANTS[kind].own_settings(fields)


def bidirectional(kind: str) -> bool:
  """Whether the variant serves bidirectional attention (encoders); a causal-only variant refuses it."""
  return not T.VARIANTS[kind].causal_only


def tokens(batch: int, length: int, vocab: int = 32, seed: int = 0):
  return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 1, vocab)


def init(model, *args, **kwargs):
  return nn.meta.unbox(model.init(jax.random.PRNGKey(0), *args, **kwargs))


def cached_logits(model, params, inputs, chunks):
  """Logits of the decoder-only model fed `inputs` through its cache, chunk by chunk."""
  _, variables = model.apply(params, jnp.zeros_like(inputs), use_cache=True, mutable=['cache'])
  cache, start, logits = variables['cache'], 0, []
  for size in chunks:
    step, updated = model.apply({**params, 'cache': cache}, inputs[:, start:start + size], use_cache=True,
                                mutable=['cache'])
    cache, start = updated['cache'], start + size
    logits.append(step)
  return jnp.concatenate(logits, axis=1)


def random_positions(variables, seed: int = 1, scale: float = 0.5):
  """The variables with every parameter of a positional hook module ('position', 'cross_position') replaced
  by noise: terms that start at zero (TUPE's [CLS] thetas, CoPE's position vectors) then count."""
  def noise(path, leaf):
    if not any('position' in str(getattr(entry, 'key', '')) for entry in path):
      return leaf
    key = jax.random.fold_in(jax.random.PRNGKey(seed), zlib.crc32(jax.tree_util.keystr(path).encode()) % (2 ** 31))
    return jax.random.normal(key, leaf.shape, leaf.dtype) * scale
  return jax.tree_util.tree_map_with_path(noise, variables)


def apply_with_stack_delta(model, params, delta_BxLxD, *args, causal_only: bool = True, **kwargs):
  """model.apply with delta added to the embedded input of each causal (decoder) stack.

  Lets a test take gradients with respect to the decoder's inputs position by position.
  """
  def add_delta(next_fun, call_args, call_kwargs, context):
    module = context.module
    stack_types = (T.TransformerStack, T.recurrent.RecurrentStack)
    if (isinstance(module, stack_types) and context.method_name == '__call__'
        and (getattr(module, 'causal', False) or not getattr(module, 'bidirectional', True))):
      call_args = (call_args[0] + delta_BxLxD,) + tuple(call_args[1:])
    return next_fun(*call_args, **call_kwargs)

  with nn.intercept_methods(add_delta):
    return model.apply(params, *args, **kwargs)


def assert_causal(model, params, args, length: int, width: int, **kwargs):
  """d output[t] / d input[s] is exactly zero for every s > t, and not all zero for s <= t."""
  delta = jnp.zeros((1, length, width))

  def outputs(d):
    return apply_with_stack_delta(model, params, d, *args, **kwargs)[0].sum(-1)  # L

  jacobian = jax.jit(jax.jacrev(outputs))(delta)[:, 0]  # L (outputs) x L (inputs) x D
  per_pair = jnp.abs(jacobian).sum(-1)
  for t in range(length):
    assert float(per_pair[t, t + 1:].sum()) == 0.0, f'output {t} depends on later inputs: {per_pair[t]}'
    assert float(per_pair[t, :t + 1].sum()) > 0.0, f'output {t} depends on nothing: {per_pair[t]}'


def with_overrides(config, overrides: dict):
  """Sets dotted fields ('train.steps': 10) on an ml_collections config, as --config.x.y=v would."""
  for dotted, value in overrides.items():
    section = config
    *parents, leaf = dotted.split('.')
    for parent in parents:
      section = section[parent]
    section[leaf] = value
  return config


def smoke_experiment(**overrides):
  """configs/smoke.py with overrides, validated for this process's devices."""
  from configs import smoke  # pylint: disable=g-import-not-at-top
  from experiments.runs import settings  # pylint: disable=g-import-not-at-top
  return settings.from_config_dict(with_overrides(smoke.get_config(), overrides), jax.device_count())


ROOT = pathlib.Path(__file__).resolve().parent.parent


def subprocess_environment(devices: int = 1) -> dict:
  """The environment of a command a test starts: CPU only, `devices` XLA host devices, this checkout first."""
  return dict(os.environ, XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS='cpu',
              PYTHONPATH=str(ROOT))


def fla_reference(operation: str, function: str):
  """(torch, flash-linear-attention's naive reference `function` of fla/ops/`operation`/naive.py), loaded from
  its file, since importing the package needs Triton; skips the test without PyTorch or fla-core."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  torch = pytest.importorskip('torch', reason="the reference needs PyTorch: pip install -e '.[peer]'")
  pytest.importorskip('einops', reason='the reference needs einops')
  spec = importlib.util.find_spec('fla')
  if spec is None:
    pytest.skip('needs flash-linear-attention\'s reference code: pip install fla-core')
  path = pathlib.Path(spec.submodule_search_locations[0]) / 'ops' / operation / 'naive.py'
  module_spec = importlib.util.spec_from_file_location(f'fla_{operation}_naive', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return torch, getattr(module, function)
