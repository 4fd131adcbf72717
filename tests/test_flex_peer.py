"""The FlexAttention peer (experiments/benchmarks/flex.py) computes what our attention computes with the
same term: outputs and the T5 table's gradient against ours on the same numbers (needs the optional
`[peer]` extra: PyTorch)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.benchmarks import flex
from transformer.attention import scaled_dot_product_attention
from transformer.masks import causal_mask
from transformer.positions import alibi, t5

torch = pytest.importorskip('torch', reason="the FlexAttention peer needs PyTorch: pip install -e '.[peer]'")


def _ours(term, arrays, table_RxH):
  query, key, value = (jnp.asarray(arrays[name]) for name in ('query', 'key', 'value'))
  length, heads = query.shape[1], query.shape[2]
  positions = jnp.arange(length)[None]
  bias = None
  if term == 'alibi':
    bias = alibi.alibi_bias(positions, positions, heads, causal=True)
  elif term == 't5':
    bias = t5.t5_bias(table_RxH, positions, positions, bidirectional=False, max_distance=flex.MAX_DISTANCE)
  return scaled_dot_product_attention(query, key, value, mask=causal_mask(length), bias=bias)


@pytest.mark.slow
@pytest.mark.parametrize('term', flex.TERMS)
def test_flex_attention_with_the_term_is_our_attention(term):
  """Length 300 (T5's log-spaced buckets and its last bucket beyond 128 all in use), float32; the T5
  table's gradient too where PyTorch has a GPU (FlexAttention has no backward on CPUs)."""
  arrays = flex.inputs(batch=1, length=300, heads=4, head_dim=16)
  backward = torch.cuda.is_available()
  run, tensors = flex.flex_attention_call(term, arrays, 'float32', backward=backward)
  np.testing.assert_allclose(run(), _ours(term, arrays, jnp.asarray(arrays['table'])), atol=2e-5)
  if term == 't5' and backward:
    ours = jax.grad(lambda table: jnp.sum(_ours(term, arrays, table) ** 2))(jnp.asarray(arrays['table']))
    np.testing.assert_allclose(tensors['table'].grad.t().cpu().numpy(), ours, rtol=1e-4, atol=1e-4)
