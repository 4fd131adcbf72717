"""A GGUF file's SentencePiece vocabulary rebuilt as a tokenizer (experiments/pretrained/sentencepiece_gguf.py), on a
vocabulary small enough to work out by hand; tests/test_pretrained_gemma.py compares Gemma 3's with transformers'."""

import pytest
from tokenizers import Tokenizer

from experiments.pretrained import sentencepiece_gguf as spm
from experiments.pretrained.tables import PretrainedError

BYTES = [f'<0x{value:02X}>' for value in range(256)]
# id: 0 <pad> 1 <eos> 2 <bos> 3 <unk> | 4 '\n\n' (user-defined) | 5 '  ' (user-defined run of spaces, as llama.cpp
# writes it) | 6 '▁' 7 'a' 8 'b' 9 'ab' 10 '▁a' 11 '▁ab' | 12.. the bytes
PIECES = ['<pad>', '<eos>', '<bos>', '<unk>', '\n\n', '  ', '▁', 'a', 'b', 'ab', '▁a', '▁ab'] + BYTES
TYPES = [spm.CONTROL, spm.CONTROL, spm.CONTROL, spm.UNKNOWN, spm.USER_DEFINED, spm.USER_DEFINED] + \
    [spm.NORMAL] * 6 + [spm.BYTE] * 256


def _tokenizer(add_bos=True):
  return Tokenizer.from_str(spm.tokenizer_json(PIECES, TYPES, bos=2, add_bos=add_bos, add_space_prefix=False))


@pytest.mark.parametrize('text, expected', [
    ('ab', [2, 9]),                    # BOS, then the merge of a and b
    (' ab', [2, 11]),                  # the space is '▁', which merges into '▁ab'
    ('  ab', [2, 5, 9]),               # '▁▁' (id 5) merges first, then 'ab' (9); '▁a' (10) comes too late
    ('a\n\nb', [2, 7, 4, 8]),          # the user-defined '\n\n' matched whole, before the model
    ('aé', [2, 7, 12 + 0xC3, 12 + 0xA9]),  # é is in no piece: its two UTF-8 bytes
])
def test_a_small_vocabulary_tokenizes_as_worked_by_hand(text, expected):
  tokenizer = _tokenizer()
  assert tokenizer.encode(text).ids == expected
  assert tokenizer.decode(expected, skip_special_tokens=True) == text


def test_bos_only_where_the_file_asks_and_control_pieces_are_special():
  assert _tokenizer(add_bos=False).encode('ab').ids == [9]
  assert _tokenizer().encode('<eos>').ids == [2, 1]  # a control piece in the text is that token
  with pytest.raises(PretrainedError, match=r'add_space_prefix: got true; valid: false'):
    spm.tokenizer_json(PIECES, TYPES, bos=2, add_bos=True, add_space_prefix=True)


def test_as_a_corpus_tokenizer_its_pieces_count_every_utf8_byte_once():
  """'▁' a space, <0xNN> one byte, a user-defined piece its text's bytes; EOD (<eos>) one, BOS none."""
  from experiments.data.corpus_tokenizer import BpeTokenizer  # pylint: disable=import-outside-toplevel
  tokenizer = BpeTokenizer.from_str(spm.tokenizer_json(PIECES, TYPES, bos=2, add_bos=True, add_space_prefix=False))
  assert (tokenizer.pieces, tokenizer.eod, tokenizer.bos) == (True, 1, 2)
  token_bytes = tokenizer.token_bytes()
  assert [int(token_bytes[index]) for index in (0, 1, 2, 4, 5, 6, 9, 11, 12)] == [0, 1, 0, 2, 2, 1, 2, 3, 1]
  for text in ('  ab', 'a\n\nb ab', 'café 中文 😀', ' \t\n'):
    ids = tokenizer.encode_batch([text])[0]
    assert 2 not in ids and token_bytes[ids].sum() == len(text.encode('utf-8')), text
