"""Attention masks. Convention: True means "may attend"; shapes broadcast to B x H x Lq x Lk."""

from typing import Optional

import chex
import jax.numpy as jnp


def causal_mask(length: int) -> chex.Array:
  """M_ij = (j <= i): position i sees itself and the past, never the future. 1 x 1 x L x L."""
  return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None, None]


def padding_mask(valid_BxL: chex.Array) -> chex.Array:
  """Key-side mask from a B x L validity array (True/1 = real token). B x 1 x 1 x L."""
  chex.assert_rank(valid_BxL, 2)
  return valid_BxL.astype(jnp.bool_)[:, None, None, :]


def self_attention_mask(valid_BxL: Optional[chex.Array], length: int, causal: bool) -> Optional[chex.Array]:
  """Padding of the keys, combined with the causal mask for decoders. None when nothing is masked.

  Queries at padded positions still see the real keys (their outputs are ignored by the loss);
  masking the query side too would only produce rows of zeros.
  """
  mask = causal_mask(length) if causal else None
  if valid_BxL is not None:
    chex.assert_axis_dimension(valid_BxL, 1, length)
    keys = padding_mask(valid_BxL)
    mask = keys if mask is None else jnp.logical_and(mask, keys)
  return mask


def segment_mask(segments_BxL: chex.Array) -> chex.Array:
  """M_ij = (segment_i == segment_j): a row packed with several documents attends within each. B x 1 x L x L."""
  chex.assert_rank(segments_BxL, 2)
  return (segments_BxL[:, :, None] == segments_BxL[:, None, :])[:, None]


def cross_attention_mask(source_valid_BxLs: Optional[chex.Array]) -> Optional[chex.Array]:
  """Decoder queries attend every real source token: the source's padding mask, B x 1 x 1 x Ls."""
  return None if source_valid_BxLs is None else padding_mask(source_valid_BxLs)


def window_mask(q_positions_BxLq: chex.Array, k_positions_BxLk: chex.Array, *, window: int = 0, chunk: int = 0,
                causal: bool = True) -> chex.Array:
  """Which keys a local layer's queries see, by position. B x 1 x Lq x Lk.

  window W > 0 (a sliding window, Beltagy et al. 2020; Mistral, Gemma): query i sees key j when i - W < j, so with
  the causal mask a query sees itself and the W - 1 keys before it (Hugging Face's convention; some
  implementations count W + 1); bidirectional (an encoder), |i - j| < W: W - 1 on each side.
  chunk C > 0 (Llama 4's chunked attention): query i sees key j when floor(i / C) = floor(j / C), its own chunk.
  """
  chex.assert_rank([q_positions_BxLq, k_positions_BxLk], 2)
  query_BxLqx1, key_Bx1xLk = q_positions_BxLq[:, :, None], k_positions_BxLk[:, None, :]
  allowed = jnp.ones(jnp.broadcast_shapes(query_BxLqx1.shape, key_Bx1xLk.shape), jnp.bool_)
  if window:
    distance = query_BxLqx1 - key_Bx1xLk
    allowed = distance < window if causal else jnp.abs(distance) < window
  if chunk:
    allowed = jnp.logical_and(allowed, query_BxLqx1 // chunk == key_Bx1xLk // chunk)
  return allowed[:, None]
