"""The chance level of each accuracy. The per-example metrics every model reports live with
CapsNet's head (:mod:`capsjax.models.capsnet`: ``label_sets_correct``, ``predictions``,
``capsule_saturation``) and are public here too."""

from __future__ import annotations

import math

from capsjax.models.capsnet import (capsule_saturation, label_sets_correct,  # noqa: F401
                                    predictions)
from capsjax.models.saturation_watch import SATURATED_LENGTH  # noqa: F401

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
