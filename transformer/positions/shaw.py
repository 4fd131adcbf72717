"""Relative position representations (Shaw, Uszkoreit and Vaswani 2018), in every self-attention layer.

e_ij = q_i . (k_j + a^K_ij) / sqrt(d),   z_i = sum_j w_ij (v_j + a^V_ij),
a_ij = table[clip(j - i, -k, k)]: 2k + 1 learned vectors for keys and as many for values, shared
by all heads (the paper) or one set per head.

No B x Lq x Lk x d tensor is built: the logits term computes each query against the 2k + 1 key
vectors (B x H x Lq x (2k+1)) and spreads them over the keys; the values term sums the attention
weights falling into each of the 2k + 1 distances, then mixes the value vectors. For consecutive
positions (always, inside the models) both go through the distance layout of relative.py, where
the spreading and the summing are small matmuls with a (2k+1) x (Lq+Lk-1) one-hot; otherwise
through an Lq x Lk gather and scatter-add.

The causal band. In causal attention every key more than k back shares the table's first row, so
with re-centred tables a'_r = a_r - a_{-k} and value vectors v'_j = v_j + a^V_{-k}
  q_i . a^K_{-k} is the same for every key of row i, and the softmax drops it;
  sum_j w_ij a^V_{-k} = a^V_{-k}, since a row's weights sum to 1,
so e_ij and z_i are the same with a', v' in place of a, v, and both terms vanish beyond the k + 1
distances -k .. 0: causal blockwise attention computes them on the band of keys next to each
query block only, and the keys before it go in without any term.
"""

import chex
import flax.linen as nn
import jax.numpy as jnp

from transformer.positions.base import LayerPositions, relative_positions
from transformer.positions.relative import (by_distance_to_by_key, by_key_to_by_distance, consecutive_or_gathered,
                                            contiguous_offset, distance_axis)


def shaw_buckets(q_positions_BxLq, k_positions_BxLk, clip_distance: int) -> chex.Array:
  """clip(j - i, -k, k) + k, in [0, 2k]: B x Lq x Lk."""
  relative = relative_positions(q_positions_BxLq, k_positions_BxLk)
  return jnp.clip(relative, -clip_distance, clip_distance) + clip_distance


def shaw_logits(query_BxLqxHxK, key_table_RxHxK, buckets_BxLqxLk) -> chex.Array:
  """q_i . a^K[bucket_ij]: B x H x Lq x Lk (unscaled)."""
  chex.assert_rank([query_BxLqxHxK, key_table_RxHxK, buckets_BxLqxLk], [4, 3, 3])
  per_distance_BxHxLqxR = jnp.einsum('bqhk,rhk->bhqr', query_BxLqxHxK.astype(jnp.float32),
                                     key_table_RxHxK.astype(jnp.float32))
  index = jnp.broadcast_to(buckets_BxLqxLk[:, None],
                           (per_distance_BxHxLqxR.shape[0], per_distance_BxHxLqxR.shape[1],
                            *buckets_BxLqxLk.shape[1:]))
  return jnp.take_along_axis(per_distance_BxHxLqxR, index, axis=-1)


def shaw_values(weights_BxHxLqxLk, value_table_RxHxK, buckets_BxLqxLk) -> chex.Array:
  """sum_j w_ij a^V[bucket_ij]: B x Lq x H x K."""
  chex.assert_rank([weights_BxHxLqxLk, value_table_RxHxK, buckets_BxLqxLk], [4, 3, 3])
  batch, heads, length_q, _ = weights_BxHxLqxLk.shape
  num_distances = value_table_RxHxK.shape[0]
  b = jnp.arange(batch)[:, None, None, None]
  h = jnp.arange(heads)[None, :, None, None]
  q = jnp.arange(length_q)[None, None, :, None]
  per_distance_BxHxLqxR = jnp.zeros((batch, heads, length_q, num_distances), weights_BxHxLqxLk.dtype)
  per_distance_BxHxLqxR = per_distance_BxHxLqxR.at[b, h, q, buckets_BxLqxLk[:, None]].add(weights_BxHxLqxLk)
  return jnp.einsum('bhqr,rhk->bqhk', per_distance_BxHxLqxR, value_table_RxHxK.astype(per_distance_BxHxLqxR.dtype))


def distance_one_hot(length_q: int, length_k: int, offset, clip_distance: int) -> chex.Array:
  """one_hot[r, t] = 1 where clip(j - i + c, -k, k) + k = r along the distance axis t: (2k+1) x (Lq+Lk-1)."""
  bucket_T = jnp.clip(distance_axis(length_q, length_k, offset), -clip_distance, clip_distance) + clip_distance
  return (bucket_T[None, :] == jnp.arange(2 * clip_distance + 1)[:, None]).astype(jnp.float32)


def shaw_logits_consecutive(query_BxLqxHxK, key_table_RxHxK, length_k: int, offset, clip_distance: int):
  """shaw_logits for q_i = q_0 + i, k_j = q_0 + c + j: B x H x Lq x Lk, without a gather."""
  per_distance_BxHxLqxR = jnp.einsum('bqhk,rhk->bhqr', query_BxLqxHxK.astype(jnp.float32),
                                     key_table_RxHxK.astype(jnp.float32))
  one_hot_RxT = distance_one_hot(query_BxLqxHxK.shape[1], length_k, offset, clip_distance)
  return by_distance_to_by_key(jnp.einsum('bhqr,rt->bhqt', per_distance_BxHxLqxR, one_hot_RxT), length_k)


def shaw_values_consecutive(weights_BxHxLqxLk, value_table_RxHxK, offset, clip_distance: int):
  """shaw_values for consecutive positions (offset c = k_0 - q_0): B x Lq x H x K, without a scatter."""
  _, _, length_q, length_k = weights_BxHxLqxLk.shape
  one_hot_RxT = distance_one_hot(length_q, length_k, offset, clip_distance).astype(weights_BxHxLqxLk.dtype)
  per_distance_BxHxLqxR = jnp.einsum('bhqt,rt->bhqr', by_key_to_by_distance(weights_BxHxLqxLk), one_hot_RxT)
  return jnp.einsum('bhqr,rhk->bqhk', per_distance_BxHxLqxR, value_table_RxHxK.astype(per_distance_BxHxLqxR.dtype))


def _place_columns(x_NxP, start: int, width: int) -> chex.Array:
  """out[..., start + r] = x[..., r] on a zero axis of `width`; what falls outside it is dropped."""
  if start < 0:
    x_NxP, start = x_NxP[..., -start:], 0
  x_NxP = x_NxP[..., :max(width - start, 0)]
  return jnp.pad(x_NxP, [(0, 0)] * (x_NxP.ndim - 1) + [(start, width - start - x_NxP.shape[-1])])


def _take_columns(x_NxT, start: int, count: int) -> chex.Array:
  """x[..., start + r] for r in [0, count), zero where start + r is outside x's last axis."""
  width = x_NxT.shape[-1]
  left, right = max(-start, 0), max(start + count - width, 0)
  padded = jnp.pad(x_NxT, [(0, 0)] * (x_NxT.ndim - 1) + [(left, right)])
  return padded[..., start + left:start + left + count]


def band_logits_consecutive(query_BxLqxHxK, band_table_PxHxK, length_k: int, offset: int) -> chex.Array:
  """q_i . a[j - i + k] for the P = k + 1 distances j - i in [-k, 0], zero elsewhere, for q_i = q_0 + i,
  k_j = q_0 + c + j: B x H x Lq x Lk (unscaled)."""
  length_q = query_BxLqxHxK.shape[1]
  per_distance_BxHxLqxP = jnp.einsum('bqhk,rhk->bhqr', query_BxLqxHxK.astype(jnp.float32),
                                     band_table_PxHxK.astype(jnp.float32))
  # Distance d = j - i + c sits at t = d - c + Lq - 1 of the distance axis; d = -k is r = 0.
  first = length_q - 1 - offset - (band_table_PxHxK.shape[0] - 1)
  return by_distance_to_by_key(_place_columns(per_distance_BxHxLqxP, first, length_q + length_k - 1), length_k)


def band_values_consecutive(weights_BxHxLqxLk, band_table_PxHxK, offset: int) -> chex.Array:
  """sum over keys at distances j - i in [-k, 0] of w_ij a[j - i + k]: B x Lq x H x K."""
  length_q = weights_BxHxLqxLk.shape[2]
  first = length_q - 1 - offset - (band_table_PxHxK.shape[0] - 1)
  per_distance_BxHxLqxP = _take_columns(by_key_to_by_distance(weights_BxHxLqxLk), first, band_table_PxHxK.shape[0])
  return jnp.einsum('bhqr,rhk->bqhk', per_distance_BxHxLqxP,
                    band_table_PxHxK.astype(per_distance_BxHxLqxP.dtype))


class Shaw(LayerPositions):
  """Owns this layer's a^K and a^V tables."""

  def setup(self):
    heads = self.num_heads if self.config.per_head else 1
    shape = (2 * self.config.clip_distance + 1, heads, self.head_dim)
    init = nn.initializers.normal(stddev=self.head_dim ** -0.5)
    self.key_table = self.param('key_table', init, shape)
    self.value_table = self.param('value_table', init, shape)

  def _per_head(self, table_RxHxK):
    return jnp.broadcast_to(table_RxHxK, (table_RxHxK.shape[0], self.num_heads, self.head_dim))

  def logits(self, query_BxLqxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    clip, table = self.config.clip_distance, self._per_head(self.key_table)
    consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
    length_k = k_positions_BxLk.shape[1]
    term = consecutive_or_gathered(
        consecutive, lambda: shaw_logits_consecutive(query_BxLqxHxK, table, length_k, offset, clip),
        lambda: shaw_logits(query_BxLqxHxK, table, shaw_buckets(q_positions_BxLq, k_positions_BxLk, clip)))
    return scale * term

  def needs_weights(self):
    return True

  def values(self, weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk):
    clip, table = self.config.clip_distance, self._per_head(self.value_table)
    consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
    return consecutive_or_gathered(
        consecutive, lambda: shaw_values_consecutive(weights_BxHxLqxLk, table, offset, clip),
        lambda: shaw_values(weights_BxHxLqxLk, table, shaw_buckets(q_positions_BxLq, k_positions_BxLk, clip)))

  def causal_band(self):
    return self.config.clip_distance if self.causal else None

  def _band_table(self, table_RxHxK):
    """Rows for the distances -k .. 0, less the row every farther key shares: (k+1) x H x K."""
    table = self._per_head(table_RxHxK)
    return table[:self.config.clip_distance + 1] - table[:1]

  def band_logits(self, query_BxLqxHxK, q_positions_BxLq, k_positions_BxLk, scale):
    consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
    if consecutive is not True:
      raise ValueError('Shaw.band_logits: needs consecutive positions known while tracing')
    return scale * band_logits_consecutive(query_BxLqxHxK, self._band_table(self.key_table),
                                           k_positions_BxLk.shape[1], offset)

  def band_values(self, weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk):
    consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
    if consecutive is not True:
      raise ValueError('Shaw.band_values: needs consecutive positions known while tracing')
    return band_values_consecutive(weights_BxHxLqxLk, self._band_table(self.value_table), offset)

  def value_offset(self):
    return self._per_head(self.value_table)[0]
