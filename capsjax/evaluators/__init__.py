"""Evaluations listed in the config, each a small class that yields named metrics.

In the manner of big_vision: ``config.evals`` maps an evaluation's name to its
settings, and ``type`` picks the registered :class:`Evaluator`::

    c.evals.test = dict(type="split", split="test")
    c.evals.affine_mnist = dict(type="affine_mnist", transforms_per_digit=4, seed=0)

Each evaluator builds its examples once (on the host, then on the devices),
and :meth:`Evaluator.run` returns ``{"accuracy": ..., "loss": ..., ...}``:
the averages of the model's own per-example loss and metrics, computed on the
devices in batches of ``config.eval.batch_size`` by :class:`Runner`. The run
writes them to metrics.jsonl, TensorBoard and ``summary.json["evaluations"]``
under the evaluation's name. ``config.data.test_limit`` limits every set.

To add an evaluation: a subclass decorated with ``@evaluators.register("type")``
in a module imported at the bottom of this file; list it in a config.
"""

from __future__ import annotations

import importlib
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax import datasets
from capsjax.errors import UsageError
from capsjax.registry import Registry


def replicated_array(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array replicated on every device of the mesh, from host data that
  every process holds (works across hosts, unlike a plain device_put)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def put_on_devices(split: datasets.Split,
                   sharding: NamedSharding) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
  """A split's ``examples`` and ``shared`` arrays, replicated on the devices."""
  return ({k: replicated_array(v, sharding) for k, v in split.examples.items()},
          {k: replicated_array(v, sharding) for k, v in split.shared.items()})


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
    self._steps: dict[Callable, Callable] = {}

  def eval_set(self, split: datasets.Split, make_batch: Callable) -> EvalSet:
    return EvalSet(split, make_batch, self.batch_size, self.replicated)

  def _step(self, make_batch: Callable) -> Callable:
    if make_batch not in self._steps:
      self._steps[make_batch] = make_eval_step(self.graphdef, self.mesh, self.batch_size,
                                               make_batch)
    return self._steps[make_batch]

  def evaluate(self, params, eval_set: EvalSet) -> dict:
    """Means over the set of the model's loss, its parts and its metrics; ``error`` is
    ``1 - accuracy``. Values are floats, or lists for per-iteration metrics."""
    step, totals = self._step(eval_set.make_batch), None
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
    key = ("scores", eval_set.make_batch)
    if key not in self._steps:
      self._steps[key] = make_scores_step(self.graphdef, self.mesh, self.batch_size,
                                          eval_set.make_batch)
    parts = [self._steps[key](params, eval_set.examples, eval_set.shared,
                              b * eval_set.batch_size) for b in range(eval_set.num_batches)]
    scores = np.concatenate([np.asarray(p[0]) for p in parts])[:eval_set.size]
    labels = np.concatenate([np.asarray(p[1]) for p in parts])[:eval_set.size]
    return scores, labels


def make_scores_step(graphdef, mesh, batch_size: int, make_batch: Callable) -> Callable:
  """``fn(params, examples, shared, start) -> (scores, labels)`` of one batch."""
  batch_sharding = NamedSharding(mesh, P("data"))

  @jax.jit
  def scores_step(params, examples, shared, start):
    take = lambda a: jax.lax.with_sharding_constraint(
        jax.lax.dynamic_slice_in_dim(a, start, batch_size), batch_sharding)
    batch = make_batch(jax.tree.map(take, examples), shared)
    return nnx.merge(graphdef, params).apply(batch, train=False).scores, batch["labels"]

  return scores_step


def make_eval_step(graphdef, mesh, batch_size: int, make_batch: Callable) -> Callable:
  """``fn(params, examples, shared, weights, start) -> sums`` over one batch: ``count``,
  ``loss``, each loss part and each metric, weighted per example (padding weighs 0)."""
  batch_sharding = NamedSharding(mesh, P("data"))

  @jax.jit
  def eval_step(params, examples, shared, weights, start):
    take = lambda a: jax.lax.with_sharding_constraint(
        jax.lax.dynamic_slice_in_dim(a, start, batch_size), batch_sharding)
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


class SkipEvaluation(Exception):
  """Raised by an evaluator's constructor when its data is not available (says why)."""


class Evaluator:
  """Base class: one named evaluation. Subclasses build their sets in ``__init__``
  (through ``self.runner.eval_set``) and implement :meth:`run`."""
  type_name: ClassVar[str] = ""

  def __init__(self, name: str, settings: ml_collections.ConfigDict, config, builder,
               splits: dict, runner: Runner):
    """``settings`` is ``config.evals[name]``; ``config`` the run config; ``builder`` the
    dataset builder; ``splits`` its host splits."""
    self.name, self.settings, self.config = name, settings, config
    self.builder, self.splits, self.runner = builder, splits, runner

  def limited(self, split: datasets.Split) -> datasets.Split:
    """``split`` cut to ``config.data.test_limit`` examples (0: all)."""
    return split.first(int(self.config.data.get("test_limit", 0) or 0))

  def run(self, params) -> dict:
    raise NotImplementedError

  def draw(self, model, workdir: str, writer, step: int) -> None:
    """Optional figures of this evaluation (after training)."""


_REGISTRY = Registry("Evaluator type", "type_name")


def register(type_name: str):
  """Class decorator: makes an Evaluator available as ``type=type_name`` in ``config.evals``."""
  return _REGISTRY.register(type_name)


def types() -> tuple[str, ...]:
  return _REGISTRY.names()


def eval_settings(config) -> dict[str, ml_collections.ConfigDict]:
  """``config.evals`` as ``{name: settings}``; the default is the test split alone."""
  evals = config.get("evals")
  if evals is None:
    return {"test": ml_collections.ConfigDict({"type": "split", "split": "test"})}
  return {name: evals[name] for name in evals}


def validate(config) -> None:
  """Raises UsageError for an unknown evaluator type or a missing ``test`` evaluation."""
  settings = eval_settings(config)
  if "test" not in settings:
    raise UsageError("config.evals needs an evaluation named 'test' (the main test set, "
                     "e.g. dict(type='split', split='test')).")
  for name, s in settings.items():
    if s.get("type") not in _REGISTRY.classes:
      raise UsageError(f"config.evals.{name}.type={s.get('type')!r} is not a registered "
                       f"evaluator; use one of {types()}.")


def build_all(config, builder, splits: dict, runner: Runner,
              log: Callable[[str], None] = print) -> dict[str, Evaluator]:
  """The evaluators of ``config.evals`` (plus ``validation`` when the data hold one out)."""
  validate(config)
  settings = eval_settings(config)
  if len(splits.get("validation", ())) and "validation" not in settings:
    settings["validation"] = ml_collections.ConfigDict({"type": "split", "split": "validation"})
  built = {}
  for name, s in settings.items():
    try:
      built[name] = _REGISTRY.classes[s.type](name, s, config, builder, splits, runner)
    except SkipEvaluation as e:
      log(f"Skipping evaluation {name!r}: {e}")
  return built


# Registration happens on import; keep this at the bottom.
for _module in ("affine", "splits"):
  importlib.import_module(f"capsjax.evaluators.{_module}")
