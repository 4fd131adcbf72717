"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda and Kim, 2025, "PaTH Attention: Position
Encoding via Accumulating Householder Transformations"), in every self-attention layer of a causal model.

Between a key and a query the positions are the data-dependent reflections of the tokens after the key,

  e_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(d),   H_s = I - beta_s w_s w_s^T,

per key head (with grouped-query attention the query heads of a group share their key head's reflections),
w_s = the unit vector of W_w x_s (W_w of rank 32; both as flash-linear-attention's layer has them) and
beta_s = 2 sigmoid(u . x_s + b) in (0, 2) (so H_s may flip a direction), from the layer's input x_s. A
direct product costs O(L^2 d^2) per head (L^2 matrices); here the query is carried backwards over the
keys instead, v_i <- H_s v_i once key s is read, which costs O(L^2 d). The keys go in chunks of 64, each
chunk's reflections one matrix I - W^T T W by the UT transform, as the paper's kernels do, so the carry takes
L / 64 steps of matrix products rather than L steps of vector ones; each layer computes its chunks' T once, for
all its blocks of queries. The logits hook adds
e_ij - q_i . k_j / sqrt(d) to the plain logits. Causal only; each query block of blockwise attention takes
its keys in one block (the reflections run over all of them).

from_inputs computes w and beta per token, with the tokens' indices in the row (not their positions);
incremental decoding keeps them in the cache (the keys' reflections are read again at every step). In a
row that packs several documents, the reflections between a key and a query are those of their own
document.
"""

from typing import Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.attention import check_groups, grouped_logits_heads_last
from transformer.layers import parameter
from transformer.positions.base import LayerPositions, StackPositions, Variant

LOW_RANK = 32  # W_w = W_up W_down through this width, as flash-linear-attention's PaTH layer
CHUNK_SIZE = 64  # keys per step of the chunked form


def unit_upper_triangular_inverse(strict_upper_NxCxC: chex.Array) -> chex.Array:
  """(I + X)^-1 for X strictly upper triangular (any leading axes), by doubling the diagonal blocks:
  [[A, B], [0, D]]^-1 = [[A^-1, -A^-1 B D^-1], [0, D^-1]], log2(C) rounds of matrix products. (XLA's
  triangular solve runs LAPACK on a CPU, whose batched kernels can wait on each other in a 2-thread pool.)"""
  size = strict_upper_NxCxC.shape[-1]
  padded = 1 << max(0, (size - 1).bit_length())  # identity rows and columns to a power of 2
  x_NxPxP = jnp.pad(strict_upper_NxCxC, [(0, 0)] * (strict_upper_NxCxC.ndim - 2) + [(0, padded - size)] * 2)
  leading = x_NxPxP.shape[:-2]
  inverse_NxBxMxM = jnp.ones((*leading, padded, 1, 1), x_NxPxP.dtype)  # the 1 x 1 blocks' inverses
  block = 1
  while block < padded:
    pairs = padded // (2 * block)
    blocks_NxBxMxBxM = x_NxPxP.reshape(*leading, pairs, 2 * block, pairs, 2 * block)
    diagonal_NxMxMxB = jnp.diagonal(blocks_NxBxMxBxM, axis1=-4, axis2=-2)
    upper_right_NxBxMxM = jnp.moveaxis(diagonal_NxMxMxB, -1, -3)[..., :block, block:]
    first, second = inverse_NxBxMxM[..., 0::2, :, :], inverse_NxBxMxM[..., 1::2, :, :]
    corner = -first @ upper_right_NxBxMxM @ second
    top = jnp.concatenate([first, corner], axis=-1)
    bottom = jnp.concatenate([jnp.zeros_like(second), second], axis=-1)
    inverse_NxBxMxM = jnp.concatenate([top, bottom], axis=-2)
    block *= 2
  return inverse_NxBxMxM[..., 0, :size, :size]


def chunk_transforms(w_BxHxNxCxK: chex.Array, beta_BxHxNxC: chex.Array) -> chex.Array:
  """The UT transform of each chunk's reflections: H_1 H_2 ... H_C = I - W^T T W with W the chunk's w_s as rows
  and T = (I + diag(beta) striu(W W^T))^-1 diag(beta), upper triangular (the UT transform, Joffrain et al. 2006).
  A run of consecutive reflections a..b inside the chunk is I - W^T T[a..b, a..b] W: a triangular matrix's
  inverse has the inverses of its diagonal blocks on its diagonal. Returns T, B x H x N x C x C."""
  chex.assert_rank([w_BxHxNxCxK, beta_BxHxNxC], [5, 4])
  gram_BxHxNxCxC = jnp.einsum('bhnsk,bhntk->bhnst', w_BxHxNxCxK, w_BxHxNxCxK)
  inverse_BxHxNxCxC = unit_upper_triangular_inverse(beta_BxHxNxC[..., :, None] * jnp.triu(gram_BxHxNxCxC, 1))
  return inverse_BxHxNxCxC * beta_BxHxNxC[..., None, :]


def chunk_transform_columns(w_BxHxKxLk: chex.Array, beta_BxHxLk: chex.Array, chunk_size: int) -> chex.Array:
  """Every chunk's T (chunk_transforms) for the keys cut into chunks of C from key 0, the last chunk filled out
  with keys that reflect nothing (beta 0: their rows and columns of T are 0), laid out B x H x C x Lk with T[s, t]
  of chunk n at [..., s, n C + t]. Keys 0 .. m - 1 have the T of their own chunks in columns :m, for any m: where
  m ends inside a chunk, the inverse's leading block is the leading block's inverse (T is upper triangular)."""
  chex.assert_rank([w_BxHxKxLk, beta_BxHxLk], [4, 3])
  batch, heads, width, length = w_BxHxKxLk.shape
  padding = -length % chunk_size
  w_BxHxLkxK = jnp.pad(jnp.transpose(w_BxHxKxLk, (0, 1, 3, 2)).astype(jnp.float32),
                       [(0, 0), (0, 0), (0, padding), (0, 0)])
  beta_BxHxLk = jnp.pad(beta_BxHxLk.astype(jnp.float32), [(0, 0), (0, 0), (0, padding)])
  num_chunks = (length + padding) // chunk_size
  transform_BxHxNxCxC = chunk_transforms(w_BxHxLkxK.reshape(batch, heads, num_chunks, chunk_size, width),
                                         beta_BxHxLk.reshape(batch, heads, num_chunks, chunk_size))
  return jnp.moveaxis(transform_BxHxNxCxC, 2, 3).reshape(batch, heads, chunk_size, -1)[..., :length]


def reflected_logits(query_BxLqxHxK: chex.Array, key_BxLkxGxK: chex.Array, w_BxGxKxLk: chex.Array,
                     beta_BxGxLk: chex.Array, query_index_BxLq: chex.Array, key_index_BxLk: chex.Array,
                     chunk_size: int = CHUNK_SIZE, transform_BxGxCxLk: Optional[chex.Array] = None) -> chex.Array:
  """q_i^T H_i ... H_{j+1} k_j for every query i and key j (unscaled): B x H x Lq x Lk. The keys are
  consecutive tokens, the last at or after every query's; key j's own reflection H_j (w, beta at column j)
  applies to the queries at index >= the key's. Later keys' logits (j > i) are computed but meaningless:
  the causal mask removes them.

  The keys go in chunks of C, from the last chunk to the first, carrying each query v_i backwards (v_i = q_i
  at the start). With T the chunk's UT transform, a_it = (v_i . w_t) [t <= i] and r_i = a_i T^T, a key j
  of the chunk gets
    e_ij = v_i . k_j - sum_s r_is (w_s . k_j) [s > j]
  (the chunk's reflections between the key and the query, whether the query is inside the chunk or after
  it), and then v_i <- v_i - sum_s r_is w_s (the chunk's reflections up to the query, all of them for a
  query after it). O(Lq Lk (d + C)) per head in Lk / C sequential steps of matrix products. transform: the
  keys' chunk_transform_columns where the caller has them (a layer's query blocks share them); its C is then
  the chunk size. Keys, w, beta and T have G heads: the H / G query heads of a group go in as one block of
  rows against their key head's chunks."""
  chex.assert_rank([query_BxLqxHxK, key_BxLkxGxK, w_BxGxKxLk, beta_BxGxLk], [4, 4, 4, 3])
  batch, length_q, heads, width = query_BxLqxHxK.shape
  length_k, groups = key_BxLkxGxK.shape[1], key_BxLkxGxK.shape[2]
  group_size = check_groups(heads, groups)
  if transform_BxGxCxLk is None:
    transform_BxGxCxLk = chunk_transform_columns(w_BxGxKxLk, beta_BxGxLk, min(chunk_size, length_k))
  chex.assert_axis_dimension(transform_BxGxCxLk, 3, length_k)
  chunk = transform_BxGxCxLk.shape[2]
  rows_BxGxNxK = jnp.transpose(query_BxLqxHxK, (0, 2, 1, 3)).astype(jnp.float32).reshape(
      batch, groups, group_size * length_q, width)
  row_index_BxN = jnp.tile(jnp.broadcast_to(query_index_BxLq, (batch, length_q)), (1, group_size))
  key_index_BxLk = jnp.broadcast_to(key_index_BxLk, (batch, length_k))

  # The last chunk is filled out with keys that no query reaches (their index above every query's), whose w
  # and T are 0; their logits are dropped.
  padding = -length_k % chunk
  pad_keys = [(0, 0), (0, 0), (0, padding), (0, 0)]
  key_BxGxLkxK = jnp.pad(jnp.transpose(key_BxLkxGxK, (0, 2, 1, 3)).astype(jnp.float32), pad_keys)
  w_BxGxLkxK = jnp.pad(jnp.transpose(w_BxGxKxLk, (0, 1, 3, 2)).astype(jnp.float32), pad_keys)
  transform_BxGxCxLk = jnp.pad(transform_BxGxCxLk.astype(jnp.float32), [(0, 0), (0, 0), (0, 0), (0, padding)])
  key_index_BxLk = jnp.pad(key_index_BxLk, [(0, 0), (0, padding)], constant_values=jnp.iinfo(key_index_BxLk.dtype).max)
  num_chunks = (length_k + padding) // chunk
  key_BxGxNxCxK, w_BxGxNxCxK = (x.reshape(batch, groups, num_chunks, chunk, -1) for x in (key_BxGxLkxK, w_BxGxLkxK))
  transform_BxGxNxCxC = jnp.moveaxis(transform_BxGxCxLk.reshape(batch, groups, chunk, num_chunks, chunk), 3, 2)
  later_CxC = jnp.arange(chunk)[None, :] > jnp.arange(chunk)[:, None]  # [s > j] at (j, s)
  along_key_BxGxNxCxC = jnp.einsum('bhnjk,bhnsk->bhnjs', key_BxGxNxCxK, w_BxGxNxCxK) * later_CxC
  chunks = tuple(jnp.moveaxis(x, 2, 0) for x in (key_BxGxNxCxK, w_BxGxNxCxK, transform_BxGxNxCxC, along_key_BxGxNxCxC))
  key_index_NxBxC = jnp.moveaxis(key_index_BxLk.reshape(batch, num_chunks, chunk), 1, 0)

  def step(carried_BxGxNxK, one_chunk):  # N: the group's query heads' rows, Lq of each
    key_BxGxCxK, w_BxGxCxK, transform_BxGxCxC, along_key_BxGxCxC, key_index_BxC = one_chunk
    reached_Bx1xNxC = key_index_BxC[:, None, None, :] <= row_index_BxN[:, None, :, None]
    along_query_BxGxNxC = jnp.einsum('bhqk,bhtk->bhqt', carried_BxGxNxK, w_BxGxCxK) * reached_Bx1xNxC
    weights_BxGxNxC = jnp.einsum('bhqt,bhst->bhqs', along_query_BxGxNxC, transform_BxGxCxC)
    logits_BxGxNxC = (jnp.einsum('bhqk,bhjk->bhqj', carried_BxGxNxK, key_BxGxCxK)
                      - jnp.einsum('bhqs,bhjs->bhqj', weights_BxGxNxC, along_key_BxGxCxC))
    carried_BxGxNxK = carried_BxGxNxK - jnp.einsum('bhqs,bhsk->bhqk', weights_BxGxNxC, w_BxGxCxK)
    return carried_BxGxNxK, logits_BxGxNxC

  _, logits_NxBxGxNxC = jax.lax.scan(step, rows_BxGxNxK, (*chunks, key_index_NxBxC), reverse=True)
  logits_BxGxNxLk = jnp.moveaxis(logits_NxBxGxNxC, 0, 3).reshape(*logits_NxBxGxNxC.shape[1:4], -1)
  return logits_BxGxNxLk[..., :length_k].reshape(batch, heads, length_q, length_k)


class PathLayer(LayerPositions):
  """Owns W_w (low rank) and the beta projection; the logits term replaces q.k by the reflected product."""

  @nn.compact
  def from_inputs(self, inputs_BxLqxD, shared, use_cache=False, cache_index=None):
    batch, length_q, width = inputs_BxLqxD.shape
    x = inputs_BxLqxD.astype(jnp.float32)
    down = parameter(self, 'w_down', nn.initializers.xavier_uniform(), (width, LOW_RANK))
    groups = self.key_value_heads
    up = parameter(self, 'w_up', nn.initializers.xavier_uniform(), (LOW_RANK, groups * self.head_dim))
    beta_kernel = parameter(self, 'beta_kernel', nn.initializers.xavier_uniform(), (width, groups))
    beta_bias = parameter(self, 'beta_bias', nn.initializers.zeros, (groups,))
    w_BxLqxGxK = ((x @ down) @ up).reshape(batch, length_q, groups, self.head_dim)
    w_BxLqxGxK = w_BxLqxGxK * jax.lax.rsqrt(jnp.sum(w_BxLqxGxK ** 2, axis=-1, keepdims=True) + 1e-12)
    beta_BxLqxG = 2.0 * jax.nn.sigmoid(x @ beta_kernel + beta_bias)
    query_index_BxLq = jnp.broadcast_to(jnp.arange(length_q)[None], (batch, length_q))
    if use_cache:  # the first call sees the whole capacity; later ones write their tokens at cache_index
      cached_w = self.variable('cache', 'reflection_w', lambda: w_BxLqxGxK)
      cached_beta = self.variable('cache', 'reflection_beta', lambda: beta_BxLqxG)
      if cache_index is not None:
        cached_w.value = jax.lax.dynamic_update_slice(cached_w.value, w_BxLqxGxK, (0, cache_index, 0, 0))
        cached_beta.value = jax.lax.dynamic_update_slice(cached_beta.value, beta_BxLqxG, (0, cache_index, 0))
        capacity = cached_w.value.shape[1]
        return self._keys_and_queries(cached_w.value, cached_beta.value, query_index_BxLq + cache_index,
                                      jnp.broadcast_to(jnp.arange(capacity)[None], (batch, capacity)))
    return self._keys_and_queries(w_BxLqxGxK, beta_BxLqxG, query_index_BxLq, query_index_BxLq)

  @staticmethod
  def _keys_and_queries(w_BxLkxGxK, beta_BxLkxG, query_index_BxLq, key_index_BxLk):
    """The shared terms, laid out so that blocks cut the queries' rows and the keys' columns: w B x G x K x 1 x Lk,
    beta B x G x 1 x Lk, the chunks' T once for all of a layer's query blocks (chunk_transform_columns) B x G x C
    x 1 x Lk, the indices B x 1 x Lq x 1 and B x 1 x 1 x Lk."""
    w_BxGxKxLk, beta_BxGxLk = jnp.transpose(w_BxLkxGxK, (0, 2, 3, 1)), jnp.transpose(beta_BxLkxG, (0, 2, 1))
    return dict(w=w_BxGxKxLk[:, :, :, None, :], beta=beta_BxGxLk[:, :, None, :],
                transform=chunk_transform_columns(w_BxGxKxLk, beta_BxGxLk, CHUNK_SIZE)[:, :, :, None, :],
                query_index=query_index_BxLq[:, None, :, None], key_index=key_index_BxLk[:, None, None, :])

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    reflected_BxHxLqxLk = reflected_logits(
        query_BxLqxHxK, key_BxLkxHxK, shared['w'][:, :, :, 0, :], shared['beta'][:, :, 0, :],
        shared['query_index'][:, 0, :, 0], shared['key_index'][:, 0, 0, :],
        transform_BxGxCxLk=shared['transform'][:, :, :, 0, :])
    plain_BxHxLqxLk = grouped_logits_heads_last(query_BxLqxHxK, key_BxLkxHxK)
    return scale * (reflected_BxHxLqxLk - plain_BxHxLqxLk)

  def needs_all_keys(self):
    return True


VARIANT = Variant(StackPositions, PathLayer, 'Yang et al. 2025 (PaTH attention)', shift_invariant=True, causal_only=True,
                  rolling_cache=False)
