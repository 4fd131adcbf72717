"""One pretrained checkpoint, whichever format: a Hugging Face model folder (hugging_face.py) or a GGUF file
(gguf_file.py), read as this library's decoder config, its parameters, the context it was trained at, its
tokenizer (Hugging Face tokenizers' JSON, when the source has one) and the files it was read from, each with
its size, modification time and SHA-256 (experiments/shared/files.py), so that a later reader can tell whether
the source has changed.
"""

import dataclasses
import os
from typing import Optional

import transformer
from experiments.pretrained import gguf_file, hugging_face
from experiments.pretrained.safetensors_file import INDEX_FILE, Tensors, weight_files
from experiments.pretrained.tables import PretrainedError, read_json_object
from experiments.shared.files import describe_files

TOKENIZER_FILE = 'tokenizer.json'


@dataclasses.dataclass
class Source:
  path: str  # absolute
  format: str  # 'hugging_face' or 'gguf'
  architecture: str
  config: transformer.ModelConfig
  params: dict  # {'params': ...} of transformer.DecoderOnly(config), float32 NumPy arrays
  context_length: int  # the longest sequence it was trained at (max_position_embeddings; GGUF context_length)
  tokenizer_json: Optional[str]
  tokenizer_refused: str  # why the source's own tokenizer could not be read ('' when it was, or it has none)
  files: dict  # {path relative to the source's folder: {'bytes', 'mtime_ns', 'sha256'}}


def read_source(path: str) -> Source:
  """The checkpoint at path (a folder with config.json, or a .gguf file); PretrainedError naming what it cannot
  read or serve."""
  path = os.path.abspath(path)
  if os.path.isdir(path):
    hf_config = hugging_face.read_config(path)
    config = hugging_face.model_config(hf_config)
    params = hugging_face.params_of(Tensors(path), config, hugging_face.architecture(hf_config))
    tokenizer_path = os.path.join(path, TOKENIZER_FILE)
    tokenizer = None
    if os.path.isfile(tokenizer_path):
      read_json_object(tokenizer_path, 'a Hugging Face tokenizer')
      with open(tokenizer_path, encoding='utf-8') as file:
        tokenizer = file.read()
    extra = [os.path.join(path, name) for name in (INDEX_FILE, TOKENIZER_FILE)
             if os.path.isfile(os.path.join(path, name))]
    context = hf_config.get('max_position_embeddings') or hf_config.get('n_positions') or 0
    return Source(path=path, format='hugging_face', architecture=hugging_face.architecture(hf_config), config=config,
                  params=params, context_length=int(context), tokenizer_json=tokenizer, tokenizer_refused='',
                  files=describe_files(path, [os.path.join(path, hugging_face.CONFIG_FILE), *weight_files(path),
                                              *extra]))
  if path.endswith('.gguf') and os.path.isfile(path):
    from gguf import GGUFReader  # pylint: disable=g-import-not-at-top
    try:
      reader = GGUFReader(path)
    except Exception as error:  # pylint: disable=broad-except  (gguf raises ValueError, struct.error, ...)
      raise PretrainedError(f'--source: {path} cannot be read as GGUF ({" ".join(str(error).split())[:160]}); '
                            'valid: a complete llama.cpp GGUF file') from None
    config = gguf_file.model_config(reader)
    tokenizer, refused = None, ''
    if 'tokenizer.ggml.model' in reader.fields:
      try:
        tokenizer = gguf_file.tokenizer_json(reader)
      except PretrainedError as error:
        refused = str(error)
    return Source(path=path, format='gguf', architecture=gguf_file.architecture(reader), config=config,
                  params=gguf_file.params(gguf_file.tensor_reader(reader), config, gguf_file.architecture(reader),
                                          [tensor.name for tensor in reader.tensors]),
                  context_length=gguf_file.context_length(reader), tokenizer_json=tokenizer,
                  tokenizer_refused=refused, files=describe_files(os.path.dirname(path), [path]))
  raise PretrainedError(f'--source: got {path!r}; valid: a Hugging Face model folder (config.json and safetensors) '
                        'or a .gguf file')
