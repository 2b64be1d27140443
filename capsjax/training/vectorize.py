"""Several runs as one program: which runs can share it, and its train step.

Runs whose configs differ only in numbers (seeds, learning rates, init scales, loss weights)
train as one jitted program: ``jax.vmap`` over a leading run axis of the ordinary pure train
step (:func:`capsjax.training.train_step.train_steps`): parameters, optimiser and model state
and RNG (hence data order and augmentation) carry that axis; the training data are shared.
On several devices the batch of every run is sharded over them, as in a single run.

:func:`plan_groups` decides which runs can share a program, by what their train step does:

* a setting that changes the program's structure (routing iterations, shapes, the model, the
  dataset, any string or boolean or integer but the seed) puts the runs in separate groups;
* ``seed`` and settings used only to initialise (the step's program is the same whatever
  their value) need nothing: each run is initialised on its own;
* a float that the step reads through :mod:`capsjax.common.traced_settings` (the learning
  rate, the loss's weights and margins) becomes the run's own traced value;
* any other float that changes the step (read as a constant, e.g. a router's setting) splits
  the group by its value, and the plan says so.

Each check traces the step (``jax.eval_shape`` / ``jax.make_jaxpr``); nothing is computed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax.common import traced_settings
from capsjax.runs.runconfig import flatten
from capsjax.training import memory, optimizers, train_step
from capsjax.training.runtime import Runtime
from capsjax.training.tasks import Task

# Never a reason to split: each run is initialised and its data drawn from its own seed.
PER_RUN_KEYS = ("seed",)


@dataclasses.dataclass(frozen=True)
class Group:
  """Runs that train as one program.

  Attributes:
    indices: positions of the runs in the list given to :func:`plan_groups`.
    traced_keys: the float settings that differ between them and that the step reads as each
      run's traced value.
    init_keys: the float settings that differ between them but only initialise (the step's
      program is the same for every value).
    split_by: the settings whose values set this group apart from others of the same
      structure (floats that the step reads as constants), for the sweep's message.
  """
  indices: tuple[int, ...]
  traced_keys: tuple[str, ...] = ()
  init_keys: tuple[str, ...] = ()
  split_by: tuple[str, ...] = ()


def setting(config, key: str):
  """The value of dotted ``key`` in a ConfigDict (KeyError if it has none)."""
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def plan_groups(runtimes: Sequence[Runtime]) -> list[Group]:
  """The runs of ``runtimes`` (loaded: :meth:`Runtime.load`) in groups that can share one
  program, by the rules of the module docstring. Groups keep the runs' order."""
  flat = [flatten(r.config.to_dict()) for r in runtimes]
  differing = sorted(k for k in set().union(*flat) if k not in PER_RUN_KEYS
                     and len({repr(f.get(k)) for f in flat}) > 1)
  # A float setting that some configs lack (another model's loss) is structural only in
  # whether it is there.
  floats = [k for k in differing
            if all(isinstance(f[k], float) for f in flat if f.get(k) is not None)]
  structural = [k for k in differing if k not in floats]
  groups = []
  for indices in _buckets(flat, range(len(flat)), structural, present=floats):
    groups += _split_until_traceable(runtimes, flat, indices, floats, ())
  return groups


def _buckets(flat, indices, keys, present=()) -> list[list[int]]:
  """``indices`` by their values of ``keys`` (and whether they have each of ``present``), in
  order of first appearance."""
  buckets: dict[tuple, list[int]] = {}
  for i in indices:
    signature = (tuple(repr(flat[i].get(k)) for k in keys),
                 tuple(flat[i].get(k) is None for k in present))
    buckets.setdefault(signature, []).append(i)
  return list(buckets.values())


def _split_until_traceable(runtimes, flat, indices, floats, split_by) -> list[Group]:
  keys = [k for k in floats if len({repr(flat[i].get(k)) for i in indices}) > 1]
  if len(indices) == 1 or not keys:
    return [Group(tuple(indices), split_by=tuple(split_by))]
  traced, init_only, constant = classify(runtimes[indices[0]], keys,
                                         [runtimes[i].config for i in indices[1:]])
  if not constant:
    return [Group(tuple(indices), tuple(traced), tuple(init_only), tuple(split_by))]
  rest = [k for k in floats if k not in constant]
  return [g for sub in _buckets(flat, indices, constant)
          for g in _split_until_traceable(runtimes, flat, sub, rest, (*split_by, *constant))]


def classify(template: Runtime, keys: Sequence[str], others
             ) -> tuple[list[str], list[str], list[str]]:
  """``(traced, init_only, constant)``: the settings of ``keys`` that ``template``'s step
  reads through :mod:`capsjax.common.traced_settings`; those it does not use (its program is
  the same with the values of ``others``, configs); and those that cannot be traced values
  (tracing fails: Python control flow on the value, a conversion to ``float``) or that the
  step reads as constants (the program changes with the value)."""
  try:
    reads = traced_reads(template, keys)
  except Exception:  # Any failure to trace: find the settings that cause it, one by one.
    failing = [key for key in keys if not _traces(template, key)] or list(keys)
    rest = [k for k in keys if k not in failing]
    traced, init_only, constant = classify(template, rest, others) if rest else ([], [], [])
    return traced, init_only, failing + constant
  unread = [k for k in keys if k not in reads]
  reference = step_program(template.task, template) if unread else None
  init_only, constant = [], []
  for key in unread:
    changes = any(step_program(*_variant(template, key, setting(config, key))) != reference
                  for config in others if setting(config, key) != setting(template.config, key))
    (constant if changes else init_only).append(key)
  return [k for k in keys if k in reads], init_only, constant


def _traces(runtime: Runtime, key: str) -> bool:
  try:
    traced_reads(runtime, [key])
    return True
  except Exception:  # Whatever tracing raises: the setting cannot be a traced value.
    return False


def _variant(template: Runtime, key: str, value):
  """``(task, runtime, optimizer config)`` of ``template``'s config with ``key`` set to
  ``value``: what :func:`step_program` compares."""
  config = template.config.copy_and_resolve_references()
  *parents, leaf = key.split(".")
  (setting(config, ".".join(parents)) if parents else config)[leaf] = value
  return Task(config, template.task.dataset, template.task.model_class), template, config.optimizer


def _abstract_inputs(runtime: Runtime):
  split = runtime.splits["train"]
  abstract = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
  return runtime.abstract_state(), abstract(split.examples), abstract(split.shared)


def traced_reads(runtime: Runtime, keys: Sequence[str]) -> set[str]:
  """The settings of ``keys`` that one train step of ``runtime`` reads as traced values (it
  is traced with each of them a traced scalar; nothing is computed). Raises what tracing
  raises."""
  body = train_step.train_steps(runtime.task, runtime.optimizer.tx, runtime.plan.num_train,
                                runtime.mesh)
  found: set[str] = set()

  def one(state, values, examples, shared):
    with traced_settings.traced(values) as reads:
      out = body(state, examples, shared, 1)
      found.update(reads)
    return out

  values = {k: jax.ShapeDtypeStruct((), jnp.float32) for k in keys}
  state, examples, shared = _abstract_inputs(runtime)
  jax.eval_shape(one, state, values, examples, shared)
  return found


def step_program(task: Task, runtime: Runtime, optimizer_config=None) -> str:
  """The text of one train step's program (jaxpr) for ``task``, on ``runtime``'s data and
  mesh; two configs whose steps print the same text compute the same step."""
  optimizer = optimizers.build(optimizer_config if optimizer_config is not None
                               else runtime.config.optimizer,
                               runtime.plan.steps_per_epoch, runtime.plan.num_steps)
  body = train_step.train_steps(task, optimizer.tx, runtime.plan.num_train, runtime.mesh)
  return str(jax.make_jaxpr(lambda s, e, sh: body(s, e, sh, 1))(*_abstract_inputs(runtime)))


# --- The vectorised train step ------------------------------------------------------------

class VectorizedStep:
  """``step(states, values, examples, shared, num_steps) -> (states, metrics)``: the train
  step of ``runtime`` mapped over a leading run axis of ``states`` (stacked train states) and
  ``values`` (``{key: (runs,) float32}``, each run's traced settings); metrics come back
  ``(runs, num_steps)``. Compiled once per run count and ``num_steps``, its memory checked
  before it first runs (:class:`capsjax.training.memory.OutOfMemory`)."""

  def __init__(self, runtime: Runtime, traced_keys: Sequence[str] = (),
               memory_limit: Callable[[], int | None] | None = None):
    body = train_step.train_steps(runtime.task, runtime.optimizer.tx, runtime.plan.num_train,
                                  runtime.mesh)
    self.traced_keys = tuple(traced_keys)

    def step(states, values, examples, shared, num_steps):
      def one_run(state, run_values):
        with traced_settings.traced(run_values):
          return body(state, examples, shared, num_steps)
      return jax.vmap(one_run)(states, values)

    jitted = jax.jit(step, static_argnums=4, donate_argnums=0)
    self._new_steps = lambda: memory.CompiledSteps(
        jitted, runtime.config, "The runs' vectorised train step", memory_limit)
    self._steps: dict[int, memory.CompiledSteps] = {}  # By the number of runs.

  def _for(self, states) -> memory.CompiledSteps:
    runs = states.step.shape[0]
    if runs not in self._steps:
      self._steps[runs] = self._new_steps()
    return self._steps[runs]

  def __call__(self, states, values, examples, shared, num_steps: int):
    return self._for(states)(states, values, examples, shared, num_steps)

  def prepare(self, states, values, examples, shared, num_steps: int):
    """The program for these runs and ``num_steps``, compiled and its memory checked."""
    return self._for(states).prepare(states, values, examples, shared, num_steps)


def stack(trees: Sequence, sharding: NamedSharding):
  """The trees (e.g. train states) stacked along a new leading run axis, placed by
  ``sharding``."""
  return jax.jit(lambda *ts: jax.tree.map(lambda *xs: jnp.stack(xs), *ts),
                 out_shardings=sharding)(*trees)


def run_values(configs, keys: Sequence[str]) -> dict[str, jax.Array]:
  """``{key: (runs,) float32}``: each config's value of each traced setting."""
  return {k: jnp.asarray(np.array([float(setting(c, k)) for c in configs], np.float32))
          for k in keys}


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


def replicated(runtime: Runtime) -> NamedSharding:
  return NamedSharding(runtime.mesh, P())


def default_min_runs(backend: str | None = None) -> int | None:
  """The smallest group ``capsjax.sweep`` vectorises when ``--vectorize`` is not given; None:
  none. Measured (docs/performance.md, "Several runs in one program"): on a CPU one run
  already keeps it busy and N = 2-8 runs in one program were 0.79-1.01x as fast as one by one; on
  an H100, 2 runs were 0.87-1.01x, 4 runs 1.12-1.30x and 8 runs 1.25-1.86x."""
  return None if (backend or jax.default_backend()) == "cpu" else 4
