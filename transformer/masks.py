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
