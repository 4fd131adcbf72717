"""Scalable softmax, SSMax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention"), a setting of
every variant (`model.position.ssmax`).

  SSMax(z)_j = n^(s z_j) / sum_k n^(s z_k) = softmax((s log n) z)_j,

with n the number of keys the query sees, so the largest weight does not fade as n grows. As the paper
applies it, the query is multiplied by s_h log n_i (s_h learned per head and layer) after the variant's
rotation: the content logits q_i . k_j (and any term the variant computes from the query) scale, an
additive bias that does not read the query (ALiBi's, T5's) does not, and every attention core serves
it unchanged, fused kernels included. n_i is counted from the attention mask: i + 1 under the causal
mask, the keys of the query's own document in packed rows, the real keys with padding; a query that
sees no key gets log 1 = 0.
"""

from typing import Optional

import chex
import jax.numpy as jnp


def keys_seen(mask: Optional[chex.Array], batch: int, length_q: int, length_k: int) -> chex.Array:
  """n_i, the keys each query may attend to, from a mask broadcastable to B x H x Lq x Lk (None: every
  key): B x Lq x H' (H' = 1 unless the mask differs by head), float32."""
  if mask is None:
    return jnp.full((batch, length_q, 1), float(length_k), jnp.float32)
  mask = jnp.asarray(mask)
  counts_BxHxLq = jnp.sum(jnp.broadcast_to(mask, (batch, mask.shape[1], length_q, length_k)), axis=-1,
                          dtype=jnp.float32)
  return jnp.transpose(counts_BxHxLq, (0, 2, 1))


def scalable_query(query_BxLqxHxK: chex.Array, scale_H: chex.Array, keys_seen_BxLqxH: chex.Array) -> chex.Array:
  """q_i s_h log n_i (n_i at least 1), in the query's dtype."""
  chex.assert_rank([query_BxLqxHxK, scale_H, keys_seen_BxLqxH], [4, 1, 3])
  factor_BxLqxH = scale_H * jnp.log(jnp.maximum(keys_seen_BxLqxH, 1.0))
  return (query_BxLqxHxK.astype(jnp.float32) * factor_BxLqxH[..., None]).astype(query_BxLqxHxK.dtype)
