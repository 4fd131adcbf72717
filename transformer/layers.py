"""Building blocks as pure functions, and the thin Linen modules that own their parameters.

Linear, Embedding (a gather), LayerNorm (biased variance), dropout and the position-wise
feed-forward network of Vaswani et al. 2017, section 3.3.
"""

import functools
from typing import Callable, Optional

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

# Logical names of parameter axes: what an axis means, never where it lives. Experiments map them to the
# axes of a device mesh (experiments/runs/sharding.py); an axis without a name is never split.
EMBED, HEADS, MLP, VOCAB = 'embed', 'heads', 'mlp', 'vocab'
KV_HEADS = 'kv_heads'  # the key and value projections' heads (fewer than the queries' with grouped-query attention)
BATCH = 'batch'  # the examples axis of activations


def batch_split(x: chex.Array) -> chex.Array:
  """x, asked to stay split along its first (examples) axis where the caller has mapped the name 'batch'
  to mesh axes (nn.logical_axis_rules and a mesh set); x itself everywhere else. Keeps XLA from gathering
  activations to meet a parameter split along another axis."""
  return nn.with_logical_constraint(x, (BATCH,) + (None,) * (x.ndim - 1))


def named_axes(init: Callable, axes: Optional[tuple]) -> Callable:
  """init, its parameter's axes named (Flax partitioning metadata: model.init returns the value boxed with
  its names, nn.meta.unbox gives the array); unchanged for axes None."""
  return init if axes is None else nn.with_logical_partitioning(init, axes)


def parameter(module: nn.Module, name: str, init: Callable, shape: tuple[int, ...]) -> chex.Array:
  """`module.param(name, init, shape)`, unboxed, with an existing parameter's shape compared with `shape`.

  Flax checks an existing parameter by tracing its initializer (`jax.eval_shape`) at every application of
  the module, eager or traced; the shape is known here, so the same check is a comparison."""
  if not module.has_variable('params', name):
    return module.param(name, init, shape)
  value = nn.meta.unbox(module.get_variable('params', name))
  if tuple(value.shape) != tuple(shape):
    raise flax.errors.ScopeParamShapeError(name, module.scope.path_text, tuple(value.shape), tuple(shape))
  return value


ACTIVATIONS: dict[str, Callable[[chex.Array], chex.Array]] = {
    'relu': jax.nn.relu,  # the paper's choice
    'gelu': jax.nn.gelu,  # the tanh approximation (GPT-2's gelu_new)
    'gelu_exact': functools.partial(jax.nn.gelu, approximate=False),  # x Phi(x) (BERT, GPT-NeoX, Pythia)
}
# Gated feed-forwards (Shazeer 2020): the activation of a gate times a linear 'up' projection.
GATED_ACTIVATIONS: dict[str, Callable[[chex.Array], chex.Array]] = {
    'swiglu': jax.nn.silu,  # Llama, Mistral, Qwen2, SmolLM2
    'geglu': jax.nn.gelu,
}
NORM_TYPES = ('layernorm', 'rmsnorm')


def linear(x_NxI: chex.Array, weight_IxO: chex.Array, bias_O: Optional[chex.Array] = None) -> chex.Array:
  """y = x W + b over the last axis of x (any leading axes)."""
  chex.assert_rank(weight_IxO, 2)
  chex.assert_axis_dimension(x_NxI, -1, weight_IxO.shape[0])
  # As one 2-D matmul: XLA's CPU backend runs a 3-D x 2-D dot (and the weight gradient, which then
  # contracts two axes) well below the speed of the same 2-D matmul.
  y = (x_NxI.reshape(-1, weight_IxO.shape[0]) @ weight_IxO).reshape(*x_NxI.shape[:-1], weight_IxO.shape[1])
  if bias_O is not None:
    chex.assert_shape(bias_O, (weight_IxO.shape[1],))
    y = y + bias_O
  return y


def embedding_lookup(table_CxD: chex.Array, ids: chex.Array) -> chex.Array:
  """E[ids]: a gather of rows of the table, never a one-hot matmul."""
  chex.assert_rank(table_CxD, 2)
  chex.assert_type(ids, int)
  return table_CxD[ids]


def layer_norm(x: chex.Array, scale_D: chex.Array, offset_D: chex.Array, eps: float = 1e-6) -> chex.Array:
  """LN(x) = (x - mean) / sqrt(var + eps) * scale + offset, var the biased (1/D) variance.

  Ba, Kiros and Hinton 2016. Statistics are taken in float32 whatever the input dtype.
  """
  chex.assert_shape([scale_D, offset_D], (x.shape[-1],))
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  variance = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  y = (x32 - mean) * jax.lax.rsqrt(variance + eps) * scale_D + offset_D
  return y.astype(x.dtype)


def rms_norm(x: chex.Array, scale_D: chex.Array, eps: float = 1e-6) -> chex.Array:
  """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * scale: no centring, no offset.

  Zhang and Sennrich 2019. Statistics are taken in float32 whatever the input dtype.
  """
  chex.assert_shape(scale_D, (x.shape[-1],))
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps) * scale_D
  return y.astype(x.dtype)


def dropout(x: chex.Array, rate: float, rng: Optional[chex.PRNGKey], deterministic: bool) -> chex.Array:
  """Inverted dropout: keep each entry with probability 1 - rate and scale it by 1 / (1 - rate)."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f'dropout rate must be in [0, 1), got {rate}')
  if deterministic or rate == 0.0:
    return x
  if rng is None:
    raise ValueError('dropout with deterministic=False needs an rng key')
  keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def feed_forward(x_NxD: chex.Array, w1_DxF, b1_F, w2_FxD, b2_D, activation: str = 'relu',
                 dropout_rate: float = 0.0, rng: Optional[chex.PRNGKey] = None,
                 deterministic: bool = True) -> chex.Array:
  """FFN(x) = act(x W1 + b1) W2 + b2, applied at every position (Vaswani et al. 2017, eq. 2).

  Dropout, when on, acts on the hidden activations.
  """
  if activation not in ACTIVATIONS:
    raise ValueError(f'activation: got {activation!r}, valid: {sorted(ACTIVATIONS)}')
  hidden = ACTIVATIONS[activation](linear(x_NxD, w1_DxF, b1_F))
  hidden = dropout(hidden, dropout_rate, rng, deterministic)
  y = linear(hidden, w2_FxD, b2_D)
  chex.assert_equal_shape([x_NxD, y])
  return y


def gated_feed_forward(x_NxD: chex.Array, gate_DxF, gate_bias_F, up_DxF, up_bias_F, down_FxD, down_bias_D,
                       activation: str = 'swiglu', dropout_rate: float = 0.0, rng: Optional[chex.PRNGKey] = None,
                       deterministic: bool = True) -> chex.Array:
  """FFN(x) = (act(x W_gate + b_gate) * (x W_up + b_up)) W_down + b_down: SwiGLU with act = SiLU, GeGLU with
  GELU (Shazeer 2020, "GLU variants improve Transformer"); F is the gate's width. Dropout acts on the product.
  """
  if activation not in GATED_ACTIVATIONS:
    raise ValueError(f'activation: got {activation!r}, valid: {sorted(GATED_ACTIVATIONS)}')
  chex.assert_equal_shape([gate_DxF, up_DxF])
  hidden = GATED_ACTIVATIONS[activation](linear(x_NxD, gate_DxF, gate_bias_F)) * linear(x_NxD, up_DxF, up_bias_F)
  hidden = dropout(hidden, dropout_rate, rng, deterministic)
  y = linear(hidden, down_FxD, down_bias_D)
  chex.assert_equal_shape([x_NxD, y])
  return y


class Dense(nn.Module):
  """Owns W (in x out) and b (float32), and calls `linear` in the input's dtype. axes: the logical names
  of W's (in, out) axes, None for none."""
  features: int
  use_bias: bool = True
  kernel_init: Callable = nn.initializers.xavier_uniform()
  axes: Optional[tuple[str, str]] = None

  @nn.compact
  def weights(self, in_features: int) -> tuple[chex.Array, Optional[chex.Array]]:
    """(W, b), b None without a bias: for a caller that fuses several projections into one matmul."""
    weight = parameter(self, 'kernel', named_axes(self.kernel_init, self.axes), (in_features, self.features))
    bias = parameter(self, 'bias', nn.initializers.zeros, (self.features,)) if self.use_bias else None
    return weight, bias

  def __call__(self, x: chex.Array) -> chex.Array:
    weight, bias = self.weights(x.shape[-1])
    return linear(x, weight.astype(x.dtype), None if bias is None else bias.astype(x.dtype))


class Embed(nn.Module):
  """Owns the V x D table; `__call__` gathers rows, `attend` gives logits x E^T (tied output)."""
  vocab_size: int
  features: int

  def setup(self):
    init = named_axes(nn.initializers.normal(stddev=self.features ** -0.5), (VOCAB, EMBED))
    self.embedding = parameter(self, 'embedding', init, (self.vocab_size, self.features))

  def __call__(self, ids: chex.Array) -> chex.Array:
    return embedding_lookup(self.embedding, ids)

  def attend(self, x_NxD: chex.Array) -> chex.Array:
    return linear(x_NxD, self.embedding.T.astype(x_NxD.dtype))


class LayerNorm(nn.Module):
  """Owns the learnable scale (ones) and offset (zeros), and calls `layer_norm`."""
  eps: float = 1e-6

  @nn.compact
  def __call__(self, x: chex.Array) -> chex.Array:
    scale = parameter(self, 'scale', nn.initializers.ones, (x.shape[-1],))
    offset = parameter(self, 'bias', nn.initializers.zeros, (x.shape[-1],))
    return layer_norm(x, scale, offset, self.eps)


class RMSNorm(nn.Module):
  """Owns the learnable scale (ones), and calls `rms_norm`."""
  eps: float = 1e-6

  @nn.compact
  def __call__(self, x: chex.Array) -> chex.Array:
    return rms_norm(x, parameter(self, 'scale', nn.initializers.ones, (x.shape[-1],)), self.eps)


def norm_layer(norm_type: str, eps: float, **kwargs) -> nn.Module:
  """The block's normalisation: 'layernorm' or 'rmsnorm' (model.norm_type), with its epsilon."""
  if norm_type not in NORM_TYPES:
    raise ValueError(f'norm_type: got {norm_type!r}, valid: {", ".join(NORM_TYPES)}')
  return (LayerNorm if norm_type == 'layernorm' else RMSNorm)(eps, **kwargs)


class Dropout(nn.Module):
  """Calls `dropout` with a key from the 'dropout' rng stream."""
  rate: float

  @nn.compact
  def __call__(self, x: chex.Array, deterministic: bool) -> chex.Array:
    rng = None if deterministic or self.rate == 0.0 else self.make_rng('dropout')
    return dropout(x, self.rate, rng, deterministic)


class FeedForward(nn.Module):
  """Position-wise feed-forward network with dropout on the hidden layer: `feed_forward`, or
  `gated_feed_forward` for a gated activation (a third matrix, gate_kernel). use_bias: the biases."""
  hidden_features: int
  activation: str = 'relu'
  dropout_rate: float = 0.0
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: chex.Array, deterministic: bool = True) -> chex.Array:
    width = x.shape[-1]
    init = nn.initializers.xavier_uniform()

    def weights(name: str, shape: tuple, axes: tuple):
      kernel = parameter(self, f'{name}_kernel', named_axes(init, axes), shape).astype(x.dtype)
      bias = parameter(self, f'{name}_bias', nn.initializers.zeros, shape[1:]) if self.use_bias else None
      return kernel, None if bias is None else bias.astype(x.dtype)

    rng = None if deterministic or self.dropout_rate == 0.0 else self.make_rng('dropout')
    hidden = weights('hidden', (width, self.hidden_features), (EMBED, MLP))
    output = weights('output', (self.hidden_features, width), (MLP, EMBED))
    if self.activation in GATED_ACTIVATIONS:
      gate = weights('gate', (width, self.hidden_features), (EMBED, MLP))
      return gated_feed_forward(x, *gate, *hidden, *output, self.activation, self.dropout_rate, rng, deterministic)
    return feed_forward(x, *hidden, *output, self.activation, self.dropout_rate, rng, deterministic)
