"""Classification metrics per example, for one label or several per example; capsule
saturation; the chance level of each accuracy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# A class capsule longer than this sits where the squash has almost no slope: |v| = 0.95 is
# |s| = 4.36, where d|v|/d|s| is 3% of its peak. (The trapped MultiMNIST runs of
# docs/results/multimnist_saturation_cpu.md had every class capsule above 0.98 but only 60%
# above 0.99.)
SATURATED_LENGTH = 0.95


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


def capsule_saturation(lengths: jax.Array,
                       threshold: float = SATURATED_LENGTH) -> dict[str, jax.Array]:
  """How long the class capsules are, per example.

  The squash (Eq. 1) gives ``|v| = |s|^2 / (1 + |s|^2)``, whose slope
  ``2|s| / (1 + |s|^2)^2`` (0.65 at its peak, ``|s| = 0.58``) vanishes for long ``s``: 0.021
  at ``|v| = 0.95``, 0.002 at ``|v| = 0.99``. A healthy classifier has its labelled classes
  there and the others short (a saturated fraction near 1/10 on MNIST); a model whose
  capsules all sit there gets almost no gradient from the margin loss and stops learning
  (CapsNet on MultiMNIST with W_ij ~ normal(0, 0.1): docs/results/multimnist_saturation_cpu.md).

  Args:
    lengths: ``|v_j|``, ``(batch, num_classes)``.
    threshold: the length above which a capsule counts as saturated.

  Returns:
    ``{"class_capsule_length": (batch,), "saturated_fraction": (batch,)}``: the mean length
    of each example's class capsules, and the fraction of them longer than ``threshold``.
  """
  return {"class_capsule_length": jnp.mean(lengths, axis=-1),
          "saturated_fraction": jnp.mean((lengths > threshold).astype(jnp.float32), axis=-1)}


def chance_levels(num_classes: int, labels_per_example: int = 1) -> dict[str, float]:
  """The accuracies of guessing ``labels_per_example`` distinct classes uniformly at random.

  With ``k`` labels among ``n`` classes: ``accuracy`` (the guessed set is exactly the
  labels) is ``1 / C(n, k)``; ``at_least_one`` (for ``k > 1``: some label guessed) is
  ``1 - C(n - k, k) / C(n, k)``. For MultiMNIST (``n = 10, k = 2``): 1/45 = 2.22% and
  17/45 = 37.78%; for one label, ``1 / n``. An accuracy near these is no learning at all.
  """
  n, k = int(num_classes), int(labels_per_example)
  if not 1 <= k <= n:
    raise ValueError(f"labels_per_example={k} must lie in [1, num_classes={n}].")
  sets = math.comb(n, k)
  levels = {"accuracy": 1.0 / sets}
  if k > 1:
    levels["at_least_one"] = 1.0 - math.comb(n - k, k) / sets
  return levels
