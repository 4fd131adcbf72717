"""A from-scratch Transformer library in JAX/Flax Linen, with every positional encoding behind one
interface. Imports only jax, flax, chex and numpy; never reads flags, files or datasets.

Shape letters: a name ends in its array's axes joined by x (`logits_BxHxLqxLk`), each axis one of

  B    batch
  L    sequence length, where queries and keys are the same tokens
  Lq   queries
  Lk   keys (a cache's slots when decoding)
  Ls   source tokens (the encoder's)
  Lt   target tokens (the decoder's)
  Lp   a prompt's tokens
  Ln   the tokens one cached decoding step feeds
  Ld   the distances j - i of an Lq x Lk window: Lq + Lk - 1
  bq   queries in one block (blockwise attention, the kernel)
  bk   keys in one block
  H    attention heads (the queries')
  G    key and value heads: H / G query heads share each (grouped-query attention)
  Hg   the H / G query heads that share one key and value head
  D    model width
  F    feed-forward width
  I    a dense layer's input features
  O    a dense layer's output features
  K    query and key width per head
  V    value width per head
  P    pairs of features that one frequency turns (rotary: K/2; sinusoids: D/2)
  R    rows of a relative-position table: clipped distances, buckets, or CoPE's integer positions
  A    a kernel position term's parameters per head
  W    FIRE's hidden width
  C    classes of the output softmax: the vocabulary, or a classifier's labels
  M    hypotheses per source in beam search
  N    rows: leading axes flattened together, or a count of examples
  1    an axis of size one, kept for broadcasting

and a number is an axis of that size (`theta_2xH`), or before a letter multiplies it (`qkv_BxLx3D`).
"""

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
