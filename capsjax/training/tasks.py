"""A task is what a run trains: a dataset builder and a model, both picked by the config, and
the one forward function every caller uses.

``Task.from_config(config)`` resolves the config (a copy: the caller's is never written), which
finds the dataset and the model (``config.dataset``, ``config.model.name``, a registered name or an
import path: :attr:`capsjax.config.schema.ResolvedConfig.choices`), builds the model's graph once
(which validates its settings) and checks the model's contract (:mod:`capsjax.models`) before any
data is read. The train step, every evaluation, the figures, the benchmark and the experiments call
:meth:`Task.forward` and nothing else (the vote attack also calls
:meth:`Task.vote_log_probabilities`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from capsjax import datasets, models
from capsjax.common.errors import UsageError
from capsjax.datasets import stream_order
from capsjax.models import metrics
from capsjax.config import schema


class Forward(NamedTuple):
  """What :func:`forward` returns.

  Attributes:
    outputs: the model's :class:`capsjax.models.Outputs`.
    loss: the objective per example, ``(batch,)``.
    loss_parts: its named parts, ``{name: (batch,)}``.
    metrics: ``{name: (batch,) or (batch, k)}``, at least ``accuracy``.
    model_state: the model's variables that are not parameters after the pass (BatchNorm's
      running statistics, updated when ``train``), a pure dict; ``{}`` for stateless models.
  """
  outputs: Any
  loss: jax.Array
  loss_parts: dict
  metrics: dict
  model_state: dict

  def per_example(self) -> dict:
    """``{"loss": ..., **loss_parts, **metrics}``: what evaluations average."""
    return {"loss": self.loss, **self.loss_parts, **self.metrics}


def forward(graphdef, variables: dict, batch: dict, *, train: bool,
            rng: jax.Array | None = None, step: jax.Array | None = None,
            numbers=None) -> Forward:
  """The model of ``graphdef`` with ``variables`` (parameters and state, a pure dict) on a
  complete ``batch`` (:meth:`Task.complete_batch`): its outputs (``apply``), per-example loss and
  parts (``loss``) and metrics (``metrics``), and the state the pass wrote. A pure function: the
  train step differentiates it, evaluations map it over a set (through :meth:`Task.forward`,
  whose Args these are; only a model that declares ``per_run_numbers`` takes ``numbers``)."""
  model = nnx.merge(graphdef, variables)
  outputs = model.apply(batch, train=train, rng=rng)
  extra = {"numbers": numbers} if numbers is not None else {}
  loss, parts = model.loss(outputs, batch, step=step, **extra)
  return Forward(outputs, loss, parts, model.metrics(outputs, batch),
                 nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param))))


# Task.check_outputs's keys that passed, in this process.
_CHECKED: set[tuple] = set()


def _shapes(tree, first: int = 0) -> tuple:
  """``((path, shape[first:], dtype), ...)`` of the arrays in ``tree``: a hashable key."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return tuple((jax.tree_util.keystr(path), tuple(leaf.shape[first:]), str(leaf.dtype))
               for path, leaf in leaves)


@dataclasses.dataclass
class Task:
  """A resolved ``config`` (the copy ``config.json`` records), its ``dataset`` builder
  (:class:`capsjax.datasets.Builder`) and its ``model_class``."""
  config: ml_collections.ConfigDict
  dataset: datasets.Builder
  model_class: type[nnx.Module]

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "Task":
    """The task of ``config``, resolved (:func:`capsjax.config.schema.resolve_config`: every
    default filled in, ``config.model.image_shape`` and ``num_classes`` from the dataset);
    raises UsageError naming the key of a setting that cannot run."""
    config = schema.as_resolved(config)
    dataset = datasets.get(config)
    stream_order.check(config, dataset.stream_copies(), config.dataset)
    task = cls(config, dataset, models.get(config))
    models.check_class(task.model_class, config.model.name)
    task.graphdef  # Builds the model's shapes once: its settings are validated here.
    return task

  def chance_levels(self) -> dict[str, float]:
    """The accuracies of random guessing here: :func:`capsjax.models.metrics.chance_levels`."""
    info = self.dataset.info
    return metrics.chance_levels(info.num_classes, info.labels_per_example)

  def model(self, rngs: nnx.Rngs) -> nnx.Module:
    return self.model_class.from_config(self.config, rngs=rngs)

  @functools.cached_property
  def abstract_model(self) -> nnx.Module:
    """The model with shapes only (no parameters allocated): its settings and capabilities."""
    return nnx.eval_shape(lambda: self.model(nnx.Rngs(0)))

  @functools.cached_property
  def graphdef(self):
    """The model's graph definition (built once, without allocating parameters)."""
    return nnx.graphdef(self.abstract_model)

  @property
  def capabilities(self) -> frozenset[str]:
    """What the model declares beyond the contract (:data:`capsjax.models.CAPABILITIES`)."""
    return models.capabilities(self.abstract_model)

  def init_variables(self, key: jax.Array) -> tuple[dict, dict]:
    """Fresh ``(params, model_state)`` as pure dicts: the trainable parameters, and every other
    variable of the model (BatchNorm statistics; ``{}`` for stateless models)."""
    model = self.model(nnx.Rngs(key))
    return (nnx.to_pure_dict(nnx.state(model, nnx.Param)),
            nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param))))

  def complete_batch(self, batch: dict) -> dict:
    """``batch`` with its ``reconstruction_targets`` when it has none: the dataset's
    (``Builder.reconstruction_targets``), or its clean images. Build a batch with this before
    moving its images (an attack) to keep the targets clean."""
    if "reconstruction_targets" in batch:
      return batch
    targets = self.dataset.reconstruction_targets
    return {**batch, "reconstruction_targets": batch["images"] if targets is None
            else targets(batch)}

  def forward(self, variables: dict, batch: dict, *, train: bool,
              rng: jax.Array | None = None, step: jax.Array | None = None,
              numbers=None) -> Forward:
    """The model's outputs, per-example loss and its parts, and metrics on ``batch``: a pure
    function of its arguments (jit it, differentiate it, map it over a set:
    :meth:`capsjax.training.evaluation.BatchedEval.mean`).

    Args:
      variables: every variable of the model, parameters and state, as a pure dict
        (``TrainState.variables``); differentiate with respect to the parameters in it.
      batch: ``images`` (floats), ``labels`` and what the dataset adds; completed by
        :meth:`complete_batch`.
      train: training mode (dropout, label-masked decoder, BatchNorm on batch statistics).
      rng: the key of training noise (dropout, random routing).
      step: the training step, for losses with schedules.
      numbers: one run's per-run numbers in a vectorised step (the model's
        ``per_run_numbers``: :mod:`capsjax.config.per_run`), or None: the config's.
    """
    return forward(self.graphdef, variables, self.complete_batch(batch), train=train,
                   rng=rng, step=step, numbers=numbers)

  def vote_log_probabilities(self, variables: dict, batch: dict) -> jax.Array:
    """``log_softmax`` of the class scores of the model's votes combined without routing
    (``model.vote_scores``, models with the ``votes`` capability), in evaluation mode,
    ``(batch, num_classes)``: what the vote attack (:mod:`capsjax.evaluators.adversarial`)
    differentiates. A pure function, like :meth:`forward`."""
    if "votes" not in self.capabilities:
      raise UsageError(f"config.model.name={self.config.model.name!r} has no class layer "
                       "that routes votes (no 'votes' capability), so it has no vote attack.")
    model = nnx.merge(self.graphdef, variables)
    return jax.nn.log_softmax(model.vote_scores(self.complete_batch(batch)))

  def monitors(self) -> list:
    """The model's watches over the per-step train metrics (e.g. the saturation warning)."""
    hook = getattr(self.abstract_model, "monitors", None)
    return list(hook(self.config, self.chance_levels()["accuracy"])) if hook else []

  def check_outputs(self, splits: dict) -> None:
    """Traces :meth:`forward` (shapes only, nothing computed) on two examples, in evaluation on a
    test batch and in training on a train batch as the train step builds it (and
    :meth:`vote_log_probabilities` where the model declares ``votes``), and raises UsageError naming
    the model and what breaks the contract (:func:`capsjax.models.check_forward`): at a run's start,
    not at its end. ``splits``: the dataset's, ``train`` and ``test`` at least. A check that passed
    is not traced again in this process for the same model class, dataset builder, resolved config
    and example shapes (the runs of a sweep in one program, the tests' many runs)."""
    key = (self.model_class, type(self.dataset), self.config.to_json_best_effort(sort_keys=True),
           *(_shapes(splits[name].examples, first=1) + _shapes(splits[name].shared)
             for name in ("train", "test")))
    if key in _CHECKED:
      return
    self._check_outputs(splits)
    _CHECKED.add(key)

  def _check_outputs(self, splits: dict) -> None:
    take = lambda a: jax.ShapeDtypeStruct((2, *a.shape[1:]), a.dtype)
    abstract = jax.eval_shape(lambda: nnx.to_pure_dict(nnx.state(self.abstract_model)))
    batches = {
        False: lambda e, s: self.dataset.eval_batch(e, s),
        True: lambda e, s: self.dataset.train_batch(jax.random.PRNGKey(0), jnp.arange(2), e, s),
    }
    for train in (False, True):
      split = splits["train" if train else "test"]
      examples = jax.tree.map(take, split.examples)
      result = jax.eval_shape(
          lambda v, e, s, t=train: self.forward(v, batches[t](e, s), train=t,
                                                rng=jax.random.PRNGKey(0), step=0),
          abstract, examples, split.shared)
      votes = None
      if not train and "votes" in self.capabilities:
        votes = jax.eval_shape(
            lambda v, e, s: self.vote_log_probabilities(v, self.dataset.eval_batch(e, s)),
            abstract, examples, split.shared)
      models.check_forward(result, self.config.model.name, self.capabilities,
                           self.dataset.info.num_classes, train, vote_scores=votes)
