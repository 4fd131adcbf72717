"""CoPE, contextual position encoding (Golovneva, Wang, Weston and Sukhbaatar 2024, "Contextual Position
Encoding: Learning to Count What's Important"), in every self-attention layer of a causal model.

Positions are counted by the content: each key a query sees opens a gate, and a key's position is the
number of open gates between it and the query,

  g_ij = sigmoid(q_i . k_j / sqrt(d))  (0 for masked keys),   p_ij = min(sum_{t=j}^{i} g_it, P - 1),
  e_ij += z_i[floor p_ij] (1 - w) + z_i[ceil p_ij] w,  w = p_ij - floor p_ij,  z_i[p] = q_i . e[p],

with P = max_positions learned vectors e[p] of the head width, shared by the heads and initialised
to zero, as the authors' code has them; the term is not scaled (their code adds q.e[p] to the already
scaled logits). Causal only: the sums run over the past. The gates need q.k, which the hook computes
from the keys it is given (a second QK^T); the sums run over every key a query sees at once, so
blockwise attention gives each query block all its keys in one block (needs_all_keys), never in key
blocks. Masked keys are those after the query's position (the causal rule, read from the positions),
which also hides a cache's unwritten slots and right padding from every valid query. In rows that pack
several documents, whose positions restart, the stack hands the layers the self-attention mask instead
(`masked`), so a gate opens only for a key of the query's own document: each document counts alone.
"""

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.attention import grouped_logits_heads_last
from transformer.layers import parameter
from transformer.positions.base import LayerPositions, Settings, StackPositions, Variant, require


@dataclasses.dataclass(frozen=True)
class CopeSettings(Settings):
  max_positions: int = 64  # P: contextual positions are clamped to P - 1

  def check(self):
    require(self.max_positions >= 1, 'position.max_positions', self.max_positions, 'a positive integer')


def contextual_positions(query_BxLqxHxK, key_BxLkxGxK, allowed_BxLqxLk, scale: float, max_positions: int):
  """p_ij = min(sum over the allowed keys t >= j of sigmoid(q_i . k_t * scale), P - 1): B x H x Lq x Lk (query
  head h with key head h // (H / G))."""
  content_BxHxLqxLk = grouped_logits_heads_last(query_BxLqxHxK, key_BxLkxGxK) * scale
  gates = jnp.where(allowed_BxLqxLk[:, None], jax.nn.sigmoid(content_BxHxLqxLk), 0.0)
  from_key_to_end = jnp.flip(jnp.cumsum(jnp.flip(gates, axis=-1), axis=-1), axis=-1)
  return jnp.minimum(from_key_to_end, max_positions - 1)


def interpolated_term(query_BxLqxHxK, embeddings_KxR, positions_BxHxLqxLk) -> chex.Array:
  """z_i[p] = q_i . e[p] at the integers either side of p, mixed linearly: B x H x Lq x Lk."""
  per_integer_BxHxLqxR = jnp.einsum('bqhk,kp->bhqp', query_BxLqxHxK.astype(jnp.float32), embeddings_KxR)
  floor = jnp.floor(positions_BxHxLqxLk)
  weight = positions_BxHxLqxLk - floor
  below = jnp.take_along_axis(per_integer_BxHxLqxR, floor.astype(jnp.int32), axis=-1)
  above = jnp.take_along_axis(per_integer_BxHxLqxR, jnp.ceil(positions_BxHxLqxLk).astype(jnp.int32), axis=-1)
  return below * (1.0 - weight) + above * weight


class CopeStack(StackPositions):
  """No shared terms, but in packed rows the mask that chooses the gates."""

  def masked(self, shared, mask_Bx1xLqxLk):
    del shared
    return {'allowed_Bx1xLqxLk': mask_Bx1xLqxLk}


class Cope(LayerPositions):
  """Owns the P position vectors of its layer and adds the interpolated q.e[p]."""

  def setup(self):
    self.embeddings = parameter(self, 'position_embeddings', nn.initializers.zeros,
                                (self.head_dim, self.settings.max_positions))

  def needs_all_keys(self):
    return True

  def logits(self, query_BxLqxHxK, key_BxLkxHxK, q_positions_BxLq, k_positions_BxLk, shared, scale):
    if shared is None:
      allowed_BxLqxLk = k_positions_BxLk[:, None, :] <= q_positions_BxLq[:, :, None]
    else:
      allowed_BxLqxLk = shared['allowed_Bx1xLqxLk'][:, 0]
    positions = contextual_positions(query_BxLqxHxK, key_BxLkxHxK, allowed_BxLqxLk, scale, self.settings.max_positions)
    return interpolated_term(query_BxLqxHxK, self.embeddings, positions)


VARIANT = Variant(CopeStack, Cope, 'Golovneva et al. 2024 (CoPE)', CopeSettings, shift_invariant=True,
                  causal_only=True)
