"""Numerically stable, mask-aware softmax."""

from typing import Optional

import chex
import jax
import jax.numpy as jnp


def soft_cap(logits: chex.Array, cap: float) -> chex.Array:
  """c tanh(x / c) (Gemma 2's logit soft-capping): about x for |x| << c, never beyond +-c; cap 0: x."""
  return logits if not cap else cap * jnp.tanh(logits / cap)


def masked_fill_value(dtype) -> float:
  """The large finite negative used for masked logits (never -inf, which gives NaN)."""
  return float(jnp.finfo(dtype).min)


def softmax(logits: chex.Array, mask: Optional[chex.Array] = None, axis: int = -1,
            sink: Optional[chex.Array] = None) -> chex.Array:
  """softmax(x)_i = exp(x_i - max_j x_j) / sum_k exp(x_k - max_j x_j), over allowed entries.

  sink s (broadcastable to the logits with the axis of size 1; GPT-OSS's attention sinks): one more logit in
  the denominator that gets no weight of its own, exp(x_i) / (exp(s) + sum_k exp(x_k)); the weights then sum to
  less than one.

  Subtracting the row maximum keeps exp() in range for logits of any size (1e4 is fine). Masked
  entries (mask False) get weight exactly 0; a row whose entries are all masked gives all zeros,
  not NaN and not a uniform row.
  """
  if mask is not None:
    mask = jnp.broadcast_to(mask, logits.shape)
    logits = jnp.where(mask, logits, masked_fill_value(logits.dtype))
  # The weights do not depend on the shift, so no gradient flows through the maximum (autodiff
  # would otherwise spend a compare and select over all the logits in the backward pass).
  row_max = jax.lax.stop_gradient(jnp.max(logits, axis=axis, keepdims=True))
  if sink is not None:
    row_max = jnp.maximum(row_max, jax.lax.stop_gradient(sink))
  exponentials = jnp.exp(logits - row_max)
  if mask is not None:
    exponentials = jnp.where(mask, exponentials, 0.0)
  total = jnp.sum(exponentials, axis=axis, keepdims=True)
  if sink is not None:
    total = total + jnp.exp(sink - row_max)
  weights = exponentials / jnp.where(total == 0.0, 1.0, total)
  chex.assert_equal_shape([weights, logits])
  return weights
