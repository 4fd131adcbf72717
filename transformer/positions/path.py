"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda and Kim, 2025, "PaTH Attention: Position
Encoding via Accumulating Householder Transformations"), in every self-attention layer of a causal model.

Between a key and a query the positions are the data-dependent reflections of the tokens after the key,

  e_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(d),   H_s = I - beta_s w_s w_s^T,

per head, w_s = the unit vector of W_w x_s (W_w of rank 32, as flash-linear-attention's layer has it) and
beta_s = 2 sigmoid(u . x_s + b) in (0, 2) (so H_s may flip a direction), from the layer's input x_s. A
direct product costs O(L^2 d^2) per head (L^2 matrices); here the query is carried backwards over the
keys instead, v <- H_s v before the key at s - 1 is read, which costs O(L^2 d): for key column j (token
s), the logit is v_i . k_s with v_i = H_{s+1} ... H_i q_i, one d-vector per query at a time; the backward
pass keeps the carried queries at the edges of chunks of sqrt(L) keys and recomputes inside them. The
logits hook adds e_ij - q_i . k_j / sqrt(d) to the plain logits. Causal only; each query block of
blockwise attention takes its keys in one block (the reflections run over all of them).

from_inputs computes w and beta per token, with the tokens' indices in the row (not their positions);
incremental decoding keeps them in the cache (the keys' reflections are read again at every step). In a
row that packs several documents, the reflections between a key and a query are those of their own
document.
"""

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.positions.base import LayerPositions, StackPositions, Variant

LOW_RANK = 32  # W_w = W_up W_down through this width, as flash-linear-attention's PaTH layer


def reflected_logits(query_BxLqxHxK: chex.Array, key_BxLkxHxK: chex.Array, w_BxHxKxLk: chex.Array,
                     beta_BxHxLk: chex.Array, query_index_BxLq: chex.Array, key_index_BxLk: chex.Array) -> chex.Array:
  """q_i^T H_i ... H_{j+1} k_j for every query i and key j (unscaled): B x H x Lq x Lk. The keys are
  consecutive tokens, the last at or after every query's; key j's own reflection H_j (w, beta at column j)
  applies to the queries at index >= the key's once its logit is read. Later keys' logits (j > i) are
  computed but meaningless: the causal mask removes them."""
  chex.assert_rank([query_BxLqxHxK, key_BxLkxHxK, w_BxHxKxLk, beta_BxHxLk], [4, 4, 4, 3])
  query_BxHxLqxK = jnp.transpose(query_BxLqxHxK, (0, 2, 1, 3)).astype(jnp.float32)
  key_LkxBxHxK = jnp.transpose(key_BxLkxHxK, (1, 0, 2, 3)).astype(jnp.float32)
  w_LkxBxHxK = jnp.transpose(w_BxHxKxLk, (3, 0, 1, 2)).astype(jnp.float32)
  beta_LkxBxH = jnp.transpose(beta_BxHxLk, (2, 0, 1)).astype(jnp.float32)
  index_LkxB = jnp.transpose(jnp.broadcast_to(key_index_BxLk, (query_BxLqxHxK.shape[0], key_BxLkxHxK.shape[1])))
  query_index_Bx1xLq = query_index_BxLq[:, None, :]

  def step(carried_BxHxLqxK, column):
    key_BxHxK, w_BxHxK, beta_BxH, index_B = column
    logits_BxHxLq = jnp.einsum('bhqk,bhk->bhq', carried_BxHxLqxK, key_BxHxK)
    along_w_BxHxLq = jnp.einsum('bhqk,bhk->bhq', carried_BxHxLqxK, w_BxHxK)
    reflected = carried_BxHxLqxK - (beta_BxH[:, :, None] * along_w_BxHxLq)[..., None] * w_BxHxK[:, :, None, :]
    applies_Bx1xLq = query_index_Bx1xLq >= index_B[:, None, None]
    return jnp.where(applies_Bx1xLq[..., None], reflected, carried_BxHxLqxK), logits_BxHxLq

  # Chunks of about sqrt(Lk) keys, each recomputed in the backward pass: the pass keeps the carried queries
  # at the chunks' edges and inside one chunk at a time (2 sqrt(Lk) copies instead of Lk). Padding keys
  # at the front reflect nothing (beta 0) and their logits are dropped.
  length_k = key_BxLkxHxK.shape[1]
  chunk = max(1, math.isqrt(length_k - 1) + 1)
  padding = -length_k % chunk
  columns = tuple(jnp.pad(x, [(padding, 0)] + [(0, 0)] * (x.ndim - 1), constant_values=-1 if x is index_LkxB else 0)
                  for x in (key_LkxBxHxK, w_LkxBxHxK, beta_LkxBxH, index_LkxB))
  columns = tuple(x.reshape(-1, chunk, *x.shape[1:]) for x in columns)

  @jax.checkpoint
  def one_chunk(carried_BxHxLqxK, chunk_columns):
    return jax.lax.scan(step, carried_BxHxLqxK, chunk_columns, reverse=True)

  _, logits_NxCxBxHxLq = jax.lax.scan(one_chunk, query_BxHxLqxK, columns, reverse=True)
  logits_LkxBxHxLq = logits_NxCxBxHxLq.reshape(-1, *logits_NxCxBxHxLq.shape[2:])[padding:]
  return jnp.transpose(logits_LkxBxHxLq, (1, 2, 3, 0))


class PathLayer(LayerPositions):
  """Owns W_w (low rank) and the beta projection; the logits term replaces q.k by the reflected product."""

  @nn.compact
  def from_inputs(self, inputs_BxLqxD, shared, use_cache=False, cache_index=None):
    batch, length_q, width = inputs_BxLqxD.shape
    x = inputs_BxLqxD.astype(jnp.float32)
    down = self.param('w_down', nn.initializers.xavier_uniform(), (width, LOW_RANK))
    up = self.param('w_up', nn.initializers.xavier_uniform(), (LOW_RANK, self.num_heads * self.head_dim))
    beta_kernel = self.param('beta_kernel', nn.initializers.xavier_uniform(), (width, self.num_heads))
    beta_bias = self.param('beta_bias', nn.initializers.zeros, (self.num_heads,))
    w_BxLqxHxK = ((x @ down) @ up).reshape(batch, length_q, self.num_heads, self.head_dim)
    w_BxLqxHxK = w_BxLqxHxK * jax.lax.rsqrt(jnp.sum(w_BxLqxHxK ** 2, axis=-1, keepdims=True) + 1e-12)
    beta_BxLqxH = 2.0 * jax.nn.sigmoid(x @ beta_kernel + beta_bias)
    query_index_BxLq = jnp.broadcast_to(jnp.arange(length_q)[None], (batch, length_q))
    if use_cache:  # the first call sees the whole capacity; later ones write their tokens at cache_index
      cached_w = self.variable('cache', 'reflection_w', lambda: w_BxLqxHxK)
      cached_beta = self.variable('cache', 'reflection_beta', lambda: beta_BxLqxH)
      if cache_index is not None:
        cached_w.value = jax.lax.dynamic_update_slice(cached_w.value, w_BxLqxHxK, (0, cache_index, 0, 0))
        cached_beta.value = jax.lax.dynamic_update_slice(cached_beta.value, beta_BxLqxH, (0, cache_index, 0))
        capacity = cached_w.value.shape[1]
        return self._keys_and_queries(cached_w.value, cached_beta.value, query_index_BxLq + cache_index,
                                      jnp.broadcast_to(jnp.arange(capacity)[None], (batch, capacity)))
    return self._keys_and_queries(w_BxLqxHxK, beta_BxLqxH, query_index_BxLq, query_index_BxLq)

  @staticmethod
  def _keys_and_queries(w_BxLkxHxK, beta_BxLkxH, query_index_BxLq, key_index_BxLk):
    """The shared terms, laid out so that blocks cut the queries' rows and the keys' columns: w B x H x K x 1 x Lk,
    beta B x H x 1 x Lk, the indices B x 1 x Lq x 1 and B x 1 x 1 x Lk."""
    return dict(w=jnp.transpose(w_BxLkxHxK, (0, 2, 3, 1))[:, :, :, None, :],
                beta=jnp.transpose(beta_BxLkxH, (0, 2, 1))[:, :, None, :],
                query_index=query_index_BxLq[:, None, :, None], key_index=key_index_BxLk[:, None, None, :])

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    reflected_BxHxLqxLk = reflected_logits(
        query_BxLqxHxK, key_BxLkxHxK, shared['w'][:, :, :, 0, :], shared['beta'][:, :, 0, :],
        shared['query_index'][:, 0, :, 0], shared['key_index'][:, 0, 0, :])
    plain_BxHxLqxLk = jnp.einsum('bqhk,bshk->bhqs', query_BxLqxHxK.astype(jnp.float32),
                                 key_BxLkxHxK.astype(jnp.float32))
    return scale * (reflected_BxHxLqxLk - plain_BxHxLqxLk)

  def needs_all_keys(self):
    return True


VARIANT = Variant(StackPositions, PathLayer, 'Yang et al. 2025 (PaTH attention)', shift_invariant=True, causal_only=True)
