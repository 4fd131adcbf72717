"""A GGUF file's SentencePiece tokenizer (tokenizer.ggml.model = llama: Gemma, Llama 2) rebuilt with Hugging Face
`tokenizers`, as transformers rebuilds it: a BPE over the file's pieces whose merges are every pair of pieces that
concatenate to a piece, ranked by that piece's place in the vocabulary (SentencePiece writes its BPE pieces best
first; the scores of Gemma's user-defined pieces, -1000, would rank its runs of spaces last), with byte fallback to the <0xNN> pieces; spaces become '▁' (no prefix space: add_space_prefix false) and the text is split
after each, so no piece crosses a word's end; control pieces are special tokens, user-defined pieces (Gemma's runs of
newlines and tabs, its markup tags) are matched before the model, except runs of spaces, which the normalizer has
turned into '▁' before any match; BOS is added at the start where add_bos_token says so (Gemma: yes).

Every byte of a document is then counted exactly: a character no piece holds becomes its UTF-8 bytes' pieces, and
decoding gives the text back.
"""

from experiments.pretrained.tables import PretrainedError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # tokenizer.ggml.token_type


def tokenizer_json(tokens: list, types: list, bos: int, add_bos: bool, add_space_prefix: bool) -> str:
  """The tokenizer as Hugging Face tokenizers' JSON; PretrainedError for what is not rebuilt here."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  if add_space_prefix:
    raise PretrainedError('tokenizer.ggml.add_space_prefix: got true; valid: false (a SentencePiece model that adds '
                          'a prefix space is not rebuilt here yet)')
  if len(tokens) != len(types):
    raise PretrainedError(f'tokenizer.ggml.tokens, token_type: {len(tokens)} and {len(types)} entries; valid: one of '
                          'each per piece')
  # llama.cpp writes a user-defined run of '▁' (Gemma's runs of spaces) with spaces: the piece is '▁' again here, a
  # piece the model reaches by merges like any other.
  tokens = [token.replace(' ', '▁') if kind == USER_DEFINED else token for token, kind in zip(tokens, types)]
  vocab = {token: index for index, token in enumerate(tokens)}
  merges = []
  for piece in (token for token, kind in zip(tokens, types) if kind in (NORMAL, USER_DEFINED)):  # in id order
    splits = [(piece[:cut], piece[cut:]) for cut in range(1, len(piece))
              if piece[:cut] in vocab and piece[cut:] in vocab]
    merges.extend(sorted(splits, key=lambda pair: (vocab[pair[0]], vocab[pair[1]])))
  unknown = next((token for token, kind in zip(tokens, types) if kind == UNKNOWN), None)
  tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unknown, fuse_unk=True, byte_fallback=True))
  tokenizer.normalizer = normalizers.Replace(' ', '▁')
  tokenizer.pre_tokenizer = pre_tokenizers.Split(' ', behavior='merged_with_previous')
  tokenizer.decoder = decoders.Sequence([decoders.Replace('▁', ' '), decoders.ByteFallback(), decoders.Fuse()])
  tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                for token, kind in zip(tokens, types) if kind == CONTROL])
  tokenizer.add_tokens([AddedToken(token, special=False, normalized=False)
                        for token, kind in zip(tokens, types) if kind == USER_DEFINED and '▁' not in token])
  if add_bos:
    start = tokens[bos]
    tokenizer.post_processor = processors.TemplateProcessing(single=f'{start} $A', pair=f'{start} $A {start} $B',
                                                             special_tokens=[(start, bos)])
  return tokenizer.to_str()
