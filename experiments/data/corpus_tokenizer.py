"""A corpus's tokenizer: raw UTF-8 bytes, or a byte-level BPE (Sennrich et al. 2016, on bytes as GPT-2)
trained offline with Hugging Face `tokenizers`, or a pretrained model's own BPE (its tokenizer.json): byte-level
(GPT-2's, SmolLM2's, Llama 3's, Qwen2's) or SentencePiece's pieces with byte fallback (Gemma's, Llama 2's: '▁' for
a space, <0xNN> for a byte no piece holds). Each has one token, EOD, written after every document; a tokenizer whose
template starts a sequence with BOS (Gemma's) has BOS written before every document, where the model saw it in
training and where transformers puts it.

token_bytes() gives each token's length in UTF-8 bytes, so that a loss in bits per token becomes bits
per byte, a score that compares across tokenizers: bits_per_byte = sum of -log2 p(token) / sum of the
tokens' bytes; a document's tokens sum to its UTF-8 length exactly. EOD stands for the boundary between two
documents and counts as one byte; BOS, and any other control token, as none (the bits of predicting BOS after EOD
are the boundary's, with EOD's).
"""

import json
from typing import Optional

import numpy as np

EOD_TOKEN = '<|endoftext|>'
# The first a tokenizer has is its EOD: Llama 3 names it the second way, Gemma the third, Llama 2 the fourth.
EOD_TOKENS = (EOD_TOKEN, '<|end_of_text|>', '<eos>', '</s>')
SPACE = '▁'  # SentencePiece's space
KINDS = ('bytes', 'bpe')
SMALLEST_BPE = 257  # the 256 bytes and EOD
LARGEST_BPE = 1 << 20  # four times the largest vocabularies in use (262,144); the BPE trainer's memory grows with it


class ByteTokenizer:
  """Token i < 256 is the byte i; EOD is 256."""
  kind = 'bytes'
  vocab_size = 257
  eod = 256
  bos = None

  def encode_batch(self, documents: list[str]) -> list[np.ndarray]:
    return [np.frombuffer(document.encode('utf-8'), np.uint8).astype(np.uint32) for document in documents]

  def decode(self, ids) -> str:
    return bytes(int(i) for i in ids if i < 256).decode('utf-8', 'replace')

  def token_bytes(self) -> np.ndarray:
    return np.ones(self.vocab_size, np.int64)

  def to_str(self) -> str:
    return ''


def _decoder_parts(decoder: dict) -> set:
  return {decoder.get('type'), *(part.get('type') for part in decoder.get('decoders', []))}


def _first_token(post_processor: Optional[dict]) -> Optional[str]:
  """The special token a single sequence's template starts with (BOS), or None."""
  single = (post_processor or {}).get('single') or []
  return single[0]['SpecialToken']['id'] if single and 'SpecialToken' in single[0] else None


class BpeTokenizer:
  """Byte-level BPE: text split as GPT-2 splits it (words with their leading space, digits, punctuation,
  whitespace), each piece's bytes mapped to printable characters, merged by the learned merges. Or SentencePiece's
  pieces (pieces = True): spaces as '▁', bytes no piece holds as <0xNN> pieces."""
  kind = 'bpe'

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    self.vocab_size = tokenizer.get_vocab_size()
    found = [tokenizer.token_to_id(token) for token in EOD_TOKENS if tokenizer.token_to_id(token) is not None]
    self.eod = found[0] if found else None
    # A document's text that spells the EOD token is text, not a document boundary.
    tokenizer.encode_special_tokens = True
    if self.eod is None:
      raise ValueError(f'tokenizer: no {" or ".join(EOD_TOKENS)} token; valid: a BPE with one of them')
    fields = json.loads(tokenizer.to_str())
    parts = _decoder_parts(fields.get('decoder') or {})
    self.pieces = {'Replace', 'ByteFallback'} <= parts and (fields.get('model') or {}).get('byte_fallback', False)
    if 'ByteLevel' not in parts and not self.pieces:
      raise ValueError(f'tokenizer: its decoder is {(fields.get("decoder") or {}).get("type")!r}; valid: a byte-level '
                       'BPE (decoder ByteLevel), whose tokens count their bytes one per character, or SentencePiece\'s '
                       'pieces with byte fallback (decoders Replace and ByteFallback)')
    start = _first_token(fields.get('post_processor'))
    self.bos = None if start is None else tokenizer.token_to_id(start)

  @classmethod
  def train(cls, documents, vocab_size: int) -> 'BpeTokenizer':
    """Merges learned from the documents (an iterable of str) until vocab_size tokens, EOD the first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return cls(tokenizer)

  @classmethod
  def from_str(cls, text: str) -> 'BpeTokenizer':
    from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
    return cls(Tokenizer.from_str(text))

  def encode_batch(self, documents: list[str]) -> list[np.ndarray]:
    # encode_batch_fast computes no character offsets, which nothing here reads.
    encode = getattr(self.tokenizer, 'encode_batch_fast', self.tokenizer.encode_batch)
    encodings = encode(documents, add_special_tokens=False)
    return [np.asarray(encoding.ids, np.uint32) for encoding in encodings]

  def decode(self, ids) -> str:
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

  def token_bytes(self) -> np.ndarray:
    """A byte-level token's characters are its bytes, one each; a piece's are its text's UTF-8 bytes, '▁' a space
    and <0xNN> one byte; EOD counts as one, the other special tokens (BOS) as none."""
    lengths = np.ones(self.vocab_size, np.int64)
    for token, index in self.tokenizer.get_vocab(with_added_tokens=False).items():
      lengths[index] = len(token) if not self.pieces else 1 if _is_byte_piece(token) else len(
          token.replace(SPACE, ' ').encode('utf-8'))
    for index, added in self.tokenizer.get_added_tokens_decoder().items():
      lengths[index] = 0 if added.special else len(added.content.replace(SPACE, ' ').encode('utf-8'))
    lengths[self.eod] = 1
    return lengths

  def to_str(self) -> str:
    return self.tokenizer.to_str()


def _is_byte_piece(token: str) -> bool:
  """SentencePiece's byte fallback piece <0xNN>."""
  return len(token) == 6 and token.startswith('<0x') and token.endswith('>')
