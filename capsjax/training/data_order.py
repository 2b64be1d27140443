"""Which examples a train step takes, and its augmentation key: the data order of a run, apart
from the step that trains on it.

Two orders (``config.data.order``):

* ``"permutation"`` (default): epoch ``e`` visits the train split in a permutation drawn from
  the run's data key and ``e``; step ``s`` takes the ``s mod steps_per_epoch``-th slice of
  ``batch_size`` (:mod:`capsjax.datasets.augment`). A dispatch of several steps
  (``train.steps_per_dispatch``) draws the permutations of the epochs it touches once
  (:meth:`TrainOrder.dispatch`) and takes the same slices from them.
* ``"stream"``: the official code's queue, a shuffle window over the examples in file order
  (:mod:`capsjax.datasets.stream_order`).

Every key is a function of the run's key and the step, so a resumed run takes the batches the
uninterrupted one would have: the data key is ``split(fold_in(rng, 0))[0]``, each step's
augmentation key ``fold_in(split(fold_in(rng, 0))[1], step)``. The dataset builder turns the
chosen examples into a batch (augmentation, synthetic data) inside the jitted step; the batch
is sharded over the mesh's ``data`` axis.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax.datasets import augment, stream_order

SETTINGS = stream_order.SETTINGS  # ``data.order`` and its window, declared there.


class TrainOrder:
  """The batches of a run's train steps over a train split of ``num_train`` examples.

  Pure: :meth:`batch` and :meth:`dispatch` are functions of the train state's ``step`` and
  ``rng`` (traced inside the jitted step)."""

  def __init__(self, task, num_train: int, mesh):
    self.task, self.num_train = task, num_train
    self.batch_size = task.config.train.batch_size
    self.steps_per_epoch = num_train // self.batch_size
    sharding = NamedSharding(mesh, P("data"))
    self.shard = lambda x: jax.lax.with_sharding_constraint(x, sharding)
    self.stream = task.config.data.order == "stream"
    if self.stream:  # The official code's order (capsjax/datasets/stream_order.py).
      self.copies = task.dataset.stream_copies()
      self.window = int(task.config.data.stream_window)

  @staticmethod
  def keys(rng: jax.Array) -> jax.Array:
    """The run's data key (epoch permutations, the stream's window) and augmentation key."""
    return jax.random.split(jax.random.fold_in(rng, 0))

  def dispatch(self, step: jax.Array, rng: jax.Array, num_steps: int) -> Any:
    """What a dispatch of ``num_steps`` steps from ``step`` draws once for all of them: the
    permutations of its first epoch and the next (a dispatch of at most an epoch's steps
    touches at most two), or None (one step, the stream, or a dispatch longer than an
    epoch: each step draws its own slice)."""
    if num_steps == 1 or num_steps > self.steps_per_epoch or self.stream:
      return None
    data_key, _ = self.keys(rng)
    first_epoch = step // self.steps_per_epoch
    return first_epoch, jnp.stack([augment.epoch_permutation(data_key, first_epoch + e,
                                                             self.num_train) for e in (0, 1)])

  def batch(self, step: jax.Array, rng: jax.Array, examples, shared,
            permutations: Any = None) -> dict:
    """Step ``step``'s batch, complete (``task.complete_batch``) and sharded over the mesh;
    ``permutations``: :meth:`dispatch`'s, the same indices drawn once per dispatch."""
    data_key, augment_key = self.keys(rng)
    key = jax.random.fold_in(augment_key, step)
    dataset = self.task.dataset
    if self.stream:
      positions = stream_order.batch_positions(data_key, step, self.batch_size, self.window)
      indices, which = stream_order.examples_and_copies(positions, self.num_train, self.copies)
      batch = dataset.train_stream_batch(key, self.shard(indices), self.shard(which),
                                         examples, shared)
    else:
      if permutations is None:
        indices = augment.epoch_batch_indices(data_key, step, self.num_train, self.batch_size)
      else:
        first_epoch, orders = permutations
        order = orders[step // self.steps_per_epoch - first_epoch]
        indices = augment.batch_from_permutation(order, step, self.batch_size)
      batch = dataset.train_batch(key, self.shard(indices), examples, shared)
    return jax.tree.map(self.shard, self.task.complete_batch(batch))
