"""What every model's ``apply`` returns: one documented outputs type.

Generic code (the loop, evaluators, ensembles, figures, attacks) reads only the first three
fields; the rest are a model's optional capabilities, None where a model has none.
"""

from __future__ import annotations

import jax
from flax import struct

# What ``Outputs.scores`` are, per model.
SCORE_KINDS = ("lengths", "activations", "probabilities")


@struct.dataclass
class Outputs:
  """A model's outputs on a batch (a pytree: it leaves ``jax.jit``).

  Attributes:
    scores: class scores ``(batch, num_classes)``, higher for more likely classes: what the
      predictions, the ensembles and the margin loss use. ``score_kind`` says what they are.
    predictions: the argmax of ``scores``, ``(batch,)``; with several labels per example the
      classes of the ``n`` highest scores, ``(batch, n)``.
    log_probabilities: ``(batch, num_classes)`` log-probabilities that a cross-entropy on any
      model can use (attacks): ``log_softmax(logits)`` for softmax models, and for capsule
      models ``log_softmax(scores)``, the lengths or activations taken as logits (as the attack
      code of Hahn et al. 2019 and Gu et al. 2021 does).
    score_kind: ``"lengths"`` (capsule lengths ``|v_j|`` in [0, 1)), ``"activations"`` (a router's
      parent activations) or ``"probabilities"`` (softmax, or sigmoids with several labels); static.
    logits: the pre-softmax class logits of softmax models; None for capsule models.
    class_capsules: the class capsules ``(batch, num_classes, dim)`` of capsule models.
    lengths: their lengths ``(batch, num_classes)``.
    reconstructions: decoded images ``(batch, h, w, c)`` (``(batch, n, h, w, c)`` with ``n``
      labels), masked by the labels in training and by the predictions otherwise.
    label_reconstructions: with several labels, the reconstructions masked by the labels.
    diagnostics: the router's per-iteration measurements ``{name: (batch, iterations)}``.
  """
  scores: jax.Array
  predictions: jax.Array
  log_probabilities: jax.Array
  score_kind: str = struct.field(pytree_node=False, default="probabilities")
  logits: jax.Array | None = None
  class_capsules: jax.Array | None = None
  lengths: jax.Array | None = None
  reconstructions: jax.Array | None = None
  label_reconstructions: jax.Array | None = None
  diagnostics: dict | None = None


__all__ = ["Outputs", "SCORE_KINDS"]
