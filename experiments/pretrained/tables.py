"""What every architecture's table is made of: a checkpoint is read, and written, by one table per architecture
(llama.py, gpt2.py, gpt_neox.py), a row per tensor of the checkpoint: its name there, the parameter path(s) it becomes
here, its shape by the config, and the transform each way. Import reads every row and refuses a tensor no row names;
export writes every row; so the two directions cannot disagree, and a round trip is the test.

The shared pieces: a Linear's weight (out x in) is this library's kernel transposed; Hugging Face rotates each head's
feature i with feature i + d/2 (rotate_half) while this library rotates features 2i and 2i + 1 (the RoFormer
paper's pairs) at the same frequency, so the rotated rows of the query and key projections are permuted per head
(rotary_order), which leaves every logit as it was.
"""

import dataclasses
import json
import math
import os
from typing import Callable, Iterable, Optional

import numpy as np

import transformer


class PretrainedError(ValueError):
  """A source this importer cannot read or serve, or a run no checkpoint format holds, named with what would be
  valid."""


Path = tuple  # a parameter's path in {'params': ...}: ('decoder', 'layer_0', 'self_attention', 'query', 'kernel')


@dataclasses.dataclass(frozen=True)
class Row:
  """One tensor of a checkpoint: name, the paths of the parameters it holds, its shape as the config gives it,
  to_ours(array) -> the parameters' arrays (one per path) and to_theirs(arrays) -> the tensor."""
  name: str
  paths: tuple
  shape: tuple
  to_ours: Callable[[np.ndarray], tuple]
  to_theirs: Callable[[tuple], np.ndarray]


def same(name: str, path: Path, shape: tuple) -> Row:
  """A tensor that is the parameter as it is (a norm's scale, a bias, an embedding table)."""
  return Row(name, (path,), tuple(shape), lambda array: (array,), lambda arrays: arrays[0])


def linear(name: str, path: Path, shape: tuple) -> Row:
  """A Linear's weight (out x in): the kernel (in x out) transposed."""
  return Row(name, (path,), tuple(shape), lambda array: (array.T,), lambda arrays: arrays[0].T)


def layer_norm(name: str, path: Path, width: int) -> list:
  """A LayerNorm's NAME.weight and NAME.bias: the scale and bias under path."""
  return [same(f'{name}.weight', (*path, 'scale'), (width,)), same(f'{name}.bias', (*path, 'bias'), (width,))]


def rotary_order(head_dim: int) -> np.ndarray:
  """The permutation of one head's features from Hugging Face's rotate_half layout to this library's pairs:
  feature 2i is Hugging Face's i, feature 2i + 1 its i + d/2."""
  half = head_dim // 2
  return np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)


def permute_heads(rows_NxI: np.ndarray, heads: int, order: np.ndarray) -> np.ndarray:
  """The output rows (heads x head width first) with each head's features taken in `order`."""
  return rows_NxI.reshape(heads, len(order), *rows_NxI.shape[1:])[:, order].reshape(rows_NxI.shape)


def rotary(name: str, path: Path, shape: tuple, heads: int, order: np.ndarray) -> Row:
  """A query or key projection's weight (out x in) or bias whose rows per head are in rotate_half's halves; ours
  are the kernel (or bias) with each head's features in `order` (rotary_order: this library's pairs)."""
  inverse = np.argsort(order)
  if len(shape) == 1:
    return Row(name, (path,), tuple(shape), lambda array: (permute_heads(array, heads, order),),
               lambda arrays: permute_heads(arrays[0], heads, inverse))
  return Row(name, (path,), tuple(shape), lambda array: (permute_heads(array, heads, order).T,),
             lambda arrays: permute_heads(arrays[0].T, heads, inverse))


def output_without_bias(name: str, shape: tuple) -> Row:
  """An untied output projection with no bias (GPT-2's lm_head, GPT-NeoX's embed_out) as this library's output
  under use_bias: the kernel, and a bias of zeros; an export refuses a bias that is not zero."""

  def to_theirs(arrays):
    if np.any(np.asarray(arrays[1])):
      raise PretrainedError(f'the output projection has a bias; valid for {name}: a bias of zeros (it has none)')
    return np.asarray(arrays[0]).T
  return Row(name, (('embedding', 'output', 'kernel'), ('embedding', 'output', 'bias')), tuple(shape),
             lambda array: (array.T, np.zeros(array.shape[0], np.float32)), to_theirs)


def _put(tree: dict, path: Path, value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: dict, path: Path):
  for key in path:
    tree = tree[key]
  return tree


def read_params(table: list, read: Callable[[str], np.ndarray], names: Iterable[str], where: str,
                buffers: Callable[[str], bool] = lambda name: False) -> dict:
  """{'params': ...} from the checkpoint's tensors, read(name) for each row; a tensor whose shape is not the row's
  is refused naming both, and so is every tensor of `names` that no row reads (a buffer transformers recomputes
  from the config, buffers(name), aside): nothing in a checkpoint is dropped silently. where: what gave the
  shapes (config.json, the GGUF file's metadata)."""
  names = set(names)
  missing = sorted(row.name for row in table if row.name not in names)
  if missing:
    raise PretrainedError(f'the checkpoint has no tensor {missing[0]!r} ({len(missing)} missing), which {where} '
                          'implies; valid: a checkpoint of the model its config describes')
  unread = sorted(name for name in names - {row.name for row in table} if not buffers(name))
  if unread:
    raise PretrainedError(f'the checkpoint holds {len(unread)} tensor(s) this import does not read '
                          f'({", ".join(unread[:3])}{", ..." if len(unread) > 3 else ""}), which {where} does not '
                          'describe; valid: only the tensors of the model it describes, so that none is dropped')
  tree = {}
  for row in table:
    array = read(row.name)
    if tuple(array.shape) != row.shape:
      raise PretrainedError(f'{row.name}: shape {tuple(array.shape)}; valid: {row.shape}, the shape {where} gives '
                            'it')
    for path, value in zip(row.paths, row.to_ours(array)):
      _put(tree, path, np.ascontiguousarray(value, np.float32))
  return {'params': tree}


def write_tensors(table: list, params: dict) -> dict:
  """{checkpoint name: float32 array} of {'params': ...}, each row's tensor from its parameters."""
  from flax.core import meta  # pylint: disable=g-import-not-at-top
  tree = meta.unbox(params)['params']
  return {row.name: np.ascontiguousarray(np.asarray(row.to_theirs(tuple(np.asarray(_get(tree, p)) for p in row.paths)),
                                                    np.float32))
          for row in table}


def layer_path(index: int, *rest) -> Path:
  return ('decoder', f'layer_{index}', *rest)


# Reading a config: a field missing, of the wrong type, NaN or out of range is refused by name, never a traceback.


def read_json_object(path: str, what: str) -> dict:
  """A JSON file that must hold an object; PretrainedError naming it otherwise."""
  try:
    with open(path, encoding='utf-8') as file:
      value = json.load(file)
  except (OSError, ValueError) as error:
    raise PretrainedError(f'{path}: does not read as JSON ({" ".join(str(error).split())[:100]}); valid: {what}, '
                          'a JSON object') from None
  if not isinstance(value, dict):
    raise PretrainedError(f'{path}: holds a JSON {type(value).__name__}; valid: {what}, a JSON object')
  return value


_MISSING = object()


def number(fields: dict, name: str, default=_MISSING, *, integer: bool = False, minimum: float = 0.0,
           above: bool = True, where: str = 'config.json'):
  """fields[name] as a finite number (an int with integer), above (or at least) minimum; default when absent or
  null (required when there is none)."""
  value = fields.get(name)
  if value is None:
    if default is _MISSING:
      raise PretrainedError(f'{where}: {name}: missing; valid: {"an integer" if integer else "a number"} '
                            f'{">" if above else ">="} {minimum:g}')
    return default
  kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
  if (isinstance(value, bool) or not kind_ok or not math.isfinite(value)
      or (value <= minimum if above else value < minimum)):
    raise PretrainedError(f'{where}: {name}: got {value!r}; valid: {"an integer" if integer else "a finite number"} '
                          f'{">" if above else ">="} {minimum:g}')
  return int(value) if integer else float(value)


def flag(fields: dict, name: str, default: bool, where: str = 'config.json') -> bool:
  value = fields.get(name, default)
  if value is None:
    return default
  if not isinstance(value, bool):
    raise PretrainedError(f'{where}: {name}: got {value!r}; valid: true or false')
  return value


def model_config(where: str = 'config.json', **fields) -> transformer.ModelConfig:
  """transformer.ModelConfig(**fields), the library's own refusal (heads that do not divide the width, ...) said
  as the source's."""
  try:
    return transformer.ModelConfig(**fields)
  except ValueError as error:
    raise PretrainedError(f'{where}: {" ".join(str(error).split())}') from None


def position_config(kind: str, where: str = 'config.json', **fields) -> transformer.PositionConfig:
  try:
    return transformer.PositionConfig(kind, **fields)
  except ValueError as error:
    raise PretrainedError(f'{where}: {" ".join(str(error).split())}') from None


def field_refused(where: str, name: str, value, valid: str) -> PretrainedError:
  return PretrainedError(f'{where}: {name}: got {value!r}; valid: {valid}')


def first_of(fields: dict, names: tuple, default: Optional[object] = None):
  """The value of the first of names that fields sets (not null)."""
  for name in names:
    if fields.get(name) is not None:
      return fields[name]
  return default


# The attention options a checkpoint of the plain blocks (Llama, GPT-2, GPT-NeoX) has no field for: an export of a
# run with any other value is refused, never written without them.
PLAIN_ATTENTION = dict(layer_types='full', local_position=None, qk_norm='none', sandwich_norm=False,
                       attention_sinks=False, attention_softcap=0.0, final_logit_softcap=0.0, query_scale=0.0,
                       logit_scale=1.0)

HF_LAYER_TYPES = {'full_attention': 'full', 'sliding_attention': 'sliding'}  # transformers 5's layer_types


def listed_layer_types(fields: dict, layers: int, where: str = 'config.json') -> Optional[list]:
  """transformers 5's layer_types as this library's kinds (full, sliding), one per layer; None when absent."""
  given = fields.get('layer_types')
  if given is None:
    return None
  if not isinstance(given, list) or len(given) != layers or any(kind not in HF_LAYER_TYPES for kind in given):
    raise PretrainedError(f'{where}: layer_types: got {given!r}; valid: {layers} entries (num_hidden_layers), each '
                          f'one of {", ".join(HF_LAYER_TYPES)}')
  return [HF_LAYER_TYPES[kind] for kind in given]


def every_nth_global(layers: int, period: int) -> list:
  """Layer kinds with every period-th layer full and the rest sliding (Gemma 3's sliding_window_pattern, Cohere 2's,
  OLMo 3's default of 4)."""
  return ['full' if (index + 1) % period == 0 else 'sliding' for index in range(layers)]


def layer_cycle(kinds: list) -> str:
  """model.layer_types for one kind per layer: the shortest cycle that repeats into the list ('full' for every layer
  full, 'sliding,full' for Gemma 2's alternation)."""
  period = next(length for length in range(1, len(kinds) + 1)
                if all(kind == kinds[index % length] for index, kind in enumerate(kinds)))
  return ','.join(kinds[:period])


def tied_output(read: Callable[[str], np.ndarray], names: Iterable[str], config: transformer.ModelConfig,
                embedding: str, output: str, where: str) -> str:
  """A tied model's checkpoint may still hold its output matrix (output): accepted, and returned as read, when it
  equals the embedding; refused when it differs (the config says tied, the file says otherwise, and the tools
  disagree about which wins). '' when there is nothing to account for."""
  if not config.tie_embeddings or output not in set(names):
    return ''
  if not np.array_equal(read(output), read(embedding)):
    raise PretrainedError(f'{where}: ties the output to the embedding, and the checkpoint\'s {output} differs from '
                          f'{embedding}; valid: tie_word_embeddings false (an untied output), or no {output}')
  return output
