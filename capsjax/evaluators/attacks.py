"""White-box L-infinity attacks as pure JAX functions of a differentiable loss.

Each attack takes ``loss_fn(images) -> (per-example losses (batch,), aux)`` that the attacker
*increases*, and returns images within ``epsilon`` of the originals (L-infinity) and within the
value range ``[low, high]``. Gradients go through everything ``loss_fn`` does (routing loops
included). Untargeted attacks increase the loss of the true label; targeted ones decrease the
loss of the target, i.e. ``loss_fn`` returns minus the target's loss (:func:`cross_entropy`).

* FGSM (Goodfellow, Shlens & Szegedy 2015): ``x + epsilon * sign(grad)``, clipped.
* PGD (Madry et al. 2018; BIM, Kurakin et al. 2017, without the random start): ``steps``
  signed-gradient steps of ``step_size``, each projected back onto the epsilon-ball around the
  original and onto the value range, from a uniform random point of the ball or from the original.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def project(images: jax.Array, originals: jax.Array, epsilon, low: float, high: float) -> jax.Array:
  """``images`` moved into the L-infinity ball of radius ``epsilon`` around ``originals`` and
  into ``[low, high]``."""
  return jnp.clip(jnp.clip(images, originals - epsilon, originals + epsilon), low, high)


def input_gradient(loss_fn: Callable, images: jax.Array) -> tuple[jax.Array, object]:
  """``(d sum(losses) / d images, aux)``: per-example losses summed, so each example's
  gradient is its own loss's."""
  def total(x):
    losses, aux = loss_fn(x)
    return jnp.sum(losses), aux
  return jax.grad(total, has_aux=True)(images)


def fgsm(loss_fn: Callable, images: jax.Array, epsilon, low: float = 0.0,
         high: float = 1.0, gradient: jax.Array | None = None) -> jax.Array:
  """One step of ``epsilon`` along the sign of the loss's input gradient (``gradient``, if
  given, is that gradient at ``images``: it is the same for every epsilon)."""
  if gradient is None:
    gradient, _ = input_gradient(loss_fn, images)
  return project(images + epsilon * jnp.sign(gradient), images, epsilon, low, high)


def pgd(loss_fn: Callable, images: jax.Array, epsilon, *, steps: int, step_size,
        key: jax.Array | None = None, low: float = 0.0, high: float = 1.0) -> jax.Array:
  """``steps`` projected signed-gradient steps of ``step_size``; ``key``: start from a uniform
  random point of the epsilon-ball (None: from ``images``, BIM)."""
  start = images
  if key is not None:
    noise = jax.random.uniform(key, images.shape, images.dtype, -1.0, 1.0)
    start = project(images + epsilon * noise, images, epsilon, low, high)

  def step(_, x):
    gradient, _ = input_gradient(loss_fn, x)
    return project(x + step_size * jnp.sign(gradient), images, epsilon, low, high)

  return jax.lax.fori_loop(0, steps, step, start)


def cross_entropy(log_probabilities: jax.Array, labels: jax.Array) -> jax.Array:
  """``-log p(label)`` per example, ``(batch, classes), (batch,) -> (batch,)``."""
  return -jnp.take_along_axis(log_probabilities, labels[:, None], axis=1)[:, 0]


def target_labels(labels: jax.Array, num_classes: int) -> jax.Array:
  """The targeted attacks' targets, ``(y + 1) mod K`` as SR-CapsNet's attack code has them."""
  return (labels + 1) % num_classes
