"""Llama 4's attention temperature tuning (Meta 2025), a setting of every variant (`model.position.temperature_scale`,
`temperature_floor`): the query at position p is multiplied by

  t(p) = 1 + scale ln(floor((p + 1) / floor) + 1),

which is 1 up to position floor - 2 and grows slowly after, sharpening attention that a context longer than
trained would spread (Llama 4's NoPE global layers: scale 0.1, floor 8192). With it on, the logits depend on the
query's absolute position.
"""

import chex
import jax.numpy as jnp


def query_temperature(positions_BxL: chex.Array, scale: float, floor: int) -> chex.Array:
  """t(p) for every query position: B x L, float32."""
  steps_BxL = jnp.floor((jnp.asarray(positions_BxL).astype(jnp.float32) + 1.0) / floor)
  return 1.0 + scale * jnp.log(steps_BxL + 1.0)


def tempered_query(query_BxLqxHxK: chex.Array, positions_BxLq: chex.Array, scale: float, floor: int) -> chex.Array:
  """q_i t(p_i), in the query's dtype."""
  chex.assert_rank([query_BxLqxHxK, positions_BxLq], [4, 2])
  temperature_BxLqx1x1 = query_temperature(positions_BxLq, scale, floor)[:, :, None, None]
  return (query_BxLqxHxK.astype(jnp.float32) * temperature_BxLqx1x1).astype(query_BxLqxHxK.dtype)
