"""Stick-breaking attention (transformer/positions/stick_breaking.py) beyond the shared suite: its weights'
properties, flash-linear-attention's reference on the same numbers, the blocks run nearest first, the
fused cores refused, and its setting checked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from tests.helpers import fla_reference, init, tiny, tokens
from transformer.masks import causal_mask
from transformer.positions import stick_breaking


def _logits(length=9, seed=0):
  return 3.0 * jax.random.normal(jax.random.PRNGKey(seed), (2, 3, length, length))


def test_each_row_breaks_one_stick():
  """The weights are >= 0 and a row sums to 1 - prod_k (1 - beta_ik) over its keys (what is left unbroken)."""
  logits = _logits()
  allowed = stick_breaking.keys_allowed(causal_mask(9), jnp.arange(9)[None], jnp.arange(9)[None], False)
  weights = stick_breaking.stick_breaking_weights(logits, allowed)
  assert float(jnp.min(weights)) >= 0.0
  beta = jax.nn.sigmoid(logits)
  unbroken = jnp.prod(jnp.where(jnp.broadcast_to(allowed, logits.shape), 1.0 - beta, 1.0), axis=-1)
  np.testing.assert_allclose(jnp.sum(weights, axis=-1), 1.0 - unbroken, atol=1e-6)
  np.testing.assert_array_equal(weights[..., 0, :], 0.0)  # the first query has no key before it


def test_a_confident_nearest_key_takes_the_whole_stick():
  """beta = 1 everywhere: query i gives all its weight to key i - 1 and none to the keys before."""
  weights = stick_breaking.stick_breaking_weights(
      jnp.full((1, 1, 5, 5), 40.0), stick_breaking.keys_allowed(causal_mask(5), jnp.arange(5)[None],
                                                                 jnp.arange(5)[None], False))
  np.testing.assert_allclose(weights[0, 0], np.eye(5, k=-1), atol=1e-6)


@pytest.mark.parametrize('attend_current', [False, True])
def test_outputs_are_flash_linear_attentions_reference(attend_current):
  """Random q, k, v (length 40, 4 heads of 16): our explicit and blockwise cores against fla's naive
  implementation (with the `[peer]` extra and fla-core)."""
  torch, naive = fla_reference('stickbreaking_attn', 'naive_stickbreaking_attn')
  q, k, v = (np.asarray(jax.random.normal(jax.random.PRNGKey(seed), (2, 40, 4, 16))) for seed in (1, 2, 3))
  theirs, _ = naive(*(torch.from_numpy(x.copy()) for x in (q, k, v)), scale=0.25, attend_current=attend_current)
  positions = jnp.arange(40)[None]
  allowed = stick_breaking.keys_allowed(causal_mask(40), positions, positions, attend_current)
  logits = jnp.einsum('bqhk,bshk->bhqs', q, k) * 0.25
  ours = jnp.einsum('bhqs,bshv->bqhv', stick_breaking.stick_breaking_weights(logits, allowed), v)
  np.testing.assert_allclose(ours, theirs.numpy(), atol=2e-5, rtol=1e-4)
  heads_first = [jnp.transpose(jnp.asarray(x), (0, 2, 1, 3)) for x in (q, k, v)]
  blocked = stick_breaking.stick_breaking_blockwise(heads_first[0] * 0.25, heads_first[1], heads_first[2], allowed,
                                                    lambda q_slice, k_slice: None, 16, 8, True)
  np.testing.assert_allclose(jnp.transpose(blocked, (0, 2, 1, 3)), theirs.numpy(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize('implementation', ['xla', 'pallas'])
def test_the_fused_softmax_cores_are_refused(implementation):
  model = T.DecoderOnly(tiny('stick_breaking', attention_implementation=implementation))
  with pytest.raises(ValueError, match=r"model\.attention_implementation: got '" + implementation +
                     r"', but the positional variant's weights are not a softmax"):
    init(model, tokens(1, 4))


def test_attend_current_lets_the_first_query_see_itself():
  x = tokens(1, 6)
  strict = T.DecoderOnly(tiny('stick_breaking'))
  params = init(strict, x)
  current = T.DecoderOnly(tiny('stick_breaking', position=dict(stick_breaking_attend_current=True)))
  assert not np.allclose(strict.apply(params, x), current.apply(params, x), atol=1e-4)
  with pytest.raises(ValueError, match=r"position\.stick_breaking_attend_current: got 'yes'; valid: true or false"):
    T.PositionConfig('stick_breaking', stick_breaking_attend_current='yes')
