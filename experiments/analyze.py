"""Look inside a trained run: where it attends, and what its positional encoding contributes.

  python -m experiments.analyze --workdir=runs/copy [--text="To be, or not to be"] [--length=16]

Writes WORKDIR/analysis/ (with --corpus=DIR, a corpus of the run's tokenizer to draw the input from,
WORKDIR/analysis-on-NAME-IDENTITY/):
  attention_maps.png    every layer's and head's self-attention weights for one input
  decomposition.png     absolute encodings (sinusoidal, learned): the first layer's logits split into
                        word-word, word-position, position-word and position-position terms, the
                        figure of Ke et al. (TUPE) that motivates untying (layer norm left out, as there)
  position_terms.png    the additive position term per head: TUPE's (LN(p_i)U^Q)(LN(p_j)U^K)^T, the
                        T5 bias or the ALiBi bias (variants that have one)
  sinusoidal_table.png  PE(pos, dim)
  sqrt_dk.png           why attention divides by sqrt(d_k): the spread of q.k and the saturation of the
                        softmax as d_k grows, with and without the scale
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

import transformer
from experiments.evaluation import long_context
from experiments.runs import checkpoints
from experiments.shared import cli
from experiments.shared.files import save_figure_atomically

_WORKDIR = flags.DEFINE_string('workdir', None, 'A training run directory (with config.json and checkpoints).')
_TEXT = flags.DEFINE_string('text', None, 'Input text (character-level language models).')
_CORPUS = flags.DEFINE_string('corpus', '', 'A language model of tokens: draw the input from this corpus (prepared '
                              'with the run\'s tokenizer) instead of its own; the figures go to analysis-on-CORPUS/.')
_LENGTH = flags.DEFINE_integer('length', None, 'Problem size of the sampled input (default: the training length).',
                                lower_bound=1)


def sqrt_dk_statistics(dims=(4, 16, 64, 256, 1024), keys: int = 64, samples: int = 256, seed: int = 0) -> dict:
  """For q, k with unit-variance entries: std of q.k (grows as sqrt(d_k) unscaled, stays 1 scaled) and
  the mean largest softmax weight over `keys` keys (near 1 = saturated, one-hot, vanishing gradients)."""
  rng = np.random.default_rng(seed)
  stats = {'dims': list(dims), 'std_unscaled': [], 'std_scaled': [], 'max_weight_unscaled': [], 'max_weight_scaled': []}
  for dim in dims:
    q = rng.standard_normal((samples, 1, dim)).astype(np.float32)
    k = rng.standard_normal((samples, keys, dim)).astype(np.float32)
    logits = np.einsum('sqd,skd->sqk', q, k)[:, 0]
    for name, scale in (('unscaled', 1.0), ('scaled', 1.0 / math.sqrt(dim))):
      stats[f'std_{name}'].append(float(np.std(logits * scale)))
      stats[f'max_weight_{name}'].append(float(np.mean(np.max(transformer.softmax(jnp.asarray(logits * scale)), -1))))
  return stats


def _input(task) -> dict:
  """One input: --text for a character-level language model, else a sampled one of --length."""
  if _TEXT.value is None:
    return task.batch(0, 0, 'test', 1, length=_LENGTH.value or task.settings.max_length)
  from experiments.data import shakespeare as data  # pylint: disable=g-import-not-at-top
  vocabulary = data.load('train')[1]
  unknown = sorted({c for c in _TEXT.value if c not in vocabulary})
  if unknown or not _TEXT.value:
    raise ValueError(f'--text: got {_TEXT.value!r}; valid: a non-empty text of characters in the vocabulary'
                     f'{f" (not: {unknown})" if unknown else ""}')
  ids = np.asarray([[task.bos] + [vocabulary.index(c) for c in _TEXT.value]], np.int32)  # as in training
  return dict(inputs=ids, valid=np.ones_like(ids, bool))


def _decoder_params(params, kind):
  return params['decoder'] if kind != 'encoder_only' else params['encoder']


def _restore():
  """The run's model config, task, input batch, parameters and the note on its attention core; refuses
  a run without attention and an input its position table cannot hold."""
  config, task = checkpoints.run_model(_WORKDIR.value, os.path.abspath(_CORPUS.value) if _CORPUS.value else '')
  if config.architecture != 'transformer':
    raise ValueError(f'--workdir: a {config.architecture} run has no attention to look inside; valid: a '
                     f'transformer run')
  if _TEXT.value is not None and task.settings.name != 'shakespeare':
    raise ValueError(f'--text: a {task.settings.name} run; valid: --text with a character-level language model '
                     f'run (shakespeare), --length otherwise')
  length = len(_TEXT.value) + 1 if _TEXT.value is not None else task.sequence_length(
      _LENGTH.value or task.settings.max_length)
  rows = config.position.settings.longest_sequence()
  if rows is not None and length > rows:
    flag = 'text' if _TEXT.value is not None else 'length'
    raise ValueError(f'--{flag}: a sequence of {length}, beyond the {rows} positions of the {config.position.kind} '
                     f'table; valid: at most {rows}')
  batch = _input(task)
  config, note = checkpoints.core_for(config, weights=True)
  params = checkpoints.restore_params(_WORKDIR.value, checkpoints.newest_intact_step(_WORKDIR.value))
  return config, task, batch, params, note


def main(argv):
  del argv
  if not _WORKDIR.value:
    cli.fail('--workdir: missing; valid: a training run directory')
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  try:
    config, task, batch, params, note = _restore()
  except (OSError, KeyError, ValueError) as error:
    cli.fail(str(error))
  if note:
    print(note)
  output = os.path.join(_WORKDIR.value, f'analysis-on-{long_context.corpus_name(task)}' if _CORPUS.value else 'analysis')
  os.makedirs(output, exist_ok=True)
  kind = task.settings.model_kind
  figures = [_attention_maps(config, task, kind, batch, params, plt)]
  figures += _position_terms(config, kind, batch['inputs'].shape[1], params, plt)
  if config.position.kind in ('sinusoidal', 'learned') and kind == 'decoder_only':
    figures.append(('decomposition.png', _decomposition(config, kind, batch, params, plt)))
  figures.append(('sinusoidal_table.png', _sinusoidal_table(config, batch['inputs'].shape[1], plt)))
  figures.append(('sqrt_dk.png', _sqrt_dk(plt)))
  print('\n'.join(_save(figure, output, name, plt) for name, figure in figures))


def _attention_maps(config, task, kind, batch, params, plt):
  """Every layer's and head's self-attention weights for the first input, sown by the layers."""
  model = transformer.build_model(config, kind)
  args, kwargs = task.model_inputs(batch)
  _, state = model.apply({'params': params}, *args, mutable=['intermediates'], **kwargs)
  stack = state['intermediates']['decoder' if kind != 'encoder_only' else 'encoder']
  maps = [np.asarray(stack[f'layer_{i}']['self_attention']['attention_weights'][0][0])
          for i in range(len([k for k in stack if k.startswith('layer_')]))]
  figure, axes = plt.subplots(len(maps), config.num_heads, figsize=(2.6 * config.num_heads, 2.6 * len(maps)),
                              squeeze=False)
  for layer, weights in enumerate(maps):
    for head in range(config.num_heads):
      axes[layer, head].imshow(weights[head], cmap='viridis', vmin=0, vmax=1)
      axes[layer, head].set_title(f'layer {layer} head {head}', fontsize=8)
      axes[layer, head].set_xticks([])
      axes[layer, head].set_yticks([])
  figure.suptitle(f'self-attention weights ({config.position.kind}); rows: queries, columns: keys')
  return 'attention_maps.png', figure


def _position_terms(config, kind, length, params, plt):
  """(name, figure) per additive position term of the stack's shared hooks: one per kind of a pattern."""
  positions = jnp.arange(length)[None]
  position_params = _decoder_params(params, kind).get('position')
  hooks = config.position.variant.stack(settings=config.position.settings, num_heads=config.num_heads,
                                        head_dim=config.head_dim, model_dim=config.model_dim, num_layers=1,
                                        causal=kind != 'encoder_only')
  shared = hooks.apply({'params': position_params or {}}, positions, positions, method='shared')
  terms = {}  # label -> the sum of the B x H x Lq x Lk terms added to the logits
  for path, term in jax.tree_util.tree_flatten_with_path(shared)[0]:
    if np.ndim(term) == 4:
      terms[_term_label(path)] = terms.get(_term_label(path), 0) + np.asarray(term)[0]
  figures = []
  for label, total in terms.items():
    figure, axes = plt.subplots(1, total.shape[0], figsize=(3 * total.shape[0], 3), squeeze=False)
    for head in range(total.shape[0]):
      image = axes[0, head].imshow(total[head], cmap='coolwarm')
      axes[0, head].set_title(f'head {head}', fontsize=8)
      figure.colorbar(image, ax=axes[0, head], fraction=0.046)
    figure.suptitle(f'{config.position.kind}{label}: position term added to the logits (query i, key j)')
    figures.append((f'position_terms{label.replace(" ", "_")}.png', figure))
  return figures


def _decomposition(config, kind, batch, params, plt):
  """The first layer's logits of x_i = w_i + p_i split into its four terms (Ke et al.'s figure)."""
  length = batch['inputs'].shape[1]
  words = params['embedding']['embedding']['embedding'][batch['inputs'][0]] * math.sqrt(config.model_dim)
  if config.position.kind == 'sinusoidal':
    absolute = transformer.positions.sinusoidal_table(length, config.model_dim)
  else:
    absolute = _decoder_params(params, kind)['position']['table'][:length]
  attention = _decoder_params(params, kind)['layer_0']['self_attention']
  wq, wk = attention['query']['kernel'], attention['key']['kernel']
  parts = {'word-word': (words, words), 'word-position': (words, absolute),
           'position-word': (absolute, words), 'position-position': (absolute, absolute)}
  figure, axes = plt.subplots(1, 4, figsize=(13, 3.4))
  for axis, (name, (left, right)) in zip(axes, parts.items()):
    term = (left @ wq) @ (right @ wk).T / math.sqrt(config.head_dim * config.num_heads)
    image = axis.imshow(np.asarray(term), cmap='coolwarm')
    axis.set_title(name)
    figure.colorbar(image, ax=axis, fraction=0.046)
  figure.suptitle('first layer logits (x_i = w_i + p_i), the four terms, all heads together')
  return figure


def _sinusoidal_table(config, length, plt):
  table = transformer.positions.sinusoidal_table(max(length, 64), config.model_dim)
  figure, axis = plt.subplots(figsize=(6, 4))
  image = axis.imshow(np.asarray(table).T, aspect='auto', cmap='RdBu')
  axis.set_xlabel('position')
  axis.set_ylabel('dimension')
  figure.colorbar(image, ax=axis)
  axis.set_title('sinusoidal encoding PE(pos, dim)')
  return figure


def _sqrt_dk(plt):
  stats = sqrt_dk_statistics()
  figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
  for name, style in (('unscaled', 'o-'), ('scaled', 's-')):
    label = 'q.k' if name == 'unscaled' else 'q.k / sqrt(d_k)'
    left.plot(stats['dims'], stats[f'std_{name}'], style, label=label)
    right.plot(stats['dims'], stats[f'max_weight_{name}'], style, label=label)
  left.set(xscale='log', yscale='log', xlabel='d_k', ylabel='std of the logits', title='spread of q.k')
  right.set(xscale='log', xlabel='d_k', ylabel='mean largest softmax weight (64 keys)',
            title='softmax saturation')
  for axis in (left, right):
    axis.legend()
    axis.grid(alpha=0.3)
  return figure


def _term_label(path) -> str:
  """' kind' for a term of a pattern's kind, '' for the variant's own term."""
  keys = [str(getattr(entry, 'key', getattr(entry, 'idx', ''))) for entry in path]
  return ''.join(f' {key}' for key in keys if key and not key.isdigit())


def _save(figure, output, name, plt):
  path = os.path.join(output, name)
  figure.tight_layout()
  save_figure_atomically(figure, path, dpi=110)
  plt.close(figure)
  return path


if __name__ == '__main__':
  cli.run(main)
