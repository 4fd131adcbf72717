"""A from-scratch Transformer library in JAX/Flax Linen, with every positional encoding behind one
interface. Imports only jax, flax, chex and numpy; never reads flags, files or datasets."""

from transformer import positions
from transformer.attention import merge_heads, scaled_dot_product_attention, split_heads
from transformer.attention_request import AttentionMask, AttentionPositions, AttentionRequest
from transformer.blocks import TransformerLayer, TransformerStack
from transformer.config import ModelConfig, PositionConfig, base_preset, small_preset, tiny_preset
from transformer.factory import MODEL_KINDS, build_model
from transformer.layers import (Dense, Dropout, Embed, FeedForward, LayerNorm, dropout, embedding_lookup,
                                feed_forward, layer_norm, linear)
from transformer.masks import causal_mask, cross_attention_mask, padding_mask, self_attention_mask
from transformer.multi_head_attention import MultiHeadAttention
from transformer.models import (DecoderOnly, EncoderDecoder, EncoderOnly, beam_search, decoder_only_generate,
                                greedy_decode, greedy_generate)
from transformer.positions import VARIANTS
from transformer.recurrent import RecurrentDecoderOnly, RecurrentEncoderDecoder, RecurrentEncoderOnly
from transformer.softmax import softmax
