"""FoX, the Forgetting Transformer (Lin, Nikishin, He and Courville, ICLR 2025, "Forgetting Transformer:
Softmax Attention with a Forget Gate"), in every self-attention layer of a causal model.

Each head h has a scalar forget gate per token, read from the layer's input x_t (after its norm),

  f_t = sigmoid(w_h . x_t + b_h),   e_ij += sum_{t=j+1..i} log f_t = c_i - c_j,   c_i = sum_{t<=i} log f_t,

so a key's logit decays with the gates between it and the query: ALiBi with a slope the data sets
(eq. 4-6 of the paper). No other position information (the paper's FoX uses none). The gate's weight
is drawn from N(0, 0.02^2) and its bias is zero, as the authors' data-dependent gate; with
fox_decay_time_min and _max set, the biases follow the authors' initialisation by decay times instead:
T_h log-spaced from the minimum to the maximum over the heads, b_h = -log(exp(1/T_h) - 1), so that
-1/log sigmoid(b_h) = T_h. Causal only: the sums run over the past.

The term depends on the content through c, one number per head and token: from_inputs computes c for
the queries and the keys (B x H x Lq x 1 and B x H x 1 x Lk, which blocks slice like any shared term);
incremental decoding keeps every fed token's log f_t in the cache, so a step's c continues the sums.
The Pallas kernel computes c_i - c_j inside from the two (its per-token data), as it computes ALiBi's
term, so the B x H x L x L bias is never formed.
"""

import dataclasses
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.flash_attention import KernelTerm
from transformer.layers import parameter
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require


@dataclasses.dataclass(frozen=True)
class FoxSettings(Settings):
  fox_decay_time_min: float = 0.0  # 0 with _max 0: the gate's bias starts at 0 (the authors' FoX); else T_min
  fox_decay_time_max: float = 0.0  # T_max of the decay-time initialisation of the gate's bias

  def check(self):
    times = (self.fox_decay_time_min, self.fox_decay_time_max)
    if times != (0.0, 0.0):
      require(0.0 < self.fox_decay_time_min <= self.fox_decay_time_max, 'position.fox_decay_time_min',
              times, '0 < fox_decay_time_min <= fox_decay_time_max (decay times, in tokens), or both 0 '
              '(a zero bias)')


def decay_time_bias(num_heads: int, shortest: float, longest: float) -> np.ndarray:
  """b_h = -log(expm1(1 / T_h)), T_h log-spaced from shortest to longest: -1 / log sigmoid(b_h) = T_h."""
  times = np.exp(np.linspace(math.log(shortest), math.log(longest), num_heads))
  return (-np.log(np.expm1(1.0 / times))).astype(np.float32)


def forget_cumulative(log_forget_BxLxH: chex.Array) -> chex.Array:
  """c_i = sum_{t<=i} log f_t: B x H x L, float32."""
  chex.assert_rank(log_forget_BxLxH, 3)
  return jnp.transpose(jnp.cumsum(log_forget_BxLxH.astype(jnp.float32), axis=1), (0, 2, 1))


def fox_kernel_bias(parameters, q_positions_bqx1, k_positions_1xbk, cumulative_q_bqx1, cumulative_k_1xbk):
  """c_i - c_j on one block of a kernel (no parameters, no positions)."""
  del parameters, q_positions_bqx1, k_positions_1xbk
  return cumulative_q_bqx1 - cumulative_k_1xbk


class FoxLayer(LayerPositions):
  """Owns this layer's forget gate (w_h, b_h per head) and adds c_i - c_j to the logits."""

  @nn.compact
  def from_inputs(self, inputs_BxLqxD, shared, use_cache=False, cache_index=None):
    settings = self.settings
    if settings.fox_decay_time_min > 0:
      bias = decay_time_bias(self.num_heads, settings.fox_decay_time_min, settings.fox_decay_time_max)
      bias_init = lambda key, shape, dtype=jnp.float32: jnp.asarray(bias, dtype)  # noqa: E731
    else:
      bias_init = nn.initializers.zeros
    weight = parameter(self, 'forget_gate_kernel', nn.initializers.normal(0.02),
                       (inputs_BxLqxD.shape[-1], self.num_heads))
    bias_H = parameter(self, 'forget_gate_bias', bias_init, (self.num_heads,))
    gate_logits_BxLqxH = inputs_BxLqxD.astype(jnp.float32) @ weight + bias_H
    log_forget_BxLqxH = jax.nn.log_sigmoid(gate_logits_BxLqxH)
    length_q = inputs_BxLqxD.shape[1]
    if use_cache:  # the first call sees the whole capacity; later ones write their tokens at cache_index
      cached = self.variable('cache', 'log_forget', lambda: log_forget_BxLqxH)
      if cache_index is not None:
        cached.value = jax.lax.dynamic_update_slice(cached.value, log_forget_BxLqxH, (0, cache_index, 0))
        cumulative_k_BxHxLk = forget_cumulative(cached.value)
        cumulative_q_BxHxLq = jax.lax.dynamic_slice_in_dim(cumulative_k_BxHxLk, cache_index, length_q, axis=2)
        return cumulative_q_BxHxLq[..., None], cumulative_k_BxHxLk[:, :, None, :]
    cumulative_BxHxL = forget_cumulative(log_forget_BxLqxH)
    return cumulative_BxHxL[..., None], cumulative_BxHxL[:, :, None, :]

  def kernel_term(self, kernel_shared, shared=None):
    """c_i - c_j inside the kernel, from the cumulative sums of each query and key (the kernel's data)."""
    cumulative_q_BxHxLqx1, cumulative_k_BxHx1xLk = shared
    return KernelTerm(fox_kernel_bias, jnp.zeros((self.num_heads, 1), jnp.float32),
                      q_data_BxHxLq=cumulative_q_BxHxLqx1[..., 0], k_data_BxHxLk=cumulative_k_BxHx1xLk[:, :, 0, :])

  def kernel_serves(self):
    return True

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    """c_i - c_j = sum_{t=j+1..i} log f_t (for keys j <= i; later ones are masked): B x H x Lq x Lk."""
    cumulative_q_BxHxLqx1, cumulative_k_BxHx1xLk = shared
    return cumulative_q_BxHxLqx1 - cumulative_k_BxHx1xLk


VARIANT = Variant(StackPositions, FoxLayer, 'Lin et al. 2025 (Forgetting Transformer)', FoxSettings,
                  shift_invariant=True, causal_only=True, rolling_cache=False)
