"""The losses: the batch means of CapsNet's margin loss (Eq. 4) and reconstruction loss
(Sec. 4.1), whose per-example forms are :mod:`capsjax.models.capsnet`'s (public here too), and the
spread loss of matrix capsules (Hinton et al. 2018); the head's settings: ``head_settings``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from capsjax.models.capsnet import (margin_loss_per_example,  # noqa: F401 (public here)
                                    reconstruction_loss_per_example)

def margin_loss(lengths: jax.Array, labels: jax.Array, **kwargs) -> jax.Array:
  """:func:`margin_loss_per_example` averaged over the batch; a scalar."""
  return jnp.mean(margin_loss_per_example(lengths, labels, **kwargs))


def reconstruction_loss(reconstructions: jax.Array, images: jax.Array, **kwargs) -> jax.Array:
  """:func:`reconstruction_loss_per_example` averaged over the batch; a scalar."""
  return jnp.mean(reconstruction_loss_per_example(reconstructions, images, **kwargs))


MARGIN_SCHEDULES = ("code", "linear")


def spread_margin(step: jax.Array | None, schedule: str = "code",
                  linear_steps: int = 400_000, dtype=jnp.float32) -> jax.Array:
  """The spread loss's margin m at a training step (Hinton et al. 2018, Sec. 3).

  ``"code"``: the authors' code (``capsule_em/layers.py``), ``0.2 + 0.79 sigmoid(min(10,
  step / 50000 - 4))``: 0.21 at step 0, 0.6 at 200,000, 0.99 from about 700,000. ``"linear"``:
  the paper's text, "starting from a small margin of 0.2 and linearly increasing it during
  training to 0.9", over ``linear_steps``. ``step`` None (evaluation): the final margin.
  ``dtype``: the activations' (float64 in a float64 run).
  """
  if schedule == "linear":
    if step is None:
      return jnp.asarray(0.9, dtype)
    return 0.2 + 0.7 * jnp.clip(jnp.asarray(step, dtype) / linear_steps, 0.0, 1.0)
  step = jnp.asarray(1e9 if step is None else step, dtype)
  return 0.2 + 0.79 * jax.nn.sigmoid(jnp.minimum(10.0, step / 50000.0 - 4.0))


def spread_loss_per_example(activations: jax.Array, labels: jax.Array, margin,
                            reduction: str = "mean") -> jax.Array:
  """The spread loss ``sum_{i != t} max(0, m - (a_t - a_i))^2`` per example (paper, Eq. 3),
  ``(batch,)``, of class ``activations`` ``(batch, num_classes)``, int class ids ``labels``
  ``(batch,)`` and the scalar ``margin`` m. ``reduction``: ``"mean"`` divides by the number of
  classes, as the code does (its ``reduce_mean`` runs over batch and classes); ``"sum"``: Eq. 3."""
  target = jnp.take_along_axis(activations, labels[:, None], axis=1)
  others = 1.0 - jax.nn.one_hot(labels, activations.shape[-1], dtype=activations.dtype)
  per_class = others * jnp.square(jnp.maximum(0.0, margin - (target - activations)))
  total = jnp.sum(per_class, axis=-1)
  return total / activations.shape[-1] if reduction == "mean" else total
