"""A model of one's own, named by import path: a tiny capsule network with its own loss.

    python -m capsjax.main --config=examples/config.py:model --workdir=/tmp/ex_model
    # in any config: config.model.name = "examples/tiny_capsnet.py:TinyCapsNet"

The model contract (``capsjax/models/__init__.py``): ``from_config``, ``apply`` returning
:class:`capsjax.models.Outputs`, ``loss`` (which sees the training step) and ``metrics``.
Everything else (training, checkpoints, evaluations, ensembles) comes with the run. The keys
of ``config.model`` it reads are declared beside the code (``SETTINGS``), so a run refuses a
misspelt one and checks each value before anything is compiled, and ``router_sections`` says
that ``config.model.routing`` names a router (its settings are that router's).

The network: one ReLU convolution, primary capsules, class capsules routed by the router of
``config.model.routing`` (any registered one, or one's own by import path). The loss is the
spread loss of Hinton, Sabour & Frosst (2018, Eq. 3) on the capsule lengths,
``sum_{i != t} max(0, m - (a_t - a_i))^2``, with a margin that grows linearly from 0.2 to 0.9
over ``config.model.margin_steps`` training steps (their text's schedule): the reason the loss
is given the step. At evaluation (``step`` None) the margin is the final 0.9.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from capsjax import routing
from capsjax.common.errors import UsageError
from capsjax.config.settings import POSITIVE, Setting
from capsjax.models import SHAPE_SETTINGS, Outputs, capsule_layers, layers

_SIZE = dict(kind=int, check=POSITIVE)
SETTINGS = {
    **SHAPE_SETTINGS,  # model.image_shape and num_classes, filled in from the dataset.
    "model.features": Setting(meaning="The convolution's channels.", **_SIZE),
    "model.types": Setting(meaning="Primary capsule types.", **_SIZE),
    "model.dim": Setting(meaning="Primary capsules' dimension.", **_SIZE),
    "model.class_dim": Setting(meaning="Class capsules' dimension.", **_SIZE),
    "model.margin_steps": Setting(meaning="Steps over which the margin grows to 0.9.", **_SIZE),
}


def spread_margin(step, margin_steps: int) -> jax.Array:
  """0.2 at step 0, rising linearly to 0.9 at ``margin_steps``; 0.9 when ``step`` is None."""
  if step is None:
    return jnp.float32(0.9)
  return 0.2 + 0.7 * jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / margin_steps)


def spread_loss(scores: jax.Array, labels: jax.Array, margin) -> jax.Array:
  """``(batch, classes)`` scores, ``(batch,)`` labels -> ``(batch,)`` spread losses."""
  target = jnp.take_along_axis(scores, labels[:, None], axis=1)
  others = 1.0 - jax.nn.one_hot(labels, scores.shape[1])
  return jnp.sum(others * jnp.square(jnp.maximum(0.0, margin - (target - scores))), axis=1)


class TinyCapsNet(nnx.Module):
  """Conv (ReLU) -> primary capsules -> class capsules; scores are the capsule lengths."""

  def __init__(self, image_shape, num_classes: int, *, features: int, types: int, dim: int,
               class_dim: int, routing: tuple, margin_steps: int, rngs: nnx.Rngs):
    h, w, c = image_shape
    self.conv = layers.Conv2D(c, features, 5, 2, rngs=rngs)
    self.primary = capsule_layers.PrimaryCapsules(features, types, dim, 3, 2, rngs=rngs)
    grid = lambda n: ((n - 5) // 2 + 1 - 3) // 2 + 1
    if grid(h) < 1 or grid(w) < 1:
      raise UsageError(f"TinyCapsNet: images of {h}x{w} are too small (at least 11x11).")
    self.class_capsules = capsule_layers.ClassCapsules(grid(h) * grid(w) * types, dim, num_classes,
                                               class_dim, routing=routing, rngs=rngs)
    self.margin_steps = margin_steps

  SETTINGS = SETTINGS
  router_sections = ("model.routing",)

  @classmethod
  def from_config(cls, config, *, rngs: nnx.Rngs) -> "TinyCapsNet":
    m = config.model
    # The router the run's resolved config chose, its section's settings in effect.
    chosen = routing.chosen(m.routing, routing.chosen_router(config))
    return cls(tuple(m.image_shape), m.num_classes, features=m.features, types=m.types,
               dim=m.dim, class_dim=m.class_dim, margin_steps=m.margin_steps,
               routing=chosen, rngs=rngs)

  def apply(self, batch: dict, *, train: bool, rng=None) -> Outputs:
    features = jax.nn.relu(self.conv(batch["images"]))
    parents = self.class_capsules.route(self.primary(features), train=train, rng=rng).capsules
    lengths = routing.safe_norm(parents)
    return Outputs(scores=lengths, predictions=jnp.argmax(lengths, axis=-1),
                   log_probabilities=jax.nn.log_softmax(lengths), score_kind="lengths",
                   class_capsules=parents, lengths=lengths)

  def loss(self, outputs: Outputs, batch: dict, *, step=None):
    spread = spread_loss(outputs.scores, batch["labels"],
                         spread_margin(step, self.margin_steps))
    return spread, {"spread_loss": spread}

  def metrics(self, outputs: Outputs, batch: dict) -> dict:
    return {"accuracy": (outputs.predictions == batch["labels"]).astype(jnp.float32)}
