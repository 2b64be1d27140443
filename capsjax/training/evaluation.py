"""Mapping a function over an evaluation set on every device: the one batching that every
evaluation, ensemble, benchmark and experiment uses.

An :class:`EvalSet` is a split on the devices, padded to whole batches. A :class:`BatchedEval` maps
any pure ``fn(variables, batch) -> {name: per_example}`` over it, jitted once per ``fn`` and set
kind, each batch sharded over the mesh's ``data`` axis: ``batched.mean(fn, variables, eval_set)``
gives weighted means over the set, ``{name: float}``; ``collect`` per-example values,
``{name: (n, ...) array}``. ``evaluate_examples``, ``evaluate`` and ``scores`` apply it to the
task's forward. An evaluator that needs gradients with respect to the input (an attack) writes its
``fn`` with ``jax.grad`` of :meth:`capsjax.training.tasks.Task.forward` (``batched.task.forward``).
"""

from __future__ import annotations

import copy
import functools
import sys
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax.config import run_settings
from capsjax import datasets
from capsjax.common import platform, public_names
from capsjax.training import inflight
from capsjax.runs import reporting

SETTINGS = run_settings.EVALUATION  # config.eval.batch_size.


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


class EvalSet:
  """A split on the devices, padded to whole eval batches (padding has weight 0), and the
  function that turns a slice of its examples into a model batch. ``size``: the real examples;
  ``host``: the split on the host."""

  def __init__(self, split: datasets.Split, make_batch: Callable, batch_size: int,
               sharding: NamedSharding):
    self.size = len(split)
    self.num_batches = -(-max(self.size, 1) // batch_size)
    padded = self.num_batches * batch_size
    pad = lambda a: np.concatenate([a, np.zeros((padded - len(a), *a.shape[1:]), a.dtype)])
    self.examples, self.shared = put_on_devices(
        datasets.Split({k: pad(v) for k, v in split.examples.items()}, split.shared), sharding)
    self.weights = replicated_array(pad(np.ones(self.size, np.float32)), sharding)
    self.make_batch, self.batch_size, self.host = make_batch, batch_size, split
    self._sharding = sharding

  def with_shared(self, **arrays: np.ndarray) -> "EvalSet":
    """The same examples on the devices (not copied) with ``arrays`` added to ``shared``:
    values its ``make_batch`` reads as arguments of the compiled step (e.g. a crop's offset),
    so that sets which differ only in them run one program."""
    other = copy.copy(self)
    other.shared = {**self.shared, **{k: replicated_array(v, self._sharding)
                                      for k, v in arrays.items()}}
    return other


def _show_progress(label: str | None, done: int, total: int, values) -> None:
  """``label batch done/total`` on process 0: every batch on a terminal, each quarter in a log."""
  if label is None or jax.process_index() != 0:
    return
  every = 1 if reporting.is_terminal(sys.stderr) else max(1, -(-total // 4))
  if done % every == 0 or done == total:
    jax.block_until_ready(values)
    reporting.count_progress(f"{label}: batch", done, total)


class BatchedEval:
  """Maps functions of a ``task``'s variables (:class:`capsjax.training.tasks.Task`: its
  ``forward`` for evaluators' own functions) over :class:`EvalSet`s: jitted per batch, data
  parallel over the ``mesh``."""

  def __init__(self, task, mesh, batch_size: int):
    self.task, self.mesh, self.batch_size = task, mesh, batch_size
    self.replicated = NamedSharding(mesh, P())
    self._steps: dict = {}

  def eval_set(self, split: datasets.Split, make_batch: Callable | None = None) -> EvalSet:
    """``split`` on the devices; ``make_batch`` defaults to the dataset's ``eval_batch``."""
    return EvalSet(split, make_batch or self.task.dataset.eval_batch, self.batch_size,
                   self.replicated)

  def _step(self, kind: str, fn: Callable, make_batch: Callable) -> Callable:
    # One jitted function per platform built for: JAX's trace cache does not tell them apart.
    key = (kind, fn, make_batch, platform.target())
    if key in self._steps:
      return self._steps[key]

    batches = NamedSharding(self.mesh, P("data"))
    # Per-example values come back replicated: every process can read them (multi-host).
    @functools.partial(jax.jit, out_shardings=self.replicated if kind == "collect" else None)
    def step(variables, examples, shared, weights, start):
      take = lambda a: jax.lax.with_sharding_constraint(
          jax.lax.dynamic_slice_in_dim(a, start, self.batch_size), batches)
      batch = self.task.complete_batch(make_batch(jax.tree.map(take, examples), shared))
      values = fn(variables, batch)
      if kind == "collect":
        return values
      weights = take(weights)
      sums = {k: jnp.tensordot(weights, v.astype(jnp.float32), axes=1) for k, v in values.items()}
      return {"count": jnp.sum(weights), **sums}

    self._steps[key] = step
    return step

  def evaluation_step(self, make_batch: Callable | None = None) -> Callable:
    """The jitted program :meth:`evaluate_examples` runs on each batch of a set:
    ``step(variables, examples, shared, weights, start)`` -> the per-example values of the
    batch of ``eval_set.batch_size`` examples at ``start`` (the arguments are an
    :class:`EvalSet`'s ``examples``, ``shared`` and ``weights``). ``make_batch``: the set's;
    None, the dataset's ``eval_batch``. For looking at the program (lowered for a platform,
    tests/test_accelerator_programs.py), not for running it."""
    return self._step("collect", self._evaluation_and_scores,
                      make_batch or self.task.dataset.eval_batch)

  def mean(self, fn: Callable, variables, eval_set: EvalSet,
           progress: str | None = None) -> dict:
    """The means over the set's examples of ``fn(variables, batch)``'s per-example values
    (``(batch,)`` or ``(batch, k)`` each): floats, or lists for ``(batch, k)`` values. ``fn``
    must be one object across calls (it keys the jit cache). ``progress``: a label under
    which to show the batches done (slow functions, e.g. attacks)."""
    step, totals = self._step("mean", fn, eval_set.make_batch), None
    in_flight = inflight.Window(1)  # A batch's step and its sums: XLA:CPU's collectives
    for b in range(eval_set.num_batches):  # deadlock under a deep queue.
      sums = step(variables, eval_set.examples, eval_set.shared, eval_set.weights,
                  b * eval_set.batch_size)
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
      in_flight.add(totals)
      _show_progress(progress, b + 1, eval_set.num_batches, totals)
    totals = jax.tree.map(np.asarray, totals)
    n = max(float(totals.pop("count")), 1.0)
    return {k: (v / n).tolist() for k, v in totals.items()}

  def collect(self, fn: Callable, variables, eval_set: EvalSet,
              progress: str | None = None) -> dict[str, np.ndarray]:
    """``fn(variables, batch)``'s per-example values over the set, ``{name: (size, ...)}``
    on the host, padding dropped; ``progress`` as in :meth:`mean`."""
    step, parts = self._step("collect", fn, eval_set.make_batch), []
    in_flight = inflight.Window()  # XLA:CPU's collectives deadlock under a deep queue.
    for b in range(eval_set.num_batches):
      parts.append(step(variables, eval_set.examples, eval_set.shared, eval_set.weights,
                        b * eval_set.batch_size))
      in_flight.add(parts[-1])
      _show_progress(progress, b + 1, eval_set.num_batches, parts[-1])
    return {k: np.concatenate([np.asarray(p[k]) for p in parts])[:eval_set.size] for k in parts[0]}

  def _evaluation_and_scores(self, variables, batch) -> dict:
    result = self.task.forward(variables, batch, train=False)
    return {**{f"per_example/{k}": v for k, v in result.per_example().items()},
            "scores": result.outputs.scores, "labels": batch["labels"]}

  def _scores(self, variables, batch) -> dict:
    return {"scores": self.task.forward(variables, batch, train=False).outputs.scores,
            "labels": batch["labels"]}

  def evaluate(self, variables, eval_set: EvalSet) -> dict:
    """Means over the set of the model's loss, its parts and its metrics; ``error`` is
    ``1 - accuracy``. Values are floats, or lists for per-iteration metrics. (The means of
    :meth:`evaluate_examples`: every evaluation of the model averages the same way.)"""
    return self.evaluate_examples(variables, eval_set)[0]

  def evaluate_examples(self, variables, eval_set: EvalSet) -> tuple[dict, dict, dict]:
    """``(metrics, per_example, outputs)``: :meth:`evaluate`'s means, computed on the host in
    float64 from the values of each example; those values (``{name: (size, ...)}``: the loss,
    its parts and the metrics); and ``outputs``: the class ``scores`` ``(size, num_classes)``
    and the ``labels`` of the batches (the dataset's, e.g. MultiMNIST's pairs'), which a split's
    evaluation keeps as the run's predictions. One program, one pass."""
    values = self.collect(self._evaluation_and_scores, variables, eval_set)
    per_example = {k[len("per_example/"):]: v for k, v in values.items()
                   if k.startswith("per_example/")}
    count = max(eval_set.size, 1)
    metrics = {k: (np.sum(v.astype(np.float64), axis=0) / count).tolist()
               for k, v in per_example.items()}
    if "accuracy" in metrics:
      metrics["error"] = 1.0 - metrics["accuracy"]
    return metrics, per_example, {"scores": values["scores"], "labels": values["labels"]}

  def scores(self, variables, eval_set: EvalSet) -> tuple[np.ndarray, np.ndarray]:
    """The class scores ``(n, num_classes)`` and labels of the set's examples (ensembles' input)."""
    values = self.collect(self._scores, variables, eval_set)
    return values["scores"], values["labels"]


# ``EvalRunner`` (now :class:`BatchedEval`: not a run's), with a DeprecationWarning for a release.
__getattr__ = public_names.module_getattr(__name__)
