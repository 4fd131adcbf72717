"""T5 relative position bias (Raffel et al. 2020, section 2.1; mesh-tensorflow's bucketing).

logits_ij += b_h[bucket(j - i)], one learned scalar per bucket and head. Distances below
num_buckets/2 (per direction) get a bucket each; larger ones share log-spaced buckets up to
max_distance, beyond which every distance falls in the last bucket. Encoders use separate buckets
for the two directions; causal decoders only look back, so all buckets go to the past.
"""

import dataclasses
import math

import chex
import flax.linen as nn
import jax.numpy as jnp

from transformer.flash_attention import KernelTerm
from transformer.layers import parameter
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, relative_positions, require
from transformer.positions.relative import (by_distance_to_by_key, consecutive_or_gathered, contiguous_offset,
                                            distance_axis)


@dataclasses.dataclass(frozen=True)
class T5Settings(Settings):
  num_buckets: int = 32              # buckets (encoders: half for each direction)
  max_distance: int = 128            # distance of the last, log-spaced bucket; farther ones share it
  shared_across_layers: bool = True  # one bias table for all layers (the paper), or one per layer

  def check(self):
    require(self.num_buckets > 0 and self.num_buckets % 2 == 0, 'position.num_buckets', self.num_buckets,
            'a positive even number (half the buckets for each direction in encoders)')
    require(self.max_distance > 0, 'position.max_distance', self.max_distance, 'a positive integer')

  def check_attention(self, num_heads, head_dim, causal):
    # The log-spaced buckets span distances num_exact .. max_distance, num_exact = the buckets of one
    # direction / 2: with max_distance <= num_exact the log ratio is 0 or negative.
    per_direction = self.num_buckets if causal else self.num_buckets // 2
    attention = 'causal' if causal else 'bidirectional'
    require(per_direction >= 2, 'position.num_buckets', self.num_buckets,
            f'at least {2 if causal else 4} in {attention} attention (2 buckets for each direction)')
    require(self.max_distance > per_direction // 2, 'position.max_distance', self.max_distance,
            f'more than num_buckets / {2 if causal else 4} = {per_direction // 2} in {attention} attention '
            f'(num_buckets={self.num_buckets}), where the exact buckets end and the log-spaced ones begin')


def t5_bucket(relative_position: chex.Array, *, bidirectional: bool, num_buckets: int = 32,
              max_distance: int = 128) -> chex.Array:
  """bucket(j - i) in [0, num_buckets), int32, elementwise."""
  distance = -relative_position.astype(jnp.int32)  # > 0 for keys in the past
  bucket = jnp.zeros_like(distance)
  if bidirectional:
    num_buckets //= 2
    bucket = bucket + jnp.where(distance < 0, num_buckets, 0)  # keys in the future
    distance = jnp.abs(distance)
  else:
    distance = jnp.maximum(distance, 0)
  num_exact = num_buckets // 2
  log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / num_exact) / math.log(max_distance / num_exact)
  log_bucket = num_exact + (log_ratio * (num_buckets - num_exact)).astype(jnp.int32)
  log_bucket = jnp.minimum(log_bucket, num_buckets - 1)
  return bucket + jnp.where(distance < num_exact, distance, log_bucket)


def t5_bias(table_RxH: chex.Array, q_positions_BxLq, k_positions_BxLk, *, bidirectional: bool,
            max_distance: int) -> chex.Array:
  """b[bucket(j - i)] arranged as B x H x Lq x Lk. For consecutive positions the Lq + Lk - 1 distances
  are looked up and skewed into place (relative.py); otherwise an Lq x Lk gather."""
  consecutive, offset = contiguous_offset(q_positions_BxLq, k_positions_BxLk)
  shape = (q_positions_BxLq.shape[0], table_RxH.shape[1], q_positions_BxLq.shape[1], k_positions_BxLk.shape[1])
  return consecutive_or_gathered(
      consecutive,
      lambda: jnp.broadcast_to(_t5_bias_consecutive(table_RxH, *shape[2:], offset, bidirectional=bidirectional,
                                                    max_distance=max_distance), shape),
      lambda: jnp.broadcast_to(t5_bias_gathered(table_RxH, q_positions_BxLq, k_positions_BxLk,
                                                 bidirectional=bidirectional, max_distance=max_distance), shape))


def _t5_bias_consecutive(table_RxH, length_q: int, length_k: int, offset, *, bidirectional: bool,
                         max_distance: int) -> chex.Array:
  """1 x H x Lq x Lk from the Lq + Lk - 1 distances a consecutive block covers."""
  num_buckets, num_heads = table_RxH.shape
  buckets_Ld = t5_bucket(distance_axis(length_q, length_k, offset), bidirectional=bidirectional,
                        num_buckets=num_buckets, max_distance=max_distance)
  by_distance_HxLd = jnp.transpose(table_RxH[buckets_Ld])
  rows_HxLqxLd = jnp.broadcast_to(by_distance_HxLd[:, None], (num_heads, length_q, buckets_Ld.shape[0]))
  return by_distance_to_by_key(rows_HxLqxLd, length_k)[None]


def t5_bias_gathered(table_RxH, q_positions_BxLq, k_positions_BxLk, *, bidirectional: bool,
                      max_distance: int) -> chex.Array:
  num_buckets, num_heads = table_RxH.shape
  buckets_BxLqxLk = t5_bucket(relative_positions(q_positions_BxLq, k_positions_BxLk),
                              bidirectional=bidirectional, num_buckets=num_buckets,
                              max_distance=max_distance)
  bias_BxLqxLkxH = table_RxH[buckets_BxLqxLk]
  bias = jnp.transpose(bias_BxLqxLkxH, (0, 3, 1, 2))
  chex.assert_shape(bias, (buckets_BxLqxLk.shape[0], num_heads, *buckets_BxLqxLk.shape[1:]))
  return bias


def t5_kernel_term(table_RxH: chex.Array, *, bidirectional: bool, max_distance: int) -> KernelTerm:
  """b_h[bucket(j - i)] for a kernel: the bucket computed from the block's positions, the lookup a sum of
  selects over the table's num_buckets entries (a kernel has no gather)."""
  num_buckets = table_RxH.shape[0]

  def bias(parameters, q_positions_bqx1, k_positions_1xbk):
    buckets = t5_bucket(k_positions_1xbk - q_positions_bqx1, bidirectional=bidirectional, num_buckets=num_buckets,
                        max_distance=max_distance)
    term = jnp.zeros(buckets.shape, jnp.float32)
    for bucket, value in enumerate(parameters):
      term = term + jnp.where(buckets == bucket, value, 0.0)
    return term
  return KernelTerm(bias, jnp.transpose(table_RxH))


def _bias_table(module: nn.Module):
  return parameter(module, 'relative_bias', nn.initializers.normal(stddev=0.02),
                   (module.settings.num_buckets, module.num_heads))


def _bias(module: nn.Module, table, q_positions, k_positions):
  return t5_bias(table, q_positions, k_positions, bidirectional=not module.causal,
                 max_distance=module.settings.max_distance)


class T5Stack(StackPositions):
  """With shared_across_layers, owns the one table and builds the bias once per forward pass."""

  def setup(self):
    if self.settings.shared_across_layers:
      self.table = _bias_table(self)

  def shared(self, q_positions_BxLq, k_positions_BxLk):
    if not self.settings.shared_across_layers:
      return None
    return _bias(self, self.table, q_positions_BxLq, k_positions_BxLk)

  def kernel_shared(self):
    return self.table if self.settings.shared_across_layers else None


class T5Layer(LayerPositions):
  """Adds the shared bias, or, without sharing, its own layer's bias."""

  def setup(self):
    if not self.settings.shared_across_layers:
      self.table = _bias_table(self)

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    if self.settings.shared_across_layers:
      return shared
    return _bias(self, self.table, q_positions_BxLq, k_positions_BxLk)

  def kernel_term(self, kernel_shared, shared=None):
    table = kernel_shared if self.settings.shared_across_layers else self.table
    return t5_kernel_term(table, bidirectional=not self.causal, max_distance=self.settings.max_distance)

  def kernel_serves(self):
    return True


VARIANT = Variant(T5Stack, T5Layer, 'Raffel et al. 2020 (T5)', T5Settings, shift_invariant=True)
