"""The suite's set-up (tests/conftest.py) changes what the tests cost, not what they compute."""

import jax
import numpy as np
import pytest
from jax._src.interpreters import mlir

import transformer as T
from tests.helpers import init, tiny, tokens
from tests.xla_flags import FAST_COMPILE_FLAGS


def test_a_reused_mlir_context_lowers_the_program_a_fresh_one_does():
  """A decoder's gradient lowered twice into the reused context and once into a fresh one: the same text; the
  reused context is one object until it has served its lowerings."""
  fresh = getattr(mlir.make_ir_context, 'fresh', None)
  if fresh is None:
    pytest.skip("JAX's own contexts: TESTS_FRESH_MLIR_CONTEXTS=1, or a JAX without make_ir_context")
  model = T.DecoderOnly(tiny('rope', num_decoder_layers=1))
  x = tokens(2, 8)
  params = init(model, x)

  def lowered() -> str:  # a new function each time: JAX lowers it anew rather than reuse its cached lowering
    return jax.jit(jax.grad(lambda p: model.apply(p, x).sum())).lower(params).as_text()

  reused = [lowered(), lowered()]
  mlir.make_ir_context.state['uses'] = 0
  assert mlir.make_ir_context() is mlir.make_ir_context()
  patched, mlir.make_ir_context = mlir.make_ir_context, fresh
  try:
    alone = lowered()
    assert mlir.make_ir_context() is not mlir.make_ir_context()
  finally:
    mlir.make_ir_context = patched
  assert 'stablehlo' in alone and reused == [alone, alone]


def test_the_suites_compile_flags_give_the_results_of_xlas_default_flags_bit_for_bit():
  """The flags of tests/xla_flags.py against XLA's defaults, passed as one compile's options: a decoder's gradient,
  the same bits."""
  model = T.DecoderOnly(tiny('rope', num_decoder_layers=1))
  x = tokens(2, 8)
  params = init(model, x)
  lowered = jax.jit(jax.grad(lambda p: model.apply(p, x).sum())).lower(params)
  ours = lowered.compile()(params)
  defaults = lowered.compile({flag: default for flag, (_, default) in FAST_COMPILE_FLAGS.items()})(params)
  for got, expected in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(defaults)):
    np.testing.assert_array_equal(got, expected)
