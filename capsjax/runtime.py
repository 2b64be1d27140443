"""One set-up path for every command, the placement of data on the devices, and the
evaluation runner.

``train``, ``evaluate``, ``ensemble`` and ``benchmark`` all start the same way::

    runtime = Runtime(config)          # checks the config, builds the task and the mesh
    runtime.load()                     # the dataset's host splits and the run's Plan
    state = runtime.fresh_state()      # or: step, state, meta = runtime.restore(checkpointer)
    evals = runtime.evaluations()      # config.evals on the devices

The mesh is 1-D over every device of the job (axis ``data``): batches are sharded,
parameters, optimiser state and the datasets replicated. :class:`Runner` evaluates a model on
an :class:`EvalSet` in jitted, data-parallel batches.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax import datasets, evaluators, optimizers, plan, reporting, train_step
from capsjax.errors import UsageError
from capsjax.tasks import Task


def make_mesh() -> jax.sharding.Mesh:
  """A 1-D mesh over every device of the job, axis ``data``."""
  return jax.make_mesh((jax.device_count(),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))


class Runtime:
  """A config made runnable: its task, mesh, data, plan and optimiser, built once.

  Attributes:
    config, task, mesh, replicated (the sharding of replicated arrays);
    splits: the host splits after :meth:`load` (else None);
    plan: the run's :class:`capsjax.plan.Plan` after :meth:`load` (else None).
  """

  def __init__(self, config: ml_collections.ConfigDict):
    """Raises UsageError, naming the key, for a config that cannot run here."""
    plan.validate_train_config(config, jax.device_count())
    self.config = config
    self.task = Task.from_config(config)
    self.mesh = make_mesh()
    self.replicated = NamedSharding(self.mesh, P())
    self.splits: dict[str, datasets.Split] | None = None
    self.plan: plan.Plan | None = None
    self._optimizer: optimizers.Optimizer | None = None
    self._runner: Runner | None = None

  def load(self, splits: dict[str, datasets.Split] | None = None) -> "Runtime":
    """Reads the dataset's splits (or takes ``splits``) and plans the run's steps."""
    self.splits = self.task.dataset.load() if splits is None else splits
    self.plan = plan.Plan.from_config(self.config.train, len(self.splits["train"]))
    self._optimizer = None  # Epoch-based settings need the plan.
    return self

  @property
  def optimizer(self) -> optimizers.Optimizer:
    """The optimiser of ``config.optimizer`` (after :meth:`load`, epochs become steps)."""
    if self._optimizer is None:
      p = self.plan
      self._optimizer = optimizers.build(self.config.optimizer,
                                         p.steps_per_epoch if p else None,
                                         p.num_steps if p else None)
    return self._optimizer

  def fresh_state(self) -> train_step.TrainState:
    """Parameters and optimiser state from ``config.seed``, replicated on the mesh."""
    tx = self.optimizer.tx
    return jax.jit(lambda: train_step.init_state(self.task, tx),
                   out_shardings=self.replicated)()

  def abstract_state(self) -> train_step.TrainState:
    return train_step.abstract_state(self.task, self.optimizer.tx, self.replicated)

  def restore(self, checkpointer, steps: list[int] | None = None, move_aside: bool = False,
              log: Callable[[str], None] = reporting.log):
    """``(step, state, meta)`` of the newest checkpoint that restores (or the first of
    ``steps``), or None when there is none; see
    :meth:`capsjax.checkpointing.Checkpointer.restore_newest`."""
    abstract = self.abstract_state()
    return checkpointer.restore_newest(abstract, log=log, move_aside=move_aside, steps=steps,
                                       older_forms=train_step.older_forms(abstract))

  def make_train_step(self) -> Callable:
    """The jitted train step over the loaded train split."""
    return train_step.make_train_step(self.task, self.optimizer.tx, self.plan.num_train,
                                      self.mesh)

  @property
  def runner(self) -> "Runner":
    if self._runner is None:
      self._runner = Runner(self.task.graphdef(), self.mesh, self.config.eval.batch_size)
    return self._runner

  def evaluations(self, log: Callable[[str], None] = reporting.log) -> dict:
    """The evaluators of ``config.evals`` on the loaded splits (plus ``validation`` when the
    data hold one out), by name."""
    return evaluators.build_all(self.config, self.task.dataset, self.splits, self.runner,
                                log=log)

  def on_devices(self, split: datasets.Split) -> tuple[dict, dict]:
    """A split's ``examples`` and ``shared`` arrays, replicated on the mesh."""
    return put_on_devices(split, self.replicated)


# --- Data on the devices --------------------------------------------------------------------

def replicated_array(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array replicated on every device of the mesh, from host data that every
  process holds (works across hosts, unlike a plain device_put)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def put_on_devices(split: datasets.Split,
                   sharding: NamedSharding) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
  """A split's ``examples`` and ``shared`` arrays, replicated on the devices."""
  return ({k: replicated_array(v, sharding) for k, v in split.examples.items()},
          {k: replicated_array(v, sharding) for k, v in split.shared.items()})


# --- The evaluation runner ------------------------------------------------------------------

class EvalSet:
  """A split on the devices, padded to whole eval batches (padding has weight 0), and the
  function that turns a slice of its examples into a model batch."""

  def __init__(self, split: datasets.Split, make_batch: Callable, batch_size: int,
               sharding: NamedSharding):
    self.size = len(split)
    self.num_batches = -(-max(self.size, 1) // batch_size)
    padded = self.num_batches * batch_size
    pad = lambda a: np.concatenate([a, np.zeros((padded - len(a), *a.shape[1:]), a.dtype)])
    self.examples, self.shared = put_on_devices(
        datasets.Split({k: pad(v) for k, v in split.examples.items()}, split.shared), sharding)
    self.weights = replicated_array(pad(np.ones(self.size, np.float32)), sharding)
    self.make_batch = make_batch
    self.batch_size = batch_size
    self.host = split


class Runner:
  """Evaluates a model on :class:`EvalSet`s: jitted per batch, data parallel over the mesh."""

  def __init__(self, graphdef, mesh, batch_size: int):
    self.graphdef, self.mesh, self.batch_size = graphdef, mesh, batch_size
    self.replicated = NamedSharding(mesh, P())
    self._steps: dict = {}

  def eval_set(self, split: datasets.Split, make_batch: Callable) -> EvalSet:
    return EvalSet(split, make_batch, self.batch_size, self.replicated)

  def _step(self, kind: str, make_batch: Callable) -> Callable:
    if (kind, make_batch) not in self._steps:
      make = {"metrics": make_eval_step, "scores": make_scores_step}[kind]
      self._steps[kind, make_batch] = make(self.graphdef, self.mesh, self.batch_size,
                                           make_batch)
    return self._steps[kind, make_batch]

  def evaluate(self, params, eval_set: EvalSet) -> dict:
    """Means over the set of the model's loss, its parts and its metrics; ``error`` is
    ``1 - accuracy``. Values are floats, or lists for per-iteration metrics."""
    step, totals = self._step("metrics", eval_set.make_batch), None
    for b in range(eval_set.num_batches):
      sums = step(params, eval_set.examples, eval_set.shared, eval_set.weights,
                  b * eval_set.batch_size)
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.tree.map(np.asarray, totals)
    n = max(float(totals.pop("count")), 1.0)
    metrics = {k: (v / n).tolist() for k, v in totals.items()}
    if "accuracy" in metrics:
      metrics["error"] = 1.0 - metrics["accuracy"]
    return metrics

  def scores(self, params, eval_set: EvalSet) -> tuple[np.ndarray, np.ndarray]:
    """The model's class scores ``(n, num_classes)`` and the labels of every example of the
    set (ensembles average the scores of several models)."""
    step = self._step("scores", eval_set.make_batch)
    parts = [step(params, eval_set.examples, eval_set.shared, b * eval_set.batch_size)
             for b in range(eval_set.num_batches)]
    scores = np.concatenate([np.asarray(p[0]) for p in parts])[:eval_set.size]
    labels = np.concatenate([np.asarray(p[1]) for p in parts])[:eval_set.size]
    return scores, labels


def _batch_taker(mesh, batch_size: int, start):
  batch_sharding = NamedSharding(mesh, P("data"))
  return lambda a: jax.lax.with_sharding_constraint(
      jax.lax.dynamic_slice_in_dim(a, start, batch_size), batch_sharding)


def make_scores_step(graphdef, mesh, batch_size: int, make_batch: Callable) -> Callable:
  """``fn(params, examples, shared, start) -> (scores, labels)`` of one batch."""

  @jax.jit
  def scores_step(params, examples, shared, start):
    batch = make_batch(jax.tree.map(_batch_taker(mesh, batch_size, start), examples), shared)
    return nnx.merge(graphdef, params).apply(batch, train=False).scores, batch["labels"]

  return scores_step


def make_eval_step(graphdef, mesh, batch_size: int, make_batch: Callable) -> Callable:
  """``fn(params, examples, shared, weights, start) -> sums`` over one batch: ``count``,
  ``loss``, each loss part and each metric, weighted per example (padding weighs 0)."""

  @jax.jit
  def eval_step(params, examples, shared, weights, start):
    take = _batch_taker(mesh, batch_size, start)
    batch = make_batch(jax.tree.map(take, examples), shared)
    weights = take(weights)
    model = nnx.merge(graphdef, params)
    outputs = model.apply(batch, train=False)
    loss, parts = model.loss(outputs, batch)
    per_example = {"loss": loss, **parts, **model.metrics(outputs, batch)}
    sums = {k: jnp.tensordot(weights, v.astype(jnp.float32), axes=1)
            for k, v in per_example.items()}
    return {"count": jnp.sum(weights), **sums}

  return eval_step


def check_no_test_selection(config, which: str) -> None:
  """Refuses ``--checkpoint=best`` for a run without a validation split: its "best" would be
  chosen on the test set."""
  if which == "best" and not int(config.data.get("validation_size", 0) or 0):
    raise UsageError(
        "--checkpoint=best: this run held out no validation split (config.data."
        "validation_size=0), so a best checkpoint would be chosen on the test set. Use "
        "--checkpoint=latest (the final one, the default) or a step number; to select on "
        "validation, train with --config.data.validation_size=10000 (the paper's).")
