"""Flash attention in Pallas with the position term computed inside the kernel.

  out_i = sum_j softmax_j(q_i . k_j * scale + t_h(p_i, p_j)) v_j

over the keys j that query i may see (the causal mask j <= i + Lk - Lq, the keys' padding, and in rows that
pack several documents the keys of i's own document), computed
block by block: bq queries at a time, looping over blocks of bk keys with an online softmax
(FlashAttention, Dao et al. 2022), so neither the weights nor the position term ever exists at
B x H x Lq x Lk. The term t_h is a KernelTerm: a function of one head's few parameters and the
positions of the block's queries and keys, evaluated inside the kernel (the idea of PyTorch's
FlexAttention score_mod); it may also read one number per (batch, head, token) of the queries and of
the keys (FoX's cumulative log forget gates c_i and c_j), differentiably. With grouped-query attention
(G key and value heads for H query heads) query head h reads key and value head h // (H / G) through the
blocks' index maps, never a repeated copy; the key and value gradients are formed per query head and summed
over each group. Gradients are FlashAttention-2's (Dao 2023): the forward pass keeps each row's log-sum-exp; one kernel per key block accumulates dK, dV and the term's parameter gradient
(the vjp of the term on each block, traced inside the kernel) and the keys' data gradient, one per query
block accumulates dQ and the queries' data gradient.

platform: 'interpret' runs the kernels in Pallas' interpreter (any backend, what the tests use);
'gpu' compiles them with Triton, 'tpu' with Mosaic.
"""

import dataclasses
import functools
import math
from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from transformer.attention import check_groups

PLATFORMS = ('interpret', 'gpu', 'tpu')
MASKED = -1e30  # a finite logit for masked keys: the running maximum stays finite, so no inf - inf


@dataclasses.dataclass(frozen=True)
class KernelTerm:
  """A logits term t_h(p_i, p_j) that a kernel can compute from positions and a few numbers per head.

  function(parameters, q_positions_bqx1, k_positions_1xbk) -> bq x bk float32, where parameters is a
  list of A arrays of shape 1 x 1 (head h's row of parameters_HxA) and positions are float32. It must
  use elementwise jax.numpy only, so that it lowers inside a kernel, and be differentiable in the
  parameters. With q_data_BxHxLq and k_data_BxHxLk (both or neither), it takes two more arguments, the
  block's q_data_bqx1 and k_data_1xbk, and must be differentiable in them too."""
  function: Callable
  parameters_HxA: chex.Array
  q_data_BxHxLq: Optional[chex.Array] = None  # a number per query the term reads (FoX's c_i)
  k_data_BxHxLk: Optional[chex.Array] = None  # a number per key the term reads (FoX's c_j)


def _next_power_of_two(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _pad_to(x, axis: int, length: int):
  """x with zeros appended along axis up to length."""
  padding = [(0, 0)] * x.ndim
  padding[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, padding)


def _dot(a, b, contract_a: int, contract_b: int):
  """a . b contracted over one axis each, accumulated in float32."""
  return jax.lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class _Static:
  """What the kernels are specialised on."""
  block_q: int
  block_k: int
  causal: bool
  causal_offset: int           # Lk - Lq: query i sees keys j <= i + offset under the causal mask
  scale: float
  function: Optional[Callable]
  num_parameters: int
  platform: str
  uses_data: bool = False      # the term reads the queries' and keys' data
  group: int = 1               # query heads per key and value head (H / G)
  window: int = 0              # causal: query i sees keys j > i + offset - window (a sliding window); 0: all
  chunk: int = 0               # causal: query i sees keys of its chunk, (i + offset) // chunk = j // chunk; 0: all
  softcap: float = 0.0         # logits capped to c tanh(x / c); 0: none
  sinks: bool = False          # the parameters' last column is each head's sink logit


def _parameters(params_ref, static: _Static):
  return [params_ref[:, pl.ds(index, 1)] for index in range(static.num_parameters)]


def _term(static: _Static, parameters, q_positions_bqx1, k_positions_1xbk, q_data_bqx1, k_data_1xbk):
  """The term on one block, bq x bk."""
  if static.uses_data:
    return static.function(parameters, q_positions_bqx1, k_positions_1xbk, q_data_bqx1, k_data_1xbk)
  return static.function(parameters, q_positions_bqx1, k_positions_1xbk)


def _logits(static: _Static, parameters, q_block, k_block, q_positions_bqx1, k_positions_1xbk, q_segments_bqx1,
            k_segments_1xbk, q_index_bqx1, k_index_1xbk, q_data_bqx1, k_data_1xbk):
  """Scaled logits with the term, the mask of the keys each query may see (its own document's real keys:
  a padding key's segment is -1), both bq x bk."""
  logits = _dot(q_block, k_block, 1, 1) * static.scale
  if static.function is not None:
    logits = logits + _term(static, parameters, q_positions_bqx1, k_positions_1xbk, q_data_bqx1, k_data_1xbk)
  if static.softcap:
    logits = static.softcap * jnp.tanh(logits / static.softcap)
  allowed = k_segments_1xbk == q_segments_bqx1
  if static.causal:
    last_index_bqx1 = q_index_bqx1 + static.causal_offset
    allowed = jnp.logical_and(allowed, k_index_1xbk <= last_index_bqx1)
    if static.window:
      allowed = jnp.logical_and(allowed, last_index_bqx1 - k_index_1xbk < static.window)
    if static.chunk:
      allowed = jnp.logical_and(allowed, jax.lax.div(last_index_bqx1, static.chunk)
                                == jax.lax.div(k_index_1xbk, static.chunk))
  return jnp.where(allowed, logits, MASKED), allowed


def _key_blocks_seen(static: _Static, query_block, num_key_blocks: int):
  """How many key blocks, from the first, a query block sees (all of them, or up to the causal edge)."""
  if not static.causal:
    return num_key_blocks
  keys_seen = jnp.maximum((query_block + 1) * static.block_q + static.causal_offset, 0)  # of the last query
  return jnp.minimum(jax.lax.div(keys_seen + static.block_k - 1, static.block_k), num_key_blocks)


def _first_key_block_seen(static: _Static, query_block):
  """The first key block a query block sees: 0, or the block of its first query's window or chunk start."""
  first_query = query_block * static.block_q + static.causal_offset
  if static.window:
    return jax.lax.div(jnp.maximum(first_query - static.window + 1, 0), static.block_k)
  if static.chunk:
    return jax.lax.div(jax.lax.div(jnp.maximum(first_query, 0), static.chunk) * static.chunk, static.block_k)
  return 0


def _first_query_block_seeing(static: _Static, key_block):
  if not static.causal:
    return 0
  first_query = jnp.maximum(key_block * static.block_k - static.causal_offset, 0)
  return jax.lax.div(first_query, static.block_q)


def _query_blocks_seeing(static: _Static, key_block, num_query_blocks: int):
  """One past the last query block that sees a key block: all of them, or up to its last key's window or chunk."""
  last_key = key_block * static.block_k + static.block_k - 1
  if static.window:
    last_query = last_key + static.window - 1 - static.causal_offset
  elif static.chunk:
    last_query = (jax.lax.div(last_key, static.chunk) + 1) * static.chunk - 1 - static.causal_offset
  else:
    return num_query_blocks
  return jnp.clip(jax.lax.div(jnp.maximum(last_query, 0), static.block_q) + 1, 0, num_query_blocks)


def _forward_kernel(static: _Static, q_ref, k_ref, v_ref, q_positions_ref, q_segments_ref, k_positions_ref,
                    k_segments_ref, params_ref, q_data_ref, k_data_ref, out_ref, logsumexp_ref):
  block_q, block_k = static.block_q, static.block_k
  query_block = pl.program_id(2)
  num_key_blocks = k_ref.shape[0] // block_k
  q_block = q_ref[...]
  q_positions, q_segments, q_data = q_positions_ref[...], q_segments_ref[...], q_data_ref[...]
  q_index = query_block * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
  parameters = _parameters(params_ref, static)

  def step(key_block, carry):
    running_max, normaliser, accumulated = carry
    keys = pl.ds(key_block * block_k, block_k)
    k_index = key_block * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
    logits, allowed = _logits(static, parameters, q_block, k_ref[keys, :], q_positions, k_positions_ref[:, keys],
                              q_segments, k_segments_ref[:, keys], q_index, k_index, q_data, k_data_ref[:, keys])
    new_max = jnp.maximum(running_max, jnp.max(logits, axis=1, keepdims=True))
    weights = jnp.where(allowed, jnp.exp(logits - new_max), 0.0)
    correction = jnp.exp(running_max - new_max)
    normaliser = correction * normaliser + jnp.sum(weights, axis=1, keepdims=True)
    values = v_ref[keys, :]
    accumulated = correction * accumulated + _dot(weights.astype(values.dtype), values, 1, 0)
    return new_max, normaliser, accumulated

  start = (jnp.full((block_q, 1), MASKED, jnp.float32), jnp.zeros((block_q, 1), jnp.float32),
           jnp.zeros((block_q, v_ref.shape[1]), jnp.float32))
  if static.sinks:  # the sink's logit in every denominator from the start: m = s, l = 1
    sink = params_ref[:, pl.ds(static.num_parameters, 1)]
    start = (jnp.broadcast_to(sink, (block_q, 1)), jnp.ones((block_q, 1), jnp.float32), start[2])
  running_max, normaliser, accumulated = jax.lax.fori_loop(
      _first_key_block_seen(static, query_block), _key_blocks_seen(static, query_block, num_key_blocks), step, start)
  seen = normaliser > 0  # a row that sees no key gives zeros, as the explicit softmax does
  out_ref[...] = (accumulated / jnp.where(seen, normaliser, 1.0)).astype(out_ref.dtype)
  logsumexp_ref[...] = jnp.where(seen, running_max + jnp.log(jnp.where(seen, normaliser, 1.0)), 0.0)


def _term_vjp(static: _Static, parameters, q_positions, k_positions, q_data, k_data, d_logits):
  """The vjp of the term on this block: (parameter gradients, the queries' data gradient bq x 1, the keys'
  1 x bk)."""
  _, vjp = jax.vjp(lambda p, qd, kd: _term(static, p, q_positions, k_positions, qd, kd), parameters, q_data, k_data)
  return vjp(d_logits)


def _block_gradients(static: _Static, parameters, q_block, k_block, v_block, d_out_block, logsumexp, delta,
                     q_positions, k_positions, q_segments, k_segments, q_index, k_index, q_data, k_data):
  """The weights P and the logits' gradient dS = P (dO V^T - delta) of one query block against one key block."""
  logits, allowed = _logits(static, parameters, q_block, k_block, q_positions, k_positions, q_segments, k_segments,
                            q_index, k_index, q_data, k_data)
  weights = jnp.where(allowed, jnp.exp(logits - logsumexp), 0.0)
  d_weights = _dot(d_out_block, v_block, 1, 1)
  d_logits = weights * (d_weights - delta)
  if static.softcap:  # through the cap: d tanh = 1 - tanh^2, the capped logits being c tanh
    d_logits = d_logits * jnp.where(allowed, 1.0 - jnp.square(logits / static.softcap), 0.0)
  return weights, d_logits


def _key_values_kernel(static: _Static, q_ref, k_ref, v_ref, d_out_ref, logsumexp_ref, delta_ref, q_positions_ref,
                       q_segments_ref, k_positions_ref, k_segments_ref, params_ref, q_data_ref, k_data_ref, d_k_ref,
                       d_v_ref, d_params_ref, d_k_data_ref):
  """dK, dV, the term's parameter gradient and the keys' data gradient for one block of keys, over the query
  blocks that see it."""
  block_q, block_k = static.block_q, static.block_k
  key_block = pl.program_id(2)
  num_query_blocks = q_ref.shape[0] // block_q
  k_block, v_block = k_ref[...], v_ref[...]
  k_positions, k_segments, k_data = k_positions_ref[...], k_segments_ref[...], k_data_ref[...]
  k_index = key_block * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
  parameters = _parameters(params_ref, static)

  def step(query_block, carry):
    d_k, d_v, gradients, d_k_data = carry
    queries = pl.ds(query_block * block_q, block_q)
    q_block, d_out_block = q_ref[queries, :], d_out_ref[queries, :]
    q_positions, q_data = q_positions_ref[queries, :], q_data_ref[queries, :]
    q_index = query_block * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
    weights, d_logits = _block_gradients(static, parameters, q_block, k_block, v_block, d_out_block,
                                         logsumexp_ref[queries, :], delta_ref[queries, :], q_positions, k_positions,
                                         q_segments_ref[queries, :], k_segments, q_index, k_index, q_data, k_data)
    d_v = d_v + _dot(weights.astype(d_out_block.dtype), d_out_block, 0, 0)
    d_k = d_k + _dot(d_logits.astype(q_block.dtype), q_block, 0, 0) * static.scale
    if static.function is not None:
      d_parameters, _, d_data = _term_vjp(static, parameters, q_positions, k_positions, q_data, k_data, d_logits)
      gradients = [total + part for total, part in zip(gradients, d_parameters)]
      d_k_data = d_k_data + d_data
    return d_k, d_v, gradients, d_k_data

  start = (jnp.zeros(k_block.shape, jnp.float32), jnp.zeros(v_block.shape, jnp.float32),
           [jnp.zeros((1, 1), jnp.float32) for _ in range(static.num_parameters)], jnp.zeros((1, block_k), jnp.float32))
  d_k, d_v, gradients, d_k_data = jax.lax.fori_loop(_first_query_block_seeing(static, key_block),
                                                    _query_blocks_seeing(static, key_block, num_query_blocks),
                                                    step, start)
  d_k_ref[...] = d_k.astype(d_k_ref.dtype)
  d_v_ref[...] = d_v.astype(d_v_ref.dtype)
  for index, gradient in enumerate(gradients):
    d_params_ref[:, pl.ds(index, 1)] = gradient
  d_k_data_ref[...] = d_k_data


def _query_kernel(static: _Static, q_ref, k_ref, v_ref, d_out_ref, logsumexp_ref, delta_ref, q_positions_ref,
                  q_segments_ref, k_positions_ref, k_segments_ref, params_ref, q_data_ref, k_data_ref, d_q_ref,
                  d_q_data_ref):
  """dQ and the queries' data gradient for one block of queries, over the key blocks it sees."""
  block_q, block_k = static.block_q, static.block_k
  query_block = pl.program_id(2)
  num_key_blocks = k_ref.shape[0] // block_k
  q_block, d_out_block = q_ref[...], d_out_ref[...]
  logsumexp, delta, q_positions = logsumexp_ref[...], delta_ref[...], q_positions_ref[...]
  q_segments, q_data = q_segments_ref[...], q_data_ref[...]
  q_index = query_block * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
  parameters = _parameters(params_ref, static)

  def step(key_block, carry):
    d_q, d_q_data = carry
    keys = pl.ds(key_block * block_k, block_k)
    k_block, k_positions, k_data = k_ref[keys, :], k_positions_ref[:, keys], k_data_ref[:, keys]
    k_index = key_block * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
    _, d_logits = _block_gradients(static, parameters, q_block, k_block, v_ref[keys, :], d_out_block, logsumexp,
                                   delta, q_positions, k_positions, q_segments, k_segments_ref[:, keys], q_index,
                                   k_index, q_data, k_data)
    if static.uses_data:
      d_q_data = d_q_data + _term_vjp(static, parameters, q_positions, k_positions, q_data, k_data, d_logits)[1]
    return d_q + _dot(d_logits.astype(k_block.dtype), k_block, 1, 0) * static.scale, d_q_data

  d_q, d_q_data = jax.lax.fori_loop(_first_key_block_seen(static, query_block),
                                    _key_blocks_seen(static, query_block, num_key_blocks), step,
                                    (jnp.zeros(q_block.shape, jnp.float32), jnp.zeros((block_q, 1), jnp.float32)))
  d_q_ref[...] = d_q.astype(d_q_ref.dtype)
  d_q_data_ref[...] = d_q_data


def _compiler_params(platform: str, semantics: tuple):
  """Triton's or Mosaic's parameters (their class names before JAX 0.6 as the fallback)."""
  if platform == 'gpu':
    from jax.experimental.pallas import triton as pallas_triton  # pylint: disable=g-import-not-at-top
    params = getattr(pallas_triton, 'CompilerParams', None) or pallas_triton.TritonCompilerParams
    return params(num_warps=4, num_stages=2)
  if platform == 'tpu':
    from jax.experimental.pallas import tpu as pallas_tpu  # pylint: disable=g-import-not-at-top
    params = getattr(pallas_tpu, 'CompilerParams', None) or pallas_tpu.TPUCompilerParams
    return params(dimension_semantics=semantics)
  return None


def _call(kernel, static: _Static, grid, in_specs, out_specs, out_shape):
  """The kernel over a grid of (batch, head, block), every program independent of the others."""
  return pl.pallas_call(functools.partial(kernel, static), grid=grid, in_specs=in_specs, out_specs=out_specs,
                        out_shape=out_shape, interpret=static.platform == 'interpret',
                        compiler_params=_compiler_params(static.platform, ('parallel',) * 3))


def _head(h, group: int):
  """The key and value head that query head h reads: h // group (truncating division, which Mosaic lowers)."""
  return h if group == 1 else jax.lax.div(h, group)


def _whole(length: int, width: int, group: int = 1):
  """The whole L x width slab of one (batch, head); group > 1: of the key and value head of query head h."""
  return pl.BlockSpec((None, None, length, width), lambda b, h, i: (b, _head(h, group), 0, 0))


def _rows(block: int, width: int, group: int = 1):
  return pl.BlockSpec((None, None, block, width), lambda b, h, i: (b, _head(h, group), i, 0))


def _key_columns(block: int):
  """One block of a B x H x 1 x Lk line of the keys (their data, its gradient)."""
  return pl.BlockSpec((None, None, 1, block), lambda b, h, i: (b, h, 0, i))


def _inputs_specs(static: _Static, length_q: int, length_k: int, head_dim: int, value_dim: int, num_parameters: int,
                  by: str):
  """Specs for q, k, v, the queries' positions (and segments), a line of keys (positions, segments), the
  parameters, and the queries' and keys' data: one block of the axis the grid walks (by='query' or 'key'), the
  whole of the other."""
  q_rows = _rows(static.block_q, head_dim) if by == 'query' else _whole(length_q, head_dim)
  k_rows = _rows(static.block_k, head_dim, static.group) if by == 'key' else _whole(length_k, head_dim, static.group)
  v_rows = _rows(static.block_k, value_dim, static.group) if by == 'key' else _whole(length_k, value_dim, static.group)
  if by == 'query':
    q_positions = pl.BlockSpec((None, static.block_q, 1), lambda b, h, i: (b, i, 0))
    k_line = pl.BlockSpec((None, 1, length_k), lambda b, h, i: (b, 0, 0))
    q_data = _rows(static.block_q, 1)
    k_data = pl.BlockSpec((None, None, 1, length_k), lambda b, h, i: (b, h, 0, 0))
  else:
    q_positions = pl.BlockSpec((None, length_q, 1), lambda b, h, i: (b, 0, 0))
    k_line = pl.BlockSpec((None, 1, static.block_k), lambda b, h, i: (b, 0, i))
    q_data = _whole(length_q, 1)
    k_data = _key_columns(static.block_k)
  params = pl.BlockSpec((None, 1, num_parameters), lambda b, h, i: (h, 0, 0))
  return q_rows, k_rows, v_rows, q_positions, k_line, params, q_data, k_data


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static: _Static, q_BxHxLqxK, k_BxHxLkxK, v_BxHxLkxV, q_positions_BxLqx1, q_segments_BxLqx1,
           k_positions_Bx1xLk, k_segments_Bx1xLk, params_Hx1xA, q_data_BxHxLqx1, k_data_BxHx1xLk):
  return _flash_forward(static, q_BxHxLqxK, k_BxHxLkxK, v_BxHxLkxV, q_positions_BxLqx1, q_segments_BxLqx1,
                        k_positions_Bx1xLk, k_segments_Bx1xLk, params_Hx1xA, q_data_BxHxLqx1, k_data_BxHx1xLk)[0]


def _flash_forward(static: _Static, q, k, v, q_positions, q_segments, k_positions, k_segments, params, q_data,
                   k_data):
  batch, heads, length_q, head_dim = q.shape
  length_k, value_dim = k.shape[2], v.shape[3]
  q_rows, k_rows, v_rows, q_pos_spec, k_line, params_spec, q_data_spec, k_data_spec = _inputs_specs(
      static, length_q, length_k, head_dim, value_dim, params.shape[-1], 'query')
  forward = _call(
      _forward_kernel, static, (batch, heads, length_q // static.block_q),
      [q_rows, k_rows, v_rows, q_pos_spec, q_pos_spec, k_line, k_line, params_spec, q_data_spec, k_data_spec],
      [_rows(static.block_q, value_dim), _rows(static.block_q, 1)],
      [jax.ShapeDtypeStruct((batch, heads, length_q, value_dim), q.dtype),
       jax.ShapeDtypeStruct((batch, heads, length_q, 1), jnp.float32)])
  out, logsumexp = forward(q, k, v, q_positions, q_segments, k_positions, k_segments, params, q_data, k_data)
  return out, (q, k, v, q_positions, q_segments, k_positions, k_segments, params, q_data, k_data, out, logsumexp)


def _flash_backward(static: _Static, residuals, d_out):
  q, k, v, q_positions, q_segments, k_positions, k_segments, params, q_data, k_data, out, logsumexp = residuals
  batch, heads, length_q, head_dim = q.shape
  length_k, value_dim = k.shape[2], v.shape[3]
  num_parameters = static.num_parameters
  delta = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1, keepdims=True)
  d_out = d_out.astype(q.dtype)
  num_key_blocks = length_k // static.block_k
  q_rows, k_rows, v_rows, q_pos_spec, k_line, params_spec, q_data_spec, k_data_spec = _inputs_specs(
      static, length_q, length_k, head_dim, value_dim, params.shape[-1], 'key')
  q_stats = _whole(length_q, 1)
  key_values = _call(
      _key_values_kernel, static, (batch, heads, num_key_blocks),
      [q_rows, k_rows, v_rows, _whole(length_q, value_dim), q_stats, q_stats, q_pos_spec, q_pos_spec, k_line, k_line,
       params_spec, q_data_spec, k_data_spec],
      [_rows(static.block_k, head_dim), _rows(static.block_k, value_dim),
       pl.BlockSpec((None, None, None, 1, num_parameters), lambda b, h, i: (b, h, i, 0, 0)),
       _key_columns(static.block_k)],
      [jax.ShapeDtypeStruct((batch, heads, length_k, head_dim), jnp.float32),
       jax.ShapeDtypeStruct((batch, heads, length_k, value_dim), jnp.float32),
       jax.ShapeDtypeStruct((batch, heads, num_key_blocks, 1, num_parameters), jnp.float32),
       jax.ShapeDtypeStruct(k_data.shape, jnp.float32)])
  inputs = (q, k, v, d_out, logsumexp, delta, q_positions, q_segments, k_positions, k_segments, params, q_data, k_data)
  d_k, d_v, d_params, d_k_data = key_values(*inputs)
  q_rows, k_rows, v_rows, q_pos_spec, k_line, params_spec, q_data_spec, k_data_spec = _inputs_specs(
      static, length_q, length_k, head_dim, value_dim, params.shape[-1], 'query')
  q_stats = _rows(static.block_q, 1)
  queries = _call(
      _query_kernel, static, (batch, heads, length_q // static.block_q),
      [q_rows, k_rows, v_rows, _rows(static.block_q, value_dim), q_stats, q_stats, q_pos_spec, q_pos_spec, k_line,
       k_line, params_spec, q_data_spec, k_data_spec],
      [_rows(static.block_q, head_dim), _rows(static.block_q, 1)],
      [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q_data.shape, jnp.float32)])
  d_q, d_q_data = queries(*inputs)
  d_params_Hx1xA = jnp.sum(d_params, axis=(0, 2))
  if static.sinks:  # dL/ds_h = -sum_i exp(s_h - lse_i) delta_i: the sink's weight times each row's dO . O
    sink_Hx1x1 = params[:, :, num_parameters:]
    d_sink_Hx1x1 = -jnp.sum(jnp.exp(sink_Hx1x1[None] - logsumexp) * delta, axis=(0, 2))[:, :, None]
    d_params_Hx1xA = jnp.concatenate([d_params_Hx1xA, d_sink_Hx1x1], axis=-1)
  d_params_Hx1xA = d_params_Hx1xA.astype(params.dtype)
  groups = k.shape[1]  # each key and value head's gradient: the sum over the query heads of its group
  d_k = jnp.sum(d_k.reshape(batch, groups, static.group, length_k, head_dim), axis=2).astype(k.dtype)
  d_v = jnp.sum(d_v.reshape(batch, groups, static.group, length_k, value_dim), axis=2).astype(v.dtype)
  return (d_q, d_k, d_v, jnp.zeros_like(q_positions), jnp.zeros_like(q_segments), jnp.zeros_like(k_positions),
          jnp.zeros_like(k_segments), d_params_Hx1xA, d_q_data.astype(q_data.dtype), d_k_data.astype(k_data.dtype))


_flash.defvjp(_flash_forward, _flash_backward)


def _block_sizes(platform: str, block_q: int, block_k: int, length_q: int, length_k: int) -> tuple[int, int]:
  """The blocks asked for, no longer than the lengths' next powers of two; on a TPU, Mosaic's: rows in
  multiples of 8, the keys' lanes in multiples of 128."""
  if platform == 'tpu':
    block_q, block_k = max(block_q, 8), -(-max(block_k, 128) // 128) * 128
  return min(block_q, _next_power_of_two(length_q)), min(block_k, _next_power_of_two(length_k))


def _term_parameters(term: Optional[KernelTerm], heads: int) -> tuple[chex.Array, bool]:
  """(the term's parameters H x 1 x A in float32, zeros without a term; whether it reads per-token data)."""
  if term is None:
    return jnp.zeros((heads, 1, 1), jnp.float32), False
  chex.assert_shape(term.parameters_HxA, (heads, None))
  uses_data = term.q_data_BxHxLq is not None
  if (term.k_data_BxHxLk is not None) != uses_data:
    raise ValueError('KernelTerm: q_data_BxHxLq and k_data_BxHxLk come together; valid: both or neither')
  return term.parameters_HxA.astype(jnp.float32)[:, None, :], uses_data


def flash_attention(query_BxLqxHxK: chex.Array, key_BxLkxHxK: chex.Array, value_BxLkxHxV: chex.Array, *,
                    causal: bool = False, key_valid_BxLk: Optional[chex.Array] = None,
                    q_positions_BxLq: Optional[chex.Array] = None, k_positions_BxLk: Optional[chex.Array] = None,
                    q_segments_BxLq: Optional[chex.Array] = None, k_segments_BxLk: Optional[chex.Array] = None,
                    term: Optional[KernelTerm] = None, scale: Optional[float] = None, block_q: int = 128,
                    block_k: int = 128, platform: str = 'interpret', window: int = 0, chunk: int = 0,
                    softcap: float = 0.0, sink_H: Optional[chex.Array] = None) -> chex.Array:
  """softmax(cap(Q K^T scale + t(positions)), sink) V in blocks, B x Lq x H x V (the layout of the other cores);
  keys and values B x Lk x G x K with G dividing H, query head h reading head h // (H / G).

  causal: query i sees keys j <= i + Lk - Lq; with window W also j > i + Lk - Lq - W, with chunk C only the keys
  of its chunk (by index), the key blocks outside never visited. key_valid_BxLk: True for real keys (padding False).
  Positions default to 0..L-1 (B may be 1). Segments (non-negative document ids, given together; None:
  one document): a query sees only the keys of its own document, as in rows that pack several. softcap c > 0:
  logits c tanh(x / c); sink_H: a logit per head in every denominator (the online softmax starts from it). A row
  that sees no key gives zeros. Lengths are padded to whole blocks and the head width to a power of two
  (Triton's blocks), and cut back after."""
  if platform not in PLATFORMS:
    raise ValueError(f'platform: got {platform!r}; valid: {", ".join(PLATFORMS)}')
  if (window or chunk) and not causal:
    raise ValueError(f'window, chunk: got {window}, {chunk} in bidirectional attention; valid: 0 (the kernel\'s '
                     'windows and chunks are causal)')
  chex.assert_rank([query_BxLqxHxK, key_BxLkxHxK, value_BxLkxHxV], 4)
  chex.assert_equal_shape_prefix([key_BxLkxHxK, value_BxLkxHxV], 3)
  batch, length_q, heads, head_dim = query_BxLqxHxK.shape
  length_k, value_dim = key_BxLkxHxK.shape[1], value_BxLkxHxV.shape[3]
  chex.assert_shape(key_BxLkxHxK, (batch, length_k, None, head_dim))
  group = check_groups(heads, key_BxLkxHxK.shape[2])
  if (q_segments_BxLq is None) != (k_segments_BxLk is None):
    raise ValueError('q_segments_BxLq, k_segments_BxLk: the queries\' and the keys\' documents come together; '
                     'valid: both or neither')
  block_q, block_k = _block_sizes(platform, block_q, block_k, length_q, length_k)
  padded_q = -(-length_q // block_q) * block_q
  padded_k = -(-length_k // block_k) * block_k
  width, value_width = _next_power_of_two(head_dim), _next_power_of_two(value_dim)

  def heads_first(x, length, feature):  # B x L x H x F -> B x H x L' x F', zero padded
    return _pad_to(_pad_to(jnp.transpose(x, (0, 2, 1, 3)), 2, length), 3, feature)

  params_Hx1xA, uses_data = _term_parameters(term, heads)
  static = _Static(block_q, block_k, causal, length_k - length_q, 1.0 / math.sqrt(head_dim) if scale is None
                   else float(scale), None if term is None else term.function, params_Hx1xA.shape[-1], platform,
                   uses_data, group, window, chunk, softcap, sink_H is not None)
  if sink_H is not None:
    chex.assert_shape(sink_H, (heads,))
    params_Hx1xA = jnp.concatenate([params_Hx1xA, sink_H.astype(jnp.float32)[:, None, None]], axis=-1)
  lines = _lines(batch, heads, (length_q, padded_q), (length_k, padded_k), q_positions_BxLq, k_positions_BxLk,
                 q_segments_BxLq, k_segments_BxLk, key_valid_BxLk, term if uses_data else None)
  out_BxHxLqxV = _flash(static, heads_first(query_BxLqxHxK, padded_q, width),
                        heads_first(key_BxLkxHxK, padded_k, width), heads_first(value_BxLkxHxV, padded_k, value_width),
                        *lines[:4], params_Hx1xA, *lines[4:])
  out_BxLqxHxV = jnp.transpose(out_BxHxLqxV[:, :, :length_q, :value_dim], (0, 2, 1, 3))
  chex.assert_shape(out_BxLqxHxV, (batch, length_q, heads, value_dim))
  return out_BxLqxHxV


def _lines(batch: int, heads: int, queries: tuple, keys: tuple, q_positions_BxLq, k_positions_BxLk, q_segments_BxLq,
           k_segments_BxLk, key_valid_BxLk, term: Optional[KernelTerm]):
  """The kernels' per-token lines, padded to whole blocks (queries and keys: (length, padded length)): the queries'
  positions and segments B x Lq' x 1, the keys' B x 1 x Lk' (a padding key's segment -1, which no query's
  matches), and the term's data per query and key B x H x Lq' x 1, B x H x 1 x Lk' (zeros without data)."""
  (length_q, padded_q), (length_k, padded_k) = queries, keys

  def line(given, length, padded, default):  # B x L' float32
    given = default(length) if given is None else jnp.asarray(given)
    chex.assert_shape(given, (None, length))
    return _pad_to(jnp.broadcast_to(given, (batch, length)).astype(jnp.float32), 1, padded)
  positions = lambda length: jnp.arange(length, dtype=jnp.int32)[None]
  one_document = lambda length: jnp.zeros((1, length), jnp.int32)
  key_valid = jnp.ones((batch, length_k), bool) if key_valid_BxLk is None else (
      jnp.broadcast_to(key_valid_BxLk, (batch, length_k)).astype(bool))
  k_segments = jnp.where(_pad_to(key_valid, 1, padded_k), line(k_segments_BxLk, length_k, padded_k, one_document),
                         -1.0)

  def data(given, length, padded):  # B x H x L' float32, zeros without data
    if term is None:
      return jnp.zeros((batch, heads, padded), jnp.float32)
    chex.assert_shape(given, (batch, heads, length))
    return _pad_to(given.astype(jnp.float32), 2, padded)
  return (line(q_positions_BxLq, length_q, padded_q, positions)[:, :, None],
          line(q_segments_BxLq, length_q, padded_q, one_document)[:, :, None],
          line(k_positions_BxLk, length_k, padded_k, positions)[:, None, :], k_segments[:, None, :],
          data(None if term is None else term.q_data_BxHxLq, length_q, padded_q)[..., None],
          data(None if term is None else term.k_data_BxHxLk, length_k, padded_k)[:, :, None, :])
