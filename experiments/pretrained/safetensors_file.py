"""A folder's safetensors files (model.safetensors, or the shards model.safetensors.index.json names) read tensor by
tensor as float32 NumPy arrays, without PyTorch: safetensors' NumPy API, and bfloat16 (which NumPy lacks) from the
file's own bytes through ml_dtypes. Every header is checked before a byte of data is read: its length within the
file, a JSON object, each tensor's dtype known and its shape's bytes equal to its data offsets, its data within
the file; anything else is refused by name."""

import json
import math
import os

import ml_dtypes
import numpy as np

from experiments.pretrained.tables import PretrainedError, read_json_object

WEIGHTS_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'
DTYPE_BYTES = {'F64': 8, 'F32': 4, 'F16': 2, 'BF16': 2, 'I64': 8, 'I32': 4, 'I16': 2, 'I8': 1, 'U8': 1, 'BOOL': 1}


def weight_files(folder: str) -> list:
  """The folder's safetensors files: model.safetensors, or the shards its index names."""
  single, index = os.path.join(folder, WEIGHTS_FILE), os.path.join(folder, INDEX_FILE)
  if os.path.isfile(single):
    return [single]
  if os.path.isfile(index):
    weight_map = read_json_object(index, 'a safetensors index').get('weight_map')
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
      raise PretrainedError(f'{index}: weight_map: got {type(weight_map).__name__}; valid: an object of tensor name '
                            '-> shard file')
    shards = sorted(set(weight_map.values()))
    for shard in shards:
      if os.path.isabs(shard) or os.path.normpath(shard).startswith('..'):
        raise PretrainedError(f'{index}: weight_map names {shard!r}; valid: files inside {folder}')
    return [os.path.join(folder, shard) for shard in shards]
  raise PretrainedError(f'--source: {folder} has neither {WEIGHTS_FILE} nor {INDEX_FILE}; valid: a Hugging Face model '
                        'folder of safetensors')


def _header(path: str) -> tuple[dict, int]:
  """A safetensors file's tensors (name: dtype, shape, data_offsets) and where its data start, each checked."""
  size = os.path.getsize(path)

  def refuse(what):
    return PretrainedError(f'{path}: {what}; valid: a complete safetensors file')
  with open(path, 'rb') as file:
    length = int.from_bytes(file.read(8), 'little')
    if size < 8 or length > size - 8:
      raise refuse(f'its header claims {length} bytes, and the file has {max(size - 8, 0)} after the length')
    try:
      header = json.loads(file.read(length))
    except (ValueError, UnicodeDecodeError) as error:
      raise refuse(f'its header does not read as JSON ({" ".join(str(error).split())[:100]})') from None
  if not isinstance(header, dict):
    raise refuse(f'its header is a JSON {type(header).__name__}, not an object')
  entries = {}
  for name, entry in header.items():
    if name == '__metadata__':
      continue
    try:
      dtype, shape, (begin, end) = entry['dtype'], [int(n) for n in entry['shape']], entry['data_offsets']
    except (TypeError, KeyError, ValueError):
      raise refuse(f'its header\'s entry for {name!r} is not dtype, shape and data_offsets') from None
    if dtype not in DTYPE_BYTES:
      raise refuse(f'{name}: dtype {dtype!r}; valid: {", ".join(DTYPE_BYTES)}')
    if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end) or min(shape, default=0) < 0:
      raise refuse(f'{name}: data_offsets {[begin, end]} with shape {shape}')
    if end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
      raise refuse(f'{name}: shape {shape} of {dtype} is {math.prod(shape) * DTYPE_BYTES[dtype]} bytes, and its '
                   f'data_offsets span {end - begin}')
    if 8 + length + end > size:
      raise refuse(f'truncated ({size} bytes; {name} ends at byte {8 + length + end})')
    entries[name] = dict(dtype=dtype, shape=shape, data_offsets=[begin, end])
  return entries, 8 + length


class Tensors:
  """The tensors of a folder's safetensors files, each read when asked for, as float32 NumPy arrays."""

  def __init__(self, folder: str):
    self.where = {}
    for path in weight_files(folder):
      if not os.path.isfile(path):
        raise PretrainedError(f'--source: {path} is missing (the index names it); valid: a complete folder')
      entries, start = _header(path)
      for name, entry in entries.items():
        if name in self.where:
          raise PretrainedError(f'{name}: in both {self.where[name][0]} and {path}; valid: each tensor in one file')
        self.where[name] = (path, start, entry)

  def names(self) -> list:
    return sorted(self.where)

  def stored_dtype(self, name: str) -> str:
    """The tensor's dtype in the file ('F32', 'F16', 'BF16', ...)."""
    return self.where[name][2]['dtype']

  def __call__(self, name: str) -> np.ndarray:
    if name not in self.where:
      raise PretrainedError(f'the checkpoint has no tensor {name!r}; it has {len(self.where)} others')
    path, start, entry = self.where[name]
    if entry['dtype'] == 'BF16':
      begin, end = entry['data_offsets']
      raw = np.fromfile(path, dtype=np.uint16, count=(end - begin) // 2, offset=start + begin)
      return raw.view(ml_dtypes.bfloat16).reshape(entry['shape']).astype(np.float32)
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    with safe_open(path, framework='np') as file:
      return np.asarray(file.get_tensor(name), dtype=np.float32)
