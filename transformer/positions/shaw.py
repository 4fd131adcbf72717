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

import dataclasses

import chex
import flax.linen as nn
import jax.numpy as jnp

from transformer.layers import parameter
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, relative_positions, require
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
  bucket_Ld = jnp.clip(distance_axis(length_q, length_k, offset), -clip_distance, clip_distance) + clip_distance
  return (bucket_Ld[None, :] == jnp.arange(2 * clip_distance + 1)[:, None]).astype(jnp.float32)


def shaw_logits_consecutive(query_BxLqxHxK, key_table_RxHxK, length_k: int, offset, clip_distance: int):
  """shaw_logits for q_i = q_0 + i, k_j = q_0 + c + j: B x H x Lq x Lk, without a gather."""
  per_distance_BxHxLqxR = jnp.einsum('bqhk,rhk->bhqr', query_BxLqxHxK.astype(jnp.float32),
                                     key_table_RxHxK.astype(jnp.float32))
  one_hot_RxLd = distance_one_hot(query_BxLqxHxK.shape[1], length_k, offset, clip_distance)
  return by_distance_to_by_key(jnp.einsum('bhqr,rt->bhqt', per_distance_BxHxLqxR, one_hot_RxLd), length_k)


def shaw_values_consecutive(weights_BxHxLqxLk, value_table_RxHxK, offset, clip_distance: int):
  """shaw_values for consecutive positions (offset c = k_0 - q_0): B x Lq x H x K, without a scatter."""
  _, _, length_q, length_k = weights_BxHxLqxLk.shape
  one_hot_RxLd = distance_one_hot(length_q, length_k, offset, clip_distance).astype(weights_BxHxLqxLk.dtype)
  per_distance_BxHxLqxR = jnp.einsum('bhqt,rt->bhqr', by_key_to_by_distance(weights_BxHxLqxLk), one_hot_RxLd)
  return jnp.einsum('bhqr,rhk->bqhk', per_distance_BxHxLqxR, value_table_RxHxK.astype(per_distance_BxHxLqxR.dtype))


def _pad_last(x, left: int, right: int):
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(left, right)])


def shift_rows_right(z_NxLqxR: chex.Array, width: int) -> chex.Array:
  """out[..., i, c] = z[..., i, c - i], zero outside z: ... x Lq x width, by a pad and a reshape."""
  *leading, length_q, columns = z_NxLqxR.shape
  row = max(columns + length_q - 1, width + 1)  # a zero tail of Lq - 1 feeds the next rows' heads
  flat = _pad_last(z_NxLqxR, 0, row - columns).reshape(*leading, length_q * row)
  return flat[..., :length_q * (row - 1)].reshape(*leading, length_q, row - 1)[..., :width]


def shift_rows_left(w_NxLqxLk: chex.Array, width: int) -> chex.Array:
  """out[..., i, m] = w[..., i, m + i], zero outside w: ... x Lq x width, by a pad and a reshape."""
  *leading, length_q, columns = w_NxLqxLk.shape
  row = max(columns, length_q - 1 + width)
  flat = _pad_last(_pad_last(w_NxLqxLk, 0, row - columns).reshape(*leading, length_q * row), 0, length_q)
  return flat.reshape(*leading, length_q, row + 1)[..., :width]


def band_table(table_RxHxK: chex.Array, clip_distance: int) -> chex.Array:
  """The rows for the distances -k .. 0, less row 0 (distance -k), which every farther key shares:
  (k+1) x H x K. Row 0 itself goes into the value vectors (a^V) or drops out of the softmax (a^K)."""
  return table_RxHxK[:clip_distance + 1] - table_RxHxK[:1]


def band_logits_consecutive(query_BxLqxHxK, band_table_RxHxK, length_k: int, offset: int) -> chex.Array:
  """q_i . a[j - i + k] for the R = k + 1 distances j - i in [-k, 0], zero elsewhere, for q_i = q_0 + i,
  k_j = q_0 + c + j: B x H x Lq x Lk (unscaled). Row i is its R numbers shifted right by i, so the
  layout costs Lq x (Lk + 1) entries, not the Lq x (Lq + Lk - 1) of the whole distance axis."""
  per_distance_BxHxLqxR = jnp.einsum('bqhk,rhk->bhqr', query_BxLqxHxK.astype(jnp.float32),
                                     band_table_RxHxK.astype(jnp.float32))
  # Entry r (distance r - k) belongs at key j = i + r - s, s = c + k.
  shift = offset + band_table_RxHxK.shape[0] - 1
  lead = max(shift, 0)
  placed = _pad_last(per_distance_BxHxLqxR, lead - shift, 0)
  return shift_rows_right(placed, lead + length_k)[..., lead:]


def band_values_consecutive(weights_BxHxLqxLk, band_table_RxHxK, offset: int) -> chex.Array:
  """sum over keys at distances j - i in [-k, 0] of w_ij a[j - i + k]: B x Lq x H x K."""
  num_distances = band_table_RxHxK.shape[0]
  shift = offset + num_distances - 1
  lead = max(shift, 0)
  per_distance_BxHxLqxR = shift_rows_left(_pad_last(weights_BxHxLqxLk, lead, 0),
                                          num_distances + lead - shift)[..., lead - shift:]
  return jnp.einsum('bhqr,rhk->bqhk', per_distance_BxHxLqxR,
                    band_table_RxHxK.astype(per_distance_BxHxLqxR.dtype))


@dataclasses.dataclass(frozen=True)
class ShawSettings(Settings):
  clip_distance: int = 16  # k: relative distances clipped to [-k, k], 2k + 1 vectors each for keys and values
  per_head: bool = False   # one a^K, a^V table per head instead of one shared by all heads (the paper)

  def check(self):
    require(self.clip_distance > 0, 'position.clip_distance', self.clip_distance, 'a positive integer')


class ShawBand:
  """Shaw's causal band (module docstring) for causal blockwise attention: `width` k; `logits` and
  `values` the re-centred terms, zero for keys more than k back; `value_offset()` (H x V) what the
  re-centring took out of the values term, which attention adds to each query head's output (the weights of
  every row sum to one), as to every value vector."""

  def __init__(self, layer: 'Shaw'):
    self.layer = layer
    self.width = layer.settings.clip_distance

  @staticmethod
  def _offset(q_positions_BxLq, k_positions_BxLk) -> int:
    consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
    if consecutive is not True:
      raise ValueError('Shaw: the causal band needs consecutive positions known while tracing')
    return offset

  def logits(self, query_BxLqxHxK, q_positions_BxLq, k_positions_BxLk, scale):
    offset = self._offset(q_positions_BxLq, k_positions_BxLk)
    table = band_table(self.layer.per_head_table(self.layer.key_table), self.width)
    return scale * band_logits_consecutive(query_BxLqxHxK, table, k_positions_BxLk.shape[1], offset)

  def values(self, weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk):
    offset = self._offset(q_positions_BxLq, k_positions_BxLk)
    table = band_table(self.layer.per_head_table(self.layer.value_table), self.width)
    return band_values_consecutive(weights_BxHxLqxLk, table, offset)

  def value_offset(self):
    return self.layer.per_head_table(self.layer.value_table)[0]


class Shaw(LayerPositions):
  """Owns this layer's a^K and a^V tables."""

  def setup(self):
    heads = self.num_heads if self.settings.per_head else 1
    shape = (2 * self.settings.clip_distance + 1, heads, self.head_dim)
    init = nn.initializers.normal(stddev=self.head_dim ** -0.5)
    self.key_table = parameter(self, 'key_table', init, shape)
    self.value_table = parameter(self, 'value_table', init, shape)

  def per_head_table(self, table_RxHxK):
    return jnp.broadcast_to(table_RxHxK, (table_RxHxK.shape[0], self.num_heads, self.head_dim))

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    clip, table = self.settings.clip_distance, self.per_head_table(self.key_table)
    consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
    length_k = k_positions_BxLk.shape[1]
    term = consecutive_or_gathered(
        consecutive, lambda: shaw_logits_consecutive(query_BxLqxHxK, table, length_k, offset, clip),
        lambda: shaw_logits(query_BxLqxHxK, table, shaw_buckets(q_positions_BxLq, k_positions_BxLk, clip)))
    return scale * term

  def needs_weights(self):
    return True

  def values(self, weights_BxHxLqxLk, q_positions_BxLq, k_positions_BxLk):
    clip, table = self.settings.clip_distance, self.per_head_table(self.value_table)
    consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
    return consecutive_or_gathered(
        consecutive, lambda: shaw_values_consecutive(weights_BxHxLqxLk, table, offset, clip),
        lambda: shaw_values(weights_BxHxLqxLk, table, shaw_buckets(q_positions_BxLq, k_positions_BxLk, clip)))

  def causal_band(self):
    return ShawBand(self) if self.causal else None


VARIANT = Variant(StackPositions, Shaw, 'Shaw et al. 2018', ShawSettings, shift_invariant=True)
