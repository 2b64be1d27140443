"""A model of one's own, named by import path: a tiny capsule network with its own loss.

    python -m capsjax.main --config=examples/config.py:model --workdir=/tmp/ex_model
    # in any config: config.model.name = "examples/tiny_capsnet.py:TinyCapsNet"

The model contract (``capsjax/models/__init__.py``): ``from_config``, ``apply`` returning
:class:`capsjax.models.Outputs`, ``loss`` (which sees the training step) and ``metrics``.
Everything else (training, checkpoints, evaluations, ensembles) comes with the run.

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
from capsjax.models import capsule_layers, layers
from capsjax.models import Outputs


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
               class_dim: int, routing_settings: dict, margin_steps: int, rngs: nnx.Rngs):
    h, w, c = image_shape
    self.conv = layers.Conv2D(c, features, 5, 2, rngs=rngs)
    self.primary = capsule_layers.PrimaryCapsules(features, types, dim, 3, 2, rngs=rngs)
    grid = lambda n: ((n - 5) // 2 + 1 - 3) // 2 + 1
    if grid(h) < 1 or grid(w) < 1:
      raise UsageError(f"TinyCapsNet: images of {h}x{w} are too small (at least 11x11).")
    self.class_capsules = capsule_layers.ClassCapsules(grid(h) * grid(w) * types, dim, num_classes,
                                               class_dim, routing=routing_settings, rngs=rngs)
    self.margin_steps = margin_steps

  @classmethod
  def from_config(cls, config, *, rngs: nnx.Rngs) -> "TinyCapsNet":
    m = config.model
    if not m.margin_steps >= 1:
      raise UsageError(f"config.model.margin_steps must be >= 1, got {m.margin_steps!r}.")
    router, settings = routing.resolve(m.routing)
    return cls(tuple(m.image_shape), m.num_classes, features=m.features, types=m.types,
               dim=m.dim, class_dim=m.class_dim, margin_steps=m.margin_steps,
               routing_settings={"name": router.name, **settings}, rngs=rngs)

  @staticmethod
  def resolve_config(model_config) -> None:
    """Records the router's settings in effect in the run's config.json."""
    routing.fill(model_config.routing)

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
