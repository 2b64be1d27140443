"""Models registered by name: ``config.model.name`` picks one.

A model is a Flax NNX module that owns its loss and its metrics; the trainer
and the evaluators call only this interface:

  ``Model.validate_config(config.model)``
      raises UsageError, naming the key, for settings that cannot work;
  ``Model.from_config(config, *, rngs)``
      builds it from the whole run config (``config.model``, and e.g.
      ``config.loss``);
  ``model.apply(batch, *, train, rng=None) -> outputs``
      the forward pass on a batch dict (``images``, ``labels``, ...); ``rng``
      drives dropout and other training noise; ``outputs.scores`` are class
      scores ``(batch, num_classes)`` (evaluators, ensembles);
  ``model.loss(outputs, batch) -> (per_example, {name: per_example})``
      the training objective of each example and its named parts;
  ``model.metrics(outputs, batch) -> {name: per_example}``
      ``(batch,)`` or ``(batch, k)`` values that evaluators average, at least
      ``accuracy``.

Variables that are not ``nnx.Param`` (BatchNorm statistics) are the model's state: the train
step keeps what ``apply(train=True)`` writes to them (:mod:`capsjax.train_step`), and
evaluation merges them back with the parameters.

To add a model: a module with such a class, and one line in :data:`MODELS`
(:class:`capsjax.registry.Registry`).
"""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from capsjax.registry import Registry

# name -> "module:Class": one line per model.
MODELS = Registry("model", "config.model.name", {
    "capsnet": "capsjax.models.capsnet:CapsNet",
    "baseline_cnn": "capsjax.models.baseline_cnn:BaselineCNN",
    "efficient_capsnet": "capsjax.models.efficient_capsnet:EfficientCapsNet",
})


def get(config: ml_collections.ConfigDict) -> type[nnx.Module]:
  """The model class ``config.model.name`` names (default ``"capsnet"``)."""
  return MODELS.get(config.model.get("name", "capsnet"))


def create(config: ml_collections.ConfigDict, *, rngs: nnx.Rngs) -> nnx.Module:
  """The model of ``config``, with fresh parameters from ``rngs``."""
  return get(config).from_config(config, rngs=rngs)


def count_params(model: nnx.Module) -> int:
  """Number of trainable scalars in ``model``."""
  params = nnx.state(model, nnx.Param)
  return sum(x.size for x in jax.tree.leaves(params))


__all__ = ["MODELS", "count_params", "create", "get"]
