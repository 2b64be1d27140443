"""The train step, in one place: which examples it takes, the forward pass, the loss, its
gradient, the update and the metrics; for one run, or several mapped over a leading run axis.

* **The state** (:class:`TrainState`): parameters, optimiser state, RNG and the model's other
  variables (BatchNorm's running statistics; ``{}`` for stateless models), replicated over the
  setup's 1-D mesh (axis ``data``).
* **The batch** (:class:`TrainOrder`): step ``s`` of epoch ``e`` takes the ``s mod
  steps_per_epoch``-th slice of ``batch_size`` of a permutation drawn from the run's data key and
  ``e`` (``config.data.order="permutation"``), or the official code's stream of shifted copies
  through a shuffle window (``"stream"``: :mod:`capsjax.datasets.stream_order`). Every key is a
  function of the run's key and the step, so a resumed run takes the batches the uninterrupted
  one would have: the data key is ``split(fold_in(rng, 0))[0]``, each step's augmentation key
  ``fold_in(split(fold_in(rng, 0))[1], step)``. The dataset builder turns the chosen examples
  into a batch (augmentation, synthetic data) inside the jitted step; the batch is sharded over
  the mesh, so XLA adds the gradient all-reduce, and a BatchNorm's statistics are the global
  batch's (synchronised BatchNorm).
* **The step** (:func:`train_steps`): the model's forward pass
  (:func:`capsjax.training.tasks.forward`: apply, loss, metrics), its gradient, the optimiser's
  update; ``num_steps`` of them per dispatch through ``lax.scan``.
* **One run or several** (:class:`Step`): the same step, jitted for one run or mapped by
  ``jax.vmap`` over the runs of one program, its memory checked first
  (:mod:`capsjax.training.memory`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax.config import run_settings
from capsjax.config import per_run
from capsjax.datasets import augment, stream_order
from capsjax.training import memory
from capsjax.training import tasks
from capsjax.training.tasks import Task

# The run's seed, and the order of its training examples.
SETTINGS = {**run_settings.SEED, **run_settings.DATA_ORDER}


@struct.dataclass
class TrainState:
  step: jax.Array        # int32 scalar: optimisation steps taken.
  params: Any            # Pure dict of arrays (nnx.split -> to_pure_dict).
  opt_state: Any
  rng: jax.Array         # uint32[2] raw key; per-step keys are fold_in(rng, step).
  # The model's other variables (BatchNorm statistics), a pure dict; {} for stateless models.
  # Last and defaulted: checkpoints written before it existed restore with {}.
  model_state: Any = struct.field(default_factory=dict)

  @property
  def variables(self) -> dict:
    """Parameters and model state in one pure dict: what ``nnx.merge(graphdef, .)`` takes to
    rebuild the model for evaluation (every evaluator, ``evaluate``, ensembles, figures)."""
    return merge_variables(self.params, self.model_state)


def merge_variables(params: dict, model_state: dict) -> dict:
  """The nested dicts ``params`` and ``model_state`` as one (their leaves never collide)."""
  merged = dict(params)
  for key, value in model_state.items():
    merged[key] = (merge_variables(merged[key], value)
                   if isinstance(value, dict) and key in merged else value)
  return merged


def init_state(task: Task, tx: optax.GradientTransformation) -> TrainState:
  """Fresh parameters, model state and optimiser state from ``config.seed``."""
  init_key, rng = jax.random.split(jax.random.PRNGKey(task.config.seed))
  params, model_state = task.init_variables(init_key)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    rng=rng, model_state=model_state)


def abstract_state(task: Task, tx: optax.GradientTransformation,
                   sharding: NamedSharding) -> TrainState:
  """Shapes, dtypes and placement of the train state, without allocating it (restores)."""
  abstract = jax.eval_shape(lambda: init_state(task, tx))
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


class TrainOrder:
  """The batches of a run's train steps over ``num_train`` examples: :meth:`batch` and
  :meth:`dispatch` are pure functions of the state's ``step`` and ``rng`` (traced in the step)."""

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


def make_train_step(task: Task, tx: optax.GradientTransformation, num_train: int,
                    mesh) -> Callable:
  """One run's step: ``fn(state, examples, shared, num_steps) -> (state, metrics)``, jitted
  (:func:`train_steps`, ``num_steps`` static, the state donated), as the benchmark and the
  experiments time it."""
  return jax.jit(train_steps(task, tx, num_train, mesh), static_argnums=3, donate_argnums=0)


def train_steps(task: Task, tx: optax.GradientTransformation, num_train: int,
                mesh) -> Callable:
  """``fn(state, examples, shared, num_steps, numbers=None) -> (state, metrics)``, a pure
  function (not jitted: :class:`Step` maps it over runs or not, and jits it). ``numbers``: one
  run's per-run numbers in a vectorised program, an instance of the model's ``per_run_numbers``
  (:mod:`capsjax.config.per_run`) handed to its loss; None: the config's. The optimiser's per-run
  numbers (the peak learning rate) are in ``state``'s optimiser state.

  ``num_steps`` (static) train steps run in one dispatch, through ``lax.scan`` when more than
  one; each metric comes back with a leading axis of that length, and the result equals that
  many single steps. The metrics are the batch means of the model's loss, its parts and its
  metrics, computed with the parameters before the step's update; the model state becomes what
  the training forward pass wrote (BatchNorm: running statistics of the global batch).
  """
  order = TrainOrder(task, num_train, mesh)

  def loss_fn(params, model_state, batch, rng, step, numbers):
    result = tasks.forward(task.graphdef, merge_variables(params, model_state), batch,
                           train=True, rng=rng, step=step, numbers=numbers)
    metrics = {k: jnp.mean(v.astype(jnp.float32), axis=0)
               for k, v in result.per_example().items()}
    return metrics["loss"], (metrics, result.model_state)

  def one_step(state: TrainState, examples, shared, numbers, permutations=None):
    batch = order.batch(state.step, state.rng, examples, shared, permutations)
    noise_key = jax.random.fold_in(jax.random.fold_in(state.rng, 1), state.step)
    grads, (metrics, model_state) = jax.grad(
        lambda p, m: loss_fn(p, m, batch, noise_key, state.step, numbers), has_aux=True)(
            state.params, state.model_state)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         model_state=model_state), metrics

  def train_step(state, examples, shared, num_steps: int, numbers=None):
    if num_steps == 1:
      state, metrics = one_step(state, examples, shared, numbers)
      return state, jax.tree.map(lambda m: m[None], metrics)
    permutations = order.dispatch(state.step, state.rng, num_steps)
    return jax.lax.scan(lambda s, _: one_step(s, examples, shared, numbers, permutations),
                        state, None, length=num_steps)

  return train_step


class Step:
  """The train step of a setup for one run or for several as one program:
  ``step(states, numbers, examples, shared, num_steps) -> (states, metrics)``.

  ``vectorised=False``: one run's state, its per-run numbers compiled in (``numbers`` None).
  ``vectorised=True``: the runs' states stacked along a leading run axis and ``numbers`` the model's
  ``per_run_numbers`` with ``(runs,)`` fields (:meth:`values`, :mod:`capsjax.config.per_run`), the
  same step mapped over the runs by ``jax.vmap``; metrics come back ``(runs, num_steps)``. Either
  way the training data are shared, and a run's results equal those of the run alone to float32
  rounding. Compiled once per number of runs and ``num_steps``, its memory checked before it first
  runs (:class:`capsjax.training.memory.OutOfMemory`). The training loop (:mod:`capsjax.train`)
  stacks, reads and drops runs through the methods below, the same for one run as for several.
  """

  def __init__(self, setup, vectorised: bool = False,
               memory_limit: Callable[[], int | None] | None = None):
    self.vectorised = vectorised
    self.numbers_class = getattr(setup.task.model_class, "per_run_numbers", None)
    self.sharding = NamedSharding(setup.mesh, P())
    body = train_steps(setup.task, setup.optimizer.tx, setup.budget.num_train, setup.mesh)

    def step(states, numbers, examples, shared, num_steps):
      if not vectorised:
        return body(states, examples, shared, num_steps, numbers)
      one_run = lambda state, run_numbers: body(state, examples, shared, num_steps,
                                                run_numbers)
      return jax.vmap(one_run)(states, numbers)

    jitted = jax.jit(step, static_argnums=4, donate_argnums=0)
    what = "The runs' vectorised train step" if vectorised else "The train step"
    self._new = lambda: memory.CompiledSteps(jitted, setup.config, what, memory_limit)
    self._compiled: dict[int, memory.CompiledSteps] = {}  # By the number of runs.

  def _for(self, states) -> memory.CompiledSteps:
    runs = states.step.shape[0] if self.vectorised else 1
    if runs not in self._compiled:
      self._compiled[runs] = self._new()
    return self._compiled[runs]

  def __call__(self, states, numbers, examples, shared, num_steps: int):
    return self._for(states)(states, numbers, examples, shared, num_steps)

  def prepare(self, states, numbers, examples, shared, num_steps: int):
    """The program for these runs and ``num_steps``, compiled and its memory checked."""
    return self._for(states).prepare(states, numbers, examples, shared, num_steps)

  def stack(self, states: Sequence):
    """The runs' train states as the step takes them: stacked, replicated (one: itself)."""
    if not self.vectorised:
      (state,) = states
      return state
    return stack(states, self.sharding)

  def values(self, configs):
    """The runs' per-run numbers of the model, stacked and replicated (one run: None, its
    config's are compiled in); the optimiser's are in the runs' states."""
    if not self.vectorised:
      return None
    return jax.device_put(per_run.stacked(self.numbers_class, configs), self.sharding)

  def unstack(self, metrics, runs: int) -> tuple:
    """Each run's metrics."""
    return unstack(metrics, runs) if self.vectorised else (metrics,)

  def state_of(self, states, k: int):
    """Run ``k``'s train state."""
    return jax.tree.map(lambda x: x[k], states) if self.vectorised else states

  def take(self, tree, keep: Sequence[int]):
    """The runs ``keep`` of a stacked tree, replicated."""
    if not self.vectorised:
      raise ValueError("One run has no others to drop.")
    return jax.device_put(take(tree, keep), self.sharding)


def stack(trees: Sequence, sharding: NamedSharding):
  """The trees (e.g. train states) stacked along a new leading run axis, placed by ``sharding``."""
  return jax.jit(lambda *ts: jax.tree.map(lambda *xs: jnp.stack(xs), *ts),
                 out_shardings=sharding)(*trees)


@functools.lru_cache(maxsize=None)
def _unstacker(runs: int):
  return jax.jit(lambda tree: tuple(jax.tree.map(lambda x: x[i], tree) for i in range(runs)))


def unstack(tree, runs: int) -> tuple:
  """The ``runs`` slices of a stacked tree (one dispatch)."""
  return _unstacker(runs)(tree)


def take(tree, indices: Sequence[int]):
  """The runs ``indices`` of a stacked tree, still stacked."""
  index = jnp.asarray(np.asarray(indices, np.int32))
  return jax.tree.map(lambda x: x[index], tree)
