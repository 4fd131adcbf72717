"""FoX (transformer/positions/fox.py) beyond the shared suite: its bias initialisation, the reduction
to ALiBi when the gate ignores the data, the layer's input reaching the gate, and its refusals."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from tests.helpers import init, tiny, tokens
from transformer.positions import alibi, fox
from transformer.positions.base import relative_positions


def test_decay_time_bias_gives_log_spaced_decay_times():
  """-1 / log sigmoid(b_h) is the decay time T_h, from the shortest to the longest, equal ratios between heads."""
  bias = fox.decay_time_bias(6, 2.0, 512.0)
  times = -1.0 / np.log(1.0 / (1.0 + np.exp(-bias.astype(np.float64))))
  np.testing.assert_allclose(times[[0, -1]], [2.0, 512.0], rtol=1e-4)
  np.testing.assert_allclose(times[1:] / times[:-1], (512.0 / 2.0) ** (1 / 5), rtol=1e-4)


def _layer_variables(settings, width=8, heads=4, length=6):
  layer = fox.FoxLayer(settings=settings, num_heads=heads, head_dim=width // heads, model_dim=width, num_layers=1,
                       causal=True)
  x_BxLxD = jax.random.normal(jax.random.PRNGKey(0), (2, length, width))
  return layer, x_BxLxD, layer.init(jax.random.PRNGKey(1), x_BxLxD, None, method='from_inputs')


def test_initial_biases_are_zero_or_the_decay_times():
  _, _, variables = _layer_variables(fox.FoxSettings())
  np.testing.assert_array_equal(variables['params']['forget_gate_bias'], 0.0)
  assert 0.01 < float(jnp.std(variables['params']['forget_gate_kernel'])) < 0.04  # N(0, 0.02^2)
  _, _, variables = _layer_variables(fox.FoxSettings(fox_decay_time_min=4.0, fox_decay_time_max=64.0))
  np.testing.assert_allclose(variables['params']['forget_gate_bias'], fox.decay_time_bias(4, 4.0, 64.0))


def test_a_gate_that_ignores_the_data_is_alibi_with_slope_minus_log_f():
  """Weights 0, bias b_h: f = sigmoid(b_h) at every token, so e_ij += (i - j) log f: ALiBi's -m_h (i - j)
  with m_h = -log sigmoid(b_h) (alibi.alibi_distance gives i - j)."""
  layer, x_BxLxD, variables = _layer_variables(fox.FoxSettings())
  bias_H = jnp.array([-1.0, 0.0, 2.0, 5.0])
  params = {'forget_gate_kernel': jnp.zeros_like(variables['params']['forget_gate_kernel']), 'forget_gate_bias': bias_H}
  shared = layer.apply({'params': params}, x_BxLxD, None, method='from_inputs')
  term_BxHxLxL = layer.apply({'params': params}, None, None, None, None, shared, 1.0, method='logits')
  positions = jnp.arange(x_BxLxD.shape[1])[None]
  distance_1x1xLxL = alibi.alibi_distance(relative_positions(positions, positions), causal=True)[:, None]
  slopes_H = -jax.nn.log_sigmoid(bias_H)
  expected = -slopes_H[:, None, None] * distance_1x1xLxL
  below_diagonal = np.tril(np.ones((6, 6), bool))
  np.testing.assert_allclose(np.where(below_diagonal, term_BxHxLxL, 0.0),
                             np.where(below_diagonal, np.broadcast_to(expected, term_BxHxLxL.shape), 0.0),
                             rtol=1e-5, atol=1e-5)


def test_the_gates_weights_learn_in_a_model():
  """In a decoder-only model the loss's gradient reaches the gate's weights (through from_inputs)."""
  model = T.DecoderOnly(tiny('fox', num_decoder_layers=1))
  ids = tokens(1, 8)
  params = init(model, ids)
  gradient = jax.grad(lambda p: jnp.sum(model.apply(p, ids) ** 2))(params)
  gate_gradient = gradient['params']['decoder']['layer_0']['position']['forget_gate_kernel']
  assert float(jnp.max(jnp.abs(gate_gradient))) > 0


@pytest.mark.parametrize('times,valid', [((0.0, 0.0), True), ((1.0, 1.0), True), ((2.0, 512.0), True),
                                         ((8.0, 2.0), False), ((-1.0, 4.0), False), ((0.0, 4.0), False),
                                         ((math.nan, 4.0), False)])
def test_decay_times_are_checked_in_one_line(times, valid):
  settings = dict(fox_decay_time_min=times[0], fox_decay_time_max=times[1])
  if valid:
    fox.FoxSettings(**settings)
    return
  with pytest.raises(ValueError, match=r'position\.fox_decay_time_min: got .*; valid: 0 < fox_decay_time_min <= '
                                       r'fox_decay_time_max .* or both 0'):
    fox.FoxSettings(**settings)


def test_fox_is_refused_in_an_encoder():
  with pytest.raises(ValueError, match="position.kind: got 'fox'; valid: in bidirectional attention"):
    model = T.EncoderOnly(tiny('fox'))
    init(model, tokens(1, 4))


def test_the_bias_is_x_transformers_data_dependent_alibi_with_the_same_gate():
  """x-transformers' DataDependentAlibi (the `[peer]` extra) with our gate's weights transplanted gives our
  logits term on and below the diagonal (above it, both are masked); length 300, 8 heads, width 64."""
  torch = pytest.importorskip('torch', reason="the peer needs PyTorch: pip install -e '.[peer]'")
  x_transformers = pytest.importorskip('x_transformers.x_transformers', reason='needs x-transformers')
  layer, x_BxLxD, variables = _layer_variables(fox.FoxSettings(), width=64, heads=8, length=300)
  params = {'forget_gate_kernel': variables['params']['forget_gate_kernel'] * 20.0,  # gates well away from 1
            'forget_gate_bias': jnp.linspace(-2.0, 4.0, 8)}
  shared = layer.apply({'params': params}, x_BxLxD, None, method='from_inputs')
  ours = np.asarray(layer.apply({'params': params}, None, None, None, None, shared, 1.0, method='logits'))
  peer = x_transformers.DataDependentAlibi(64, 8, causal=True)
  linear = peer.to_forget_gates[0]
  with torch.no_grad():
    linear.weight.copy_(torch.from_numpy(np.asarray(params['forget_gate_kernel']).T.copy()))
    linear.bias.copy_(torch.from_numpy(np.array(params['forget_gate_bias'])))
    theirs = peer(torch.from_numpy(np.array(x_BxLxD))).numpy()
  below = np.tril(np.ones((300, 300), bool))
  np.testing.assert_allclose(np.where(below, ours, 0.0), np.where(below, theirs, 0.0), rtol=1e-5, atol=2e-3)
