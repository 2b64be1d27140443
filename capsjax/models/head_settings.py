"""The capsule head's settings (:mod:`capsjax.models.capsnet`'s, which Efficient-CapsNet
shares): ``config.loss`` (:class:`LossSettings`) and ``model.class_capsules.scores``."""

from __future__ import annotations

import ml_collections

from capsjax.common.errors import UsageError
from capsjax.config import per_run
from capsjax.config.settings import NON_NEGATIVE, Rule, Setting, between, one_of, usually
from capsjax.routing.router import Router


@per_run.declare("loss")
class LossSettings:
  """``config.loss``: Eq. 4's m+, m- and lambda, the weight of the summed squared errors, and the
  margin loss's own weight (1: Eq. 4 summed over the classes; the official code's 0.05 is its 0.5
  x a mean over the 10 classes). A pytree of per-run numbers (:mod:`capsjax.config.per_run`): a
  vectorised sweep's runs may differ in each."""
  m_plus: float = 0.9
  m_minus: float = 0.1
  lam: float = 0.5
  reconstruction_weight: float = 0.0005
  margin_weight: float = 1.0

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict | None) -> "LossSettings":
    """From ``config.loss`` (None: no loss section: the defaults)."""
    return per_run.of_config(cls, config)


SCORES = ("auto", "lengths", "activations")

# ``config.loss`` of the capsule models: Eq. 4 and the reconstruction term (Sec. 4.1).
LOSS_SETTINGS = {
    "loss.m_plus": Setting(LossSettings.m_plus, "Eq. 4's m+ (a present class's length "
                           "above it costs nothing).", check=between(0, 1)),
    "loss.m_minus": Setting(LossSettings.m_minus, "Eq. 4's m- (below m+).", check=between(0, 1)),
    "loss.lam": Setting(LossSettings.lam, "Eq. 4's lambda, the absent classes' weight.",
                        check=usually(NON_NEGATIVE)),
    "loss.reconstruction_weight": Setting(LossSettings.reconstruction_weight, "Times the SUM "
                                          "of squared pixel errors.",
                                          check=usually(NON_NEGATIVE)),
    "loss.margin_weight": Setting(LossSettings.margin_weight, "Times Eq. 4 summed over the "
                                  "classes (the official code's: 0.05).",
                                  check=usually(NON_NEGATIVE)),
}
LOSS_RULES = (Rule(("loss.m_plus", "loss.m_minus"), lambda plus, minus: plus > minus,
                   "m+ > m- (Eq. 4: a present class is pushed above m+, an absent one below "
                   "m-)", unusual=True),)

SCORES_SETTING = Setting("auto", "Class scores: the router's own (\"auto\": its parents' "
                         "activations where it computes them, else the lengths); or "
                         "\"lengths\", \"activations\".", check=one_of(*SCORES))


def check_scores(config: ml_collections.ConfigDict, router: Router) -> None:
  """Raises UsageError for a ``config.class_capsules.scores`` the router cannot give."""
  scores = config.class_capsules.scores
  if scores == "activations" and not router.yields_activations:
    raise UsageError(f"config.model.class_capsules.scores='activations' but router "
                     f"{router.name!r} computes no parent activations; use 'lengths' or 'auto'.")
