"""A watch over the per-step train metrics, on the host: a warning a run prints as it trains.

:class:`SaturationWatch` warns when nearly all class capsules stay saturated (longer than
:data:`SATURATED_LENGTH`, where the squash has almost no slope) for a sustained stretch of steps.
A healthy classifier has only its labelled classes there (about 1/10 of the capsules on MNIST,
2/10 on MultiMNIST), so "nearly all" (0.9 by default) does not fire on one. It reads the metric
``saturated_fraction`` that a model reports (the capsule head does,
:meth:`capsjax.models.capsnet.CapsuleModel.monitors`; models without capsules report none and are
never warned about) and names the settings the model lists in its ``saturation_settings``. The
models create it (``model.monitors``); the training loop only feeds it
(:mod:`capsjax.training.train_log`).
"""

from __future__ import annotations

import numpy as np

from capsjax.config import run_settings

SETTINGS = run_settings.SATURATION_WARNING  # config.train.saturation_warning.

# A class capsule longer than this sits where the squash has almost no slope: |v| = 0.95 is
# |s| = 4.36, where d|v|/d|s| is 3% of its peak. (The trapped MultiMNIST runs of
# docs/results/multimnist_saturation_cpu.md had every class capsule above 0.98 but only 60%
# above 0.99.)
SATURATED_LENGTH = 0.95


class SaturationWatch:
  """Warns once per stretch of ``steps`` consecutive train steps (0: never) whose
  ``saturated_fraction`` is at least ``fraction`` ("nearly all"), naming ``settings`` (the config
  keys that control saturation) and quoting ``chance``, the train ``accuracy``'s chance level."""

  def __init__(self, fraction: float = 0.9, steps: int = 100, settings=(),
               chance: float | None = None):
    self.fraction, self.steps = float(fraction), int(steps)
    self.settings, self.chance = tuple(settings), chance
    self.stretch = 0          # Consecutive saturated steps so far.
    self.warned = False       # Already warned about the current stretch.
    self.accuracies: list[float] = []  # Train accuracy over the current stretch.
    self.fractions: list[float] = []

  def update(self, steps: np.ndarray, metrics: dict[str, np.ndarray]) -> str | None:
    """Feeds the metrics of ``steps`` (one value per step, in order); returns the warning
    when a stretch first reaches ``self.steps`` steps, else None."""
    saturated = metrics.get("saturated_fraction")
    if saturated is None or self.steps <= 0:
      return None
    accuracy = metrics.get("accuracy", np.full(len(steps), np.nan))
    message = None
    for step, value, acc in zip(steps, np.asarray(saturated), np.asarray(accuracy)):
      if value < self.fraction:
        self.stretch, self.warned, self.accuracies, self.fractions = 0, False, [], []
        continue
      self.stretch += 1
      self.accuracies.append(float(acc))
      self.fractions.append(float(value))
      if self.stretch >= self.steps and not self.warned:
        self.warned = True
        message = self._message(int(step))
    return message

  def _message(self, step: int) -> str:
    accuracy = float(np.nanmean(self.accuracies[-self.steps:]))
    chance = f"; chance is {100 * self.chance:.1f}%" if self.chance is not None else ""
    settings = ", ".join(self.settings) or "the model's initialisation and learning rate"
    return (f"Warning: {100 * np.mean(self.fractions[-self.steps:]):.0f}% of the class "
            f"capsules have been longer than {SATURATED_LENGTH} (saturated) for the "
            f"{self.steps} steps up to step {step}. The squash leaves them almost no gradient, "
            f"so the model is probably not learning (train accuracy {100 * accuracy:.1f}% over "
            f"those steps{chance}). Settings that control this: {settings} (smaller values "
            "start the class capsules shorter and move them more slowly); see 'Saturated "
            "class capsules' in the README.")
