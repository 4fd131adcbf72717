"""Pick a model by kind and architecture: a plain table, no registry."""

import flax.linen as nn

from transformer.config import ModelConfig
from transformer.models import DecoderOnly, EncoderDecoder, EncoderOnly
from transformer.recurrent import RecurrentDecoderOnly, RecurrentEncoderDecoder, RecurrentEncoderOnly

MODEL_KINDS = ('decoder_only', 'encoder_decoder', 'encoder_only')

_TRANSFORMERS = {'decoder_only': DecoderOnly, 'encoder_decoder': EncoderDecoder, 'encoder_only': EncoderOnly}
_RECURRENT = {'decoder_only': RecurrentDecoderOnly, 'encoder_decoder': RecurrentEncoderDecoder,
              'encoder_only': RecurrentEncoderOnly}


def build_model(config: ModelConfig, kind: str) -> nn.Module:
  """The model of this kind; config.architecture picks the Transformer or a recurrent baseline."""
  if kind not in MODEL_KINDS:
    raise ValueError(f'model kind: got {kind!r}; valid: {", ".join(MODEL_KINDS)}')
  table = _TRANSFORMERS if config.architecture == 'transformer' else _RECURRENT
  return table[kind](config)
