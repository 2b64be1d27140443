"""Classification metrics per example, for one label or several per example."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def label_sets_correct(scores: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
  """Whether the ``k`` highest scores are the ``k`` labels of each example.

  With one label per example this is ordinary accuracy. With ``k`` labels (MultiMNIST:
  two digits), an example is correct when its ``k`` top-scoring classes are exactly its
  labels (the official code's criterion); ``at_least_one`` counts examples with at least
  one of them among the top ``k``. Ties go to the lower class index (``lax.top_k``).

  Args:
    scores: ``(batch, num_classes)``.
    labels: ``(batch,)`` or ``(batch, k)`` class ids, distinct per example.

  Returns:
    ``{"accuracy": (batch,)}`` floats 0/1, plus ``at_least_one`` when ``k > 1``.
  """
  if labels.ndim == 1:
    return {"accuracy": (jnp.argmax(scores, axis=-1) == labels).astype(jnp.float32)}
  _, top = jax.lax.top_k(scores, labels.shape[-1])
  hits = jnp.sum(jnp.any(top[:, :, None] == labels[:, None, :], axis=1), axis=-1)
  return {"accuracy": (hits == labels.shape[-1]).astype(jnp.float32),
          "at_least_one": (hits > 0).astype(jnp.float32)}


def predictions(scores: jax.Array, labels_per_example: int) -> jax.Array:
  """The predicted class ``(batch,)``, or the ``k`` top classes ``(batch, k)`` by score."""
  if labels_per_example == 1:
    return jnp.argmax(scores, axis=-1)
  return jax.lax.top_k(scores, labels_per_example)[1]
