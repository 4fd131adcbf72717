"""Scaled dot-product attention (Vaswani et al. 2017, section 3.2.1), the same through
jax.nn.dot_product_attention, the split and merge of heads (section 3.2.2), and grouped-query attention's
products (Ainslie et al. 2023): H query heads over G key and value heads, query head h reading key and
value head h // (H / G) (the layout of Hugging Face's checkpoints), each key and value head read once for
its group, never repeated in memory."""

import math
from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp

from transformer.layers import dropout
from transformer.masks import self_attention_mask, window_mask
from transformer.softmax import soft_cap, softmax


def check_groups(query_heads: int, key_value_heads: int) -> int:
  """The group size H / G: ValueError unless the key and value heads divide the query heads."""
  if key_value_heads <= 0 or query_heads % key_value_heads:
    raise ValueError(f'num_kv_heads: got {key_value_heads} key and value heads for {query_heads} query heads; '
                     f'valid: a divisor of num_heads={query_heads}')
  return query_heads // key_value_heads


def _by_group(per_query_head: chex.Array, per_group: chex.Array, contraction: str) -> chex.Array:
  """An einsum of every query head h (per_query_head, B x H x Lq x .) with head h // (H / G) of the shared operand
  (per_group, B x G x Lk x .): a group's H / G query heads go in as one block of rows (a free reshape), so the
  shared heads are read once. contraction names the last two axes of each operand and of the result, e.g.
  'qk,sk->qs'."""
  batch, heads, length_q, _ = per_query_head.shape
  groups = per_group.shape[1]
  group_size = check_groups(heads, groups)
  grouped_rows = per_query_head.reshape(batch, groups, group_size * length_q, per_query_head.shape[-1])
  operands, result = contraction.split('->')
  rows, shared = operands.split(',')
  product = jnp.einsum(f'bg{rows},bg{shared}->bg{result}', grouped_rows, per_group)
  return product.reshape(batch, heads, length_q, product.shape[-1])


def grouped_logits(query_BxHxLqxK: chex.Array, key_BxGxLkxK: chex.Array) -> chex.Array:
  """q_i . k_j for every query head h with its key head h // (H / G): B x H x Lq x Lk."""
  return _by_group(query_BxHxLqxK, key_BxGxLkxK, 'qk,sk->qs')


def grouped_output(weights_BxHxLqxLk: chex.Array, value_BxGxLkxV: chex.Array) -> chex.Array:
  """sum_j a_ij v_j for every query head h with its value head h // (H / G): B x H x Lq x V."""
  return _by_group(weights_BxHxLqxLk, value_BxGxLkxV, 'qs,sv->qv')


def grouped_logits_heads_last(query_BxLqxHxK: chex.Array, key_BxLkxGxK: chex.Array) -> chex.Array:
  """grouped_logits in float32 for queries and keys in the B x L x heads x K layout: B x H x Lq x Lk."""
  return grouped_logits(jnp.transpose(query_BxLqxHxK, (0, 2, 1, 3)).astype(jnp.float32),
                        jnp.transpose(key_BxLkxGxK, (0, 2, 1, 3)).astype(jnp.float32))


def scaled_dot_product_attention(query: chex.Array, key: chex.Array, value: chex.Array, *,
                                 mask: Optional[chex.Array] = None, bias: Optional[chex.Array] = None,
                                 scale: Optional[float] = None, return_weights: bool = False,
                                 dropout_rate: float = 0.0, dropout_rng: Optional[chex.PRNGKey] = None,
                                 deterministic: bool = True, weights_function: Optional[Callable] = None,
                                 softcap: float = 0.0, sink_H: Optional[chex.Array] = None):
  """Attention(Q, K, V) = softmax(cap(Q K^T * scale + bias), sink) V, scale = 1/sqrt(d_k) by default.

  query: B x Lq x H x K, key: B x Lk x G x K, value: B x Lk x G x V (the layout of
  `jax.nn.dot_product_attention`; G divides H, query head h reads key and value head h // (H / G)). mask
  (True = attend) and bias broadcast to B x H x Lq x Lk.
  Logits and softmax are in float32 whatever the input dtype. The 1/sqrt(d_k) keeps the logits'
  variance near 1 as d_k grows, so the softmax does not saturate.
  weights_function(logits, mask) -> weights replaces the softmax (stick-breaking attention).
  softcap c > 0: the logits capped to c tanh(x / c) (Gemma 2), the bias included; sink_H: a logit per head in
  every row's denominator that reads no value (softmax.softmax's sink; GPT-OSS).
  Returns the output, B x Lq x H x V, and with return_weights the weights, B x H x Lq x Lk.
  """
  chex.assert_rank([query, key, value], 4)
  chex.assert_equal_shape_prefix([key, value], 3)
  chex.assert_equal_shape([query[:, :1, :1], key[:, :1, :1]])  # same batch and head width
  batch, length_q, heads, head_dim = query.shape
  length_k = key.shape[1]
  if scale is None:
    scale = 1.0 / math.sqrt(head_dim)
  # Heads first before the matmuls: XLA's CPU backend runs B x H x L x K batched matmuls much faster
  # than the same contraction over the B x L x H x K layout.
  query_BxHxLqxK = jnp.transpose(query, (0, 2, 1, 3)).astype(jnp.float32)
  key_BxGxLkxK = jnp.transpose(key, (0, 2, 1, 3)).astype(jnp.float32)
  logits_BxHxLqxLk = grouped_logits(query_BxHxLqxK, key_BxGxLkxK) * scale
  if bias is not None:
    logits_BxHxLqxLk = logits_BxHxLqxLk + bias.astype(jnp.float32)
  chex.assert_shape(logits_BxHxLqxLk, (batch, heads, length_q, length_k))
  logits_BxHxLqxLk = soft_cap(logits_BxHxLqxLk, softcap)
  if sink_H is None:
    weights_BxHxLqxLk = (weights_function or softmax)(logits_BxHxLqxLk, mask)
  else:
    if weights_function is not None:
      raise ValueError('sink_H: a sink joins a softmax\'s denominator; valid: None with a weights_function')
    chex.assert_shape(sink_H, (heads,))
    weights_BxHxLqxLk = softmax(logits_BxHxLqxLk, mask, sink=sink_H.astype(jnp.float32)[None, :, None, None])
  attended = dropout(weights_BxHxLqxLk, dropout_rate, dropout_rng, deterministic)
  output_BxHxLqxV = grouped_output(attended.astype(value.dtype), jnp.transpose(value, (0, 2, 1, 3)))
  output_BxLqxHxV = jnp.transpose(output_BxHxLqxV, (0, 2, 1, 3))
  chex.assert_shape(output_BxLqxHxV, (batch, length_q, heads, value.shape[-1]))
  return (output_BxLqxHxV, weights_BxHxLqxLk) if return_weights else output_BxLqxHxV


def fused_attention(query: chex.Array, key: chex.Array, value: chex.Array, *, mask: Optional[chex.Array] = None,
                    bias: Optional[chex.Array] = None, scale: Optional[float] = None,
                    implementation: str = 'xla', mask_parts: Optional[tuple] = None,
                    sink_H: Optional[chex.Array] = None) -> chex.Array:
  """The same attention through `jax.nn.dot_product_attention` (same layout, B x L x H x K, keys and values
  with G heads, which it groups as scaled_dot_product_attention does) with the given
  implementation ('xla' or 'cudnn'), which never hands back the weights. A fully masked row gives a uniform
  average here (zeros in scaled_dot_product_attention); no model in this library produces one for a
  position whose output is used.

  With mask_parts = (causal, key_valid_BxLk, window) the mask goes in as its parts: causal as is_causal (cuDNN then
  skips the blocks above the diagonal), a sliding window W as local_window_size (W - 1, 0) (causal) or
  (W - 1, W - 1), the keys' padding as key_value_seq_lengths where it is at the end
  of every row (checked on the values: elsewhere a B x 1 x 1 x Lk mask through XLA's implementation).
  Otherwise masks and biases are broadcast to B x H x Lq x Lk as it requires. sink_H (XLA's implementation): one
  more key per row, of zero value, whose logit is the head's sink (the mask then goes in whole)."""
  batch, length_q, heads, _ = query.shape
  shape = (batch, heads, length_q, key.shape[1])
  if sink_H is not None:
    return _fused_with_sink(query, key, value, mask, bias, scale, mask_parts, sink_H)
  if bias is not None:
    bias = jnp.broadcast_to(bias.astype(query.dtype), shape)
  if mask_parts is None:
    output = jax.nn.dot_product_attention(query, key, value, bias=bias, scale=scale, implementation=implementation,
                                          mask=None if mask is None else jnp.broadcast_to(mask, shape))
  else:
    causal, key_valid_BxLk, window = mask_parts
    local = None if not window else (window - 1, 0 if causal else window - 1)

    def attend(lengths=None, padding=None, core=implementation):
      return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=padding, scale=scale, is_causal=causal,
                                          key_value_seq_lengths=lengths, local_window_size=local, implementation=core)
    if key_valid_BxLk is None:
      output = attend()
    else:
      key_valid_BxLk = jnp.broadcast_to(key_valid_BxLk, (batch, key.shape[1])).astype(jnp.bool_)
      lengths_B = jnp.sum(key_valid_BxLk, axis=1, dtype=jnp.int32)
      at_the_end = jnp.all(key_valid_BxLk == (jnp.arange(key.shape[1])[None, :] < lengths_B[:, None]))
      output = jax.lax.cond(at_the_end, lambda: attend(lengths=lengths_B),
                            lambda: attend(padding=key_valid_BxLk[:, None, None, :], core='xla'))
  chex.assert_shape(output, (batch, length_q, heads, value.shape[-1]))
  return output


def _fused_with_sink(query, key, value, mask, bias, scale, mask_parts, sink_H):
  """XLA's fused attention over the keys and one more of zero key and value, its logit sink_h: the softmax's
  denominator gains exp(sink_h), the output nothing."""
  batch, length_q, heads, _ = query.shape
  length_k = key.shape[1]
  if mask_parts is not None:  # the parts as one mask (masks.py)
    causal, key_valid_BxLk, window = mask_parts
    valid = None if key_valid_BxLk is None else jnp.broadcast_to(key_valid_BxLk, (batch, length_k))
    mask = self_attention_mask(valid, length_k, causal)
    if window:
      local = window_mask(jnp.arange(length_q)[None], jnp.arange(length_k)[None], window=window, causal=causal)
      mask = local if mask is None else jnp.logical_and(mask, local)
  shape = (batch, heads, length_q, length_k)
  mask = jnp.ones(shape, bool) if mask is None else jnp.broadcast_to(mask, shape)
  bias = jnp.zeros(shape, jnp.float32) if bias is None else jnp.broadcast_to(bias.astype(jnp.float32), shape)
  sink_column = jnp.broadcast_to(sink_H.astype(jnp.float32)[None, :, None, None], (batch, heads, length_q, 1))
  zero = lambda x: jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=1)
  output = jax.nn.dot_product_attention(
      query, zero(key), zero(value), scale=scale, implementation='xla',
      bias=jnp.concatenate([bias, sink_column], axis=-1).astype(query.dtype),
      mask=jnp.concatenate([mask, jnp.ones((batch, heads, length_q, 1), bool)], axis=-1))
  chex.assert_shape(output, (batch, length_q, heads, value.shape[-1]))
  return output


def split_heads(x_BxLxD: chex.Array, num_heads: int) -> chex.Array:
  """B x L x (H*K) -> B x L x H x K."""
  batch, length, width = x_BxLxD.shape
  return x_BxLxD.reshape(batch, length, num_heads, width // num_heads)


def merge_heads(x_BxLxHxK: chex.Array) -> chex.Array:
  """Concat(head_1, ..., head_H): B x L x H x K -> B x L x (H*K)."""
  batch, length, heads, head_dim = x_BxLxHxK.shape
  return x_BxLxHxK.reshape(batch, length, heads * head_dim)
