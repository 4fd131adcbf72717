"""Seeds in one program: the replicas of one configuration, trained side by side.

Replica i is the run with seed s + i (its own initialisation, dropout stream and data order, exactly
as if trained alone); its state and batch are stacked along a leading replica axis and the train and
eval steps are vectorised over it with `jax.vmap`, so N small models fill the machine that one leaves
idle. Each replica keeps its own workdir, config.json, metrics, checkpoints and summary: every tool
reads it as the run of its seed. One replica is the plain, unvectorised step (no replica axis).
"""

import functools
from typing import Callable, Sequence

import jax
import numpy as np


class Replicas:
  """The seeds trained in one program, and how their trees are joined, split and stepped."""

  def __init__(self, seeds: Sequence[int]):
    self.seeds = [int(seed) for seed in seeds]
    if not self.seeds:
      raise ValueError('seeds: got none; valid: at least one seed')
    self.count = len(self.seeds)
    self.vectorized = self.count > 1
    self.batch_axis = 1 if self.vectorized else 0  # the axis a global batch is split along across devices

  def join(self, trees: Sequence):
    """Per-replica trees -> one tree with a leading replica axis (one replica: the tree itself)."""
    if not self.vectorized:
      return trees[0]
    # The first tree's structure: train states built apart carry equal but distinct optimiser objects.
    leaves, structure = jax.tree_util.tree_flatten(trees[0])
    columns = zip(leaves, *(jax.tree_util.tree_leaves(tree) for tree in trees[1:]))
    return jax.tree_util.tree_unflatten(structure, [np.stack([np.asarray(l) for l in column]) for column in columns])

  def split(self, tree) -> list:
    """join's inverse, on host (numpy) trees."""
    if not self.vectorized:
      return [tree]
    return [jax.tree_util.tree_map(lambda leaf, i=i: leaf[i], tree) for i in range(self.count)]

  def join_shapes(self, shapes):
    """join's result for trees of these shapes (jax.ShapeDtypeStruct leaves)."""
    if not self.vectorized:
      return shapes
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((len(self.seeds), *x.shape), x.dtype), shapes)

  def seed_argument(self) -> np.ndarray:
    """The train step's seed argument: a scalar, or one seed per replica."""
    return np.asarray(self.seeds if self.vectorized else self.seeds[0], np.uint32)  # seed + 1 <= 2^31 fits

  def train_step(self, step_fn: Callable) -> Callable:
    """step_fn(state, batch, seed, axis_name=...) vectorised over the replica axis of all three."""
    if not self.vectorized:
      return step_fn

    def stepped(state, batch, seed, axis_name=None):
      return jax.vmap(functools.partial(step_fn, axis_name=axis_name))(state, batch, seed)
    return stepped

  def eval_step(self, eval_fn: Callable) -> Callable:
    """eval_fn(params, batch, axis_name=...) vectorised over the replica axis of both."""
    if not self.vectorized:
      return eval_fn

    def evaluated(params, batch, axis_name=None):
      return jax.vmap(functools.partial(eval_fn, axis_name=axis_name))(params, batch)
    return evaluated
