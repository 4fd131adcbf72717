"""RNN and LSTM baselines with the inputs and outputs of the Transformer models, so a task swaps
them in with `architecture='lstm'` or `'rnn'` (Elman 1990; Hochreiter and Schmidhuber 1997;
Sutskever et al. 2014 for the encoder-decoder, without attention). They have no positional
encoding: order comes from the recurrence."""

from typing import Optional

import chex
import flax.linen as nn
import jax.numpy as jnp

from transformer.config import ModelConfig
from transformer.layers import Dense, Dropout
from transformer.models import InputEmbedding, TokenEmbedding, check_token_input, pool


def _cell(config: ModelConfig, features: int, name: str):
  cell = nn.LSTMCell if config.architecture == 'lstm' else nn.SimpleCell
  return cell(features, name=name)


def _lengths(valid_BxL: Optional[chex.Array], x_BxLxD: chex.Array) -> chex.Array:
  if valid_BxL is None:
    return jnp.full((x_BxLxD.shape[0],), x_BxLxD.shape[1], jnp.int32)
  return jnp.sum(valid_BxL.astype(jnp.int32), axis=1)


class RecurrentStack(nn.Module):
  """num_layers recurrent layers of width model_dim (bidirectional: model_dim/2 each way, concatenated)."""
  config: ModelConfig
  num_layers: int
  bidirectional: bool

  @nn.compact
  def __call__(self, x_BxLxD, *, valid_BxL=None, initial_carry=None, deterministic: bool = True):
    config = self.config
    lengths_B = _lengths(valid_BxL, x_BxLxD)
    final_carry = None
    for index in range(self.num_layers):
      if self.bidirectional:
        half = config.model_dim // 2
        layer = nn.Bidirectional(nn.RNN(_cell(config, half, f'forward_cell_{index}')),
                                 nn.RNN(_cell(config, config.model_dim - half, f'backward_cell_{index}')),
                                 name=f'layer_{index}')
        x_BxLxD = layer(x_BxLxD, seq_lengths=lengths_B)
      else:
        rnn = nn.RNN(_cell(config, config.model_dim, f'cell_{index}'), return_carry=True, name=f'layer_{index}')
        final_carry, x_BxLxD = rnn(x_BxLxD, initial_carry=initial_carry if index == 0 else None,
                                   seq_lengths=lengths_B)
      x_BxLxD = Dropout(config.dropout_rate)(x_BxLxD, deterministic)
    return x_BxLxD


def summary(hidden_BxLxD, valid_BxL, bidirectional: bool) -> chex.Array:
  """The sequence in one vector: the forward state at the last valid step (and, bidirectional,
  the backward state at step 0)."""
  lengths_B = _lengths(valid_BxL, hidden_BxLxD)
  last_BxD = jnp.take_along_axis(hidden_BxLxD, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
  if not bidirectional:
    return last_BxD
  half = hidden_BxLxD.shape[-1] // 2
  return jnp.concatenate([last_BxD[:, :half], hidden_BxLxD[:, 0, half:]], axis=-1)


class RecurrentDecoderOnly(nn.Module):
  """tokens B x L -> next-token logits B x L x C, left to right."""
  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL, *, valid_BxL=None, deterministic: bool = True):
    check_token_input(tokens_BxL, 'tokens')
    embedding = TokenEmbedding(self.config, name='embedding')
    hidden = RecurrentStack(self.config, self.config.num_decoder_layers, bidirectional=False,
                            name='decoder')(embedding(tokens_BxL), valid_BxL=valid_BxL, deterministic=deterministic)
    return embedding.logits(hidden)


class RecurrentEncoderOnly(nn.Module):
  """inputs (ids B x L or features B x L x F) -> B x num_outputs; 'cls' and 'last' pooling read the
  final states (each direction's last step), 'mean' averages the valid steps."""
  config: ModelConfig

  @nn.compact
  def __call__(self, inputs, *, valid_BxL=None, deterministic: bool = True):
    config = self.config
    x_BxLxD = InputEmbedding(config, name='input')(inputs)
    hidden = RecurrentStack(config, config.num_encoder_layers, config.bidirectional, name='encoder')(
        x_BxLxD, valid_BxL=valid_BxL, deterministic=deterministic)
    reads_final_states = config.pooling in ('cls', 'last')
    pooled = summary(hidden, valid_BxL, config.bidirectional) if reads_final_states else pool(
        hidden, valid_BxL, 'mean')
    return Dense(config.num_outputs, name='head')(pooled)


class RecurrentEncoderDecoder(nn.Module):
  """Sequence to sequence: the encoder's summary starts the decoder and is fed at every step."""
  config: ModelConfig

  def setup(self):
    config = self.config
    self.embedding = TokenEmbedding(config)
    self.encoder = RecurrentStack(config, config.num_encoder_layers, config.bidirectional)
    self.decoder = RecurrentStack(config, config.num_decoder_layers, bidirectional=False)
    self.bridge = Dense(config.model_dim)
    self.input_projection = Dense(config.model_dim)

  def encode(self, source_BxLs, *, source_valid_BxLs=None, deterministic: bool = True):
    check_token_input(source_BxLs, 'source')
    return self.encoder(self.embedding(source_BxLs), valid_BxL=source_valid_BxLs, deterministic=deterministic)

  def decode(self, memory_BxLsxD, target_input_BxLt, *, source_valid_BxLs=None, target_valid_BxLt=None,
             deterministic: bool = True):
    check_token_input(target_input_BxLt, 'target_input')
    context_BxD = jnp.tanh(self.bridge(summary(memory_BxLsxD, source_valid_BxLs, self.config.bidirectional)))
    target_BxLtxD = self.embedding(target_input_BxLt)
    context_BxLtxD = jnp.broadcast_to(context_BxD[:, None], target_BxLtxD.shape)
    inputs = self.input_projection(jnp.concatenate([target_BxLtxD, context_BxLtxD], axis=-1))
    carry = (context_BxD, context_BxD) if self.config.architecture == 'lstm' else context_BxD
    hidden = self.decoder(inputs, valid_BxL=target_valid_BxLt, initial_carry=carry, deterministic=deterministic)
    return self.embedding.logits(hidden)

  def __call__(self, source_BxLs, target_input_BxLt, *, source_valid_BxLs=None, target_valid_BxLt=None,
               deterministic: bool = True):
    memory = self.encode(source_BxLs, source_valid_BxLs=source_valid_BxLs, deterministic=deterministic)
    return self.decode(memory, target_input_BxLt, source_valid_BxLs=source_valid_BxLs,
                       target_valid_BxLt=target_valid_BxLt, deterministic=deterministic)
