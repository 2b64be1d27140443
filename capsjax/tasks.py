"""A task is what a run trains: a dataset builder and a model class, both picked by the config.

``Task.from_config(config)`` looks both up in their registries
(``config.dataset``, ``config.model.name``) and checks that they fit each other
before any data is read; the train loop, the evaluate command and the
benchmark only talk to the task.
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
from flax import nnx

from capsjax import datasets, evaluators, metrics, models
from capsjax.errors import UsageError


@dataclasses.dataclass
class Task:
  config: ml_collections.ConfigDict
  dataset: datasets.Builder
  model_class: type[nnx.Module]

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "Task":
    """The task of ``config``; raises UsageError naming the key of a setting that cannot run.

    ``config.model.image_shape`` and ``num_classes`` left unset (None) are filled in from
    the dataset (:func:`fill_model_shapes`); set, they must agree with it."""
    model_class = models.get(config)
    dataset = fill_model_shapes(config)
    model_class.validate_config(config.model)
    evaluators.validate(config)
    return cls(config, dataset, model_class)

  def chance_levels(self) -> dict[str, float]:
    """The accuracies of random guessing on this dataset (``accuracy``, and ``at_least_one``
    with several labels per example): :func:`capsjax.metrics.chance_levels`."""
    info = self.dataset.info
    return metrics.chance_levels(info.num_classes, info.labels_per_example)

  def model(self, rngs: nnx.Rngs) -> nnx.Module:
    return self.model_class.from_config(self.config, rngs=rngs)

  def graphdef(self):
    """The model's graph definition, without allocating parameters."""
    return nnx.graphdef(nnx.eval_shape(lambda: self.model(nnx.Rngs(0))))

  def init_variables(self, key: jax.Array) -> tuple[dict, dict]:
    """Fresh ``(params, model_state)`` as pure dicts: the trainable parameters, and every other
    variable of the model (BatchNorm statistics; ``{}`` for stateless models)."""
    model = self.model(nnx.Rngs(key))
    return (nnx.to_pure_dict(nnx.state(model, nnx.Param)),
            nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param))))


def fill_model_shapes(config: ml_collections.ConfigDict) -> datasets.Builder:
  """Sets ``config.model.image_shape`` and ``num_classes`` from the dataset builder of
  ``config`` where they are None; returns the builder. A value the config sets must equal the
  dataset's (UsageError naming the key and the right value)."""
  dataset = datasets.get(config)
  info = dataset.info
  name = config.get("dataset", "mnist")
  if config.model.get("image_shape") is None:
    config.model.image_shape = tuple(info.image_shape)
  elif tuple(config.model.image_shape) != tuple(info.image_shape):
    raise UsageError(f"config.model.image_shape={tuple(config.model.image_shape)} but the "
                     f"dataset {name!r} makes images of shape {tuple(info.image_shape)} (with "
                     f"these config.data settings); leave config.model.image_shape unset (it "
                     f"follows the data) or set it to '{tuple(info.image_shape)}'.")
  if config.model.get("num_classes") is None:
    config.model.num_classes = int(info.num_classes)
  elif config.model.num_classes != info.num_classes:
    raise UsageError(f"config.model.num_classes={config.model.num_classes} but the dataset "
                     f"{name!r} has {info.num_classes} classes; leave it unset.")
  return dataset
