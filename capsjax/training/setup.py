"""One set-up path for every command, the placement of data on the devices, and the
evaluation batched.

``train``, ``evaluate``, ``ensemble`` and ``benchmark`` all start the same way::

    setup = Setup(config)          # checks the config; task, mesh, data, budget, optimiser
    state = setup.fresh_state()      # or: step, state, meta = setup.restore(checkpointer)
    evals = setup.evaluations()      # config.evals on the devices

The mesh is 1-D over every device of the job (axis ``data``): batches are sharded, parameters,
optimiser state and the datasets replicated. ``setup.batched``
(:class:`capsjax.training.evaluation.BatchedEval`) maps functions of the model over evaluation sets.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import ml_collections
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax import datasets, evaluators
from capsjax.common import platform
from capsjax.common.errors import UsageError
from capsjax.config import history, runconfig
from capsjax.runs import checkpoint_forms, reporting
from capsjax.training import budget, optimizers, train_step
from capsjax.training.evaluation import BatchedEval, put_on_devices
from capsjax.training.tasks import Task


# Initialisation runs once per run, so its program's compile time is all it costs: on a CPU,
# LLVM at -O1 compiles the threefry loops of the initialisers about 3x faster than the default
# (smoke models: 0.7-1.0 s against 1.9-3.7 s) and gives the same bits (tests/test_setup.py).
# By the backend programs are built for (capsjax.common.platform.target).
INIT_COMPILER_OPTIONS = {"cpu": {"xla_backend_optimization_level": 1}}


def make_mesh() -> jax.sharding.Mesh:
  """A 1-D mesh over every device of the job, axis ``data``."""
  return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


class Setup:
  """A config made runnable, complete when built: its ``task``, ``mesh`` (``replicated``: the
  sharding of replicated arrays), ``splits`` (the dataset's, on the host, by name), ``budget``
  (:class:`capsjax.training.budget.Budget`) and ``optimizer``
  (:class:`capsjax.training.optimizers.Optimizer`, epoch-based settings in the budget's steps)."""

  def __init__(self, config: ml_collections.ConfigDict,
               splits: dict[str, datasets.Split] | None = None):
    """Raises UsageError, naming the key, for a config that cannot run here. ``self.config``
    is the resolved copy (:func:`capsjax.config.schema.resolve_config`); ``config`` is not
    written. Reads the dataset's splits (or takes ``splits``: e.g. random data of their shapes,
    or another setup's of the same dataset), checks that the model keeps its contract on them
    (:meth:`capsjax.training.tasks.Task.check_outputs`) and plans the run's steps."""
    budget.validate_train_config(config, jax.device_count())
    self.task = Task.from_config(config)
    self.config = self.task.config
    self.mesh = make_mesh()
    self.replicated = NamedSharding(self.mesh, P())
    self.splits = self.task.dataset.load() if splits is None else splits
    self.task.check_outputs(self.splits)
    self.budget = budget.Budget.from_config(self.config.train, len(self.splits["train"]))
    self.optimizer = optimizers.build(self.config.optimizer, self.budget.steps_per_epoch,
                                      self.budget.num_steps)

  def fresh_state(self) -> train_step.TrainState:
    """Parameters and optimiser state from ``config.seed``, replicated on the mesh."""
    tx = self.optimizer.tx
    return jax.jit(lambda: train_step.init_state(self.task, tx), out_shardings=self.replicated,
                   compiler_options=INIT_COMPILER_OPTIONS.get(platform.target()))()

  def abstract_state(self) -> train_step.TrainState:
    return train_step.abstract_state(self.task, self.optimizer.tx, self.replicated)

  def restore(self, checkpointer, steps: list[int] | None = None, move_aside: bool = False,
              log: Callable[[str], None] = reporting.log):
    """``(step, state, meta)`` of the newest checkpoint that restores (or the first of ``steps``),
    or None when there is none; see :meth:`capsjax.runs.checkpointing.Checkpointer.restore_newest`.
    Checkpoints of every earlier layout restore (:func:`capsjax.runs.checkpoint_forms.older_forms`);
    the optimiser's per-run numbers are the config's."""
    abstract = self.abstract_state()
    found = checkpointer.restore_newest(
        abstract, log=log, move_aside=move_aside, steps=steps,
        older_forms=checkpoint_forms.older_forms(abstract, self.optimizer))
    if found is None:
      return None
    step, state, meta = found
    # The config's learning rate, not the checkpoint's: a resumed run may change it.
    opt_state = self.optimizer.with_config_numbers(state.opt_state)
    return step, state.replace(opt_state=jax.device_put(opt_state, self.replicated)), meta

  def make_train_step(self) -> Callable:
    """The jitted train step over the loaded train split."""
    return train_step.make_train_step(self.task, self.optimizer.tx, self.budget.num_train,
                                      self.mesh)

  @functools.cached_property
  def batched(self) -> BatchedEval:
    return BatchedEval(self.task, self.mesh, self.config.eval.batch_size)

  def evaluations(self, log: Callable[[str], None] = reporting.log) -> dict:
    """The evaluators of ``config.evals`` (and ``validation``, if held out) on the splits."""
    return evaluators.build_all(self.config, self.task.dataset, self.splits, self.batched, log=log)

  def on_devices(self, split: datasets.Split) -> tuple[dict, dict]:
    """A split's ``examples`` and ``shared`` arrays, replicated on the mesh."""
    return put_on_devices(split, self.replicated)


def check_no_test_selection(config, which: str) -> None:
  """Refuses ``--checkpoint=best`` without a validation split: "best" would be the test's pick."""
  if which == "best" and not int(config.data.validation_size):
    raise UsageError(
        "--checkpoint=best: this run held out no validation split (config.data."
        "validation_size=0), so a best checkpoint would be chosen on the test set. Use "
        "--checkpoint=latest (the final one, the default) or a step number; to select on "
        "validation, train with --config.data.validation_size=10000 (the paper's).")


def check_same_model(setup, workdir: str) -> None:
  """Raises UsageError when the checkpoints in ``workdir`` cannot hold ``setup``'s train
  state: the run there trained a model (or optimiser) of other shapes. The message names the
  settings that differ from its ``config.json``. Without a readable earlier config there is
  nothing to compare, and the restore reports what it finds."""
  earlier_raw = runconfig.read_raw(workdir)
  if earlier_raw is None:
    return
  try:
    earlier = runconfig.from_raw(earlier_raw)
    task = Task.from_config(earlier)
    tx = optimizers.build(task.config.optimizer).tx
    before = jax.eval_shape(lambda: train_step.init_state(task, tx))
  except Exception:  # A config this version cannot build: let the restore speak.
    return
  now = setup.abstract_state()
  shapes = lambda tree: jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)
  if (jax.tree.structure(before) == jax.tree.structure(now)
      and shapes(before) == shapes(now)):
    return
  changes = history.config_changes(earlier_raw, setup.config)
  raise UsageError(
      f"{workdir} holds a run of another model: its checkpoints do not fit this config's "
      f"parameters or optimiser state. Settings that differ from its config.json: "
      f"{'; '.join(changes) or '(none written there; the code that builds the model changed)'}."
      " Use a new --workdir for this config, or rerun with that run's settings to go on "
      "with it.")
