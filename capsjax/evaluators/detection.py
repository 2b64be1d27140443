"""Detecting adversarial images by their reconstruction (Frosst, Sabour & Hinton 2018, DARCCC:
"Detecting adversaries by reconstruction from class conditional capsules").

    c.evals.detection = dict(type="reconstruction_detection", attacks=("fgsm", "pgd"),
                             epsilons=(0.0, 0.05, 0.1, 0.2, 0.3), limit=1000)

A capsule model reconstructs its input from the capsule of the class it predicts. An image pushed
across a class boundary by a small perturbation still looks like its true class, so its
reconstruction (of the wrong class) is far from it. The detector flags an image when the L2 distance
``|x - r(x)|`` between the image and the reconstruction from its predicted class capsule exceeds a
threshold: the ``percentile`` (default 95) of that distance on the clean **validation** images, so
that about 5% of clean images are flagged. The threshold is never taken on the test set; without a
validation split (``config.data.validation_size``) the evaluation is refused.

The attacks and their settings are the adversarial evaluator's (capsjax's own attacks only:
:mod:`capsjax.evaluators.adversarial`), plus ``percentile`` and ``validation_limit``.

It reports ``threshold``, ``validation_false_positive_rate`` (the clean validation images flagged,
~5% by construction), ``false_positive_rate`` (the clean test images flagged, 5% up to sampling
error if test and validation images are alike), and per attack and epsilon: ``{tag}_detection_rate``
(attacked images flagged, all of them), ``{tag}_detection_rate_successful`` (flagged among those
whose attack succeeded; absent if none did), ``{tag}_undetected_success_rate`` (attacks that succeed
and are not flagged, over the examples correct before the attack), ``{tag}_accuracy`` and
``{tag}_success_rate``. A detector that flags at random with the same false-positive rate detects
that fraction of attacks: it is the chance level of every detection rate. ``accuracy`` is the clean
accuracy of the evaluated sample; ``seconds`` the wall time, compilation included. The
gradient-masking checks of the adversarial evaluator are reported too. After a run,
``NAME_distances.png`` shows the histograms of clean and attacked distances at the largest epsilon,
one panel per attack, with the threshold.

The attack does not know about the detector (DARCCC's first experiments); an attacker who
also lowers the reconstruction distance (their Sec. 5) is not implemented.
"""

from __future__ import annotations

import os
import time

import jax.numpy as jnp
import numpy as np

from capsjax.common import figures
from capsjax.config.settings import NON_NEGATIVE, Setting, between
from capsjax.common.errors import UsageError
from capsjax.evaluators.adversarial import AdversarialEvaluator


def reconstruction_distance(images, reconstructions):
  """``|x - r|`` (L2 over every pixel and channel) per example, ``(batch, ...) -> (batch,)``."""
  difference = (images - reconstructions).reshape(images.shape[0], -1)
  return jnp.sqrt(jnp.sum(jnp.square(difference), axis=1))


class ReconstructionDetectionEvaluator(AdversarialEvaluator):
  """The false-positive and detection rates of a threshold on the reconstruction distance."""
  type_name = "reconstruction_detection"
  SETTINGS = {**AdversarialEvaluator.SETTINGS,
              "percentile": Setting(95.0, "The threshold's percentile of the validation "
                                    "distances.", check=between(0, 100, open_low=True,
                                                                open_high=True)),
              "validation_limit": Setting(0, "Validation examples the threshold is taken on "
                                          "(0: all).", check=NON_NEGATIVE)}

  def __init__(self, *args):
    super().__init__(*args)
    where = f"config.evals.{self.name}"
    if any(a not in self.attack_fns for a in self.attacks):
      raise UsageError(f"{where}.attacks={self.attacks!r}: detection runs capsjax's own "
                       "attacks (fgsm, pgd, bim, vote_fgsm, vote_pgd), not foolbox's.")
    if "reconstruction" not in self.batched.task.capabilities:
      raise UsageError(f"{where}: model {self.config.model.name!r} does not reconstruct its "
                       "input (no decoder), so it has nothing to detect with.")
    if self.batched.task.dataset.info.labels_per_example != 1:
      raise UsageError(f"{where}: detection by reconstruction needs one label per image.")
    validation = self.splits.get("validation")
    if validation is None or not len(validation):
      raise UsageError(f"{where}: the detection threshold is taken on a validation split, "
                       "never on the test set, and this run holds none; set "
                       "config.data.validation_size (e.g. 1000).")
    if self.setting("split") == "validation":
      raise UsageError(f"{where}.split='validation': the threshold is taken there; attack "
                       "the test split.")
    self.percentile = float(self.setting("percentile"))
    self.validation_set = self.batched.eval_set(validation.sample(self.count("validation_limit")))
    self.distances: dict[str, np.ndarray] = {}

  def measure(self, images, outputs) -> dict:
    return {"distance": reconstruction_distance(images, outputs.reconstructions)}

  def _clean_distance(self, variables, batch) -> dict:
    outputs = self.batched.task.forward(variables, batch, train=False).outputs
    return {"distance": reconstruction_distance(batch["images"], outputs.reconstructions)}

  def run(self, variables) -> dict:
    started = time.perf_counter()
    validation = self.batched.collect(self._clean_distance, variables,
                                     self.validation_set)["distance"]
    threshold = float(np.percentile(validation, self.percentile))
    result = {"threshold": threshold,
              "validation_false_positive_rate": float(np.mean(validation > threshold))}
    self.distances = {"validation": validation}
    for attack, fn in self.attack_fns.items():
      values = self.batched.collect(fn, variables, self.set, progress=f"{self.name}: {attack}")
      correct = values["clean_accuracy"]
      result["clean_accuracy"] = float(np.mean(correct))
      result["false_positive_rate"] = float(np.mean(values["clean_distance"] > threshold))
      self.distances["clean"] = values["clean_distance"]
      for key in values:
        if not key.endswith("_distance") or key == "clean_distance":
          continue
        tag = key[:-len("_distance")]
        flagged, fooled = values[key] > threshold, values[f"{tag}_fooled"] > 0
        result[f"{tag}_accuracy"] = float(np.mean(values[f"{tag}_accuracy"]))
        result[f"{tag}_success_rate"] = float(np.sum(fooled) / max(np.sum(correct), 1))
        result[f"{tag}_detection_rate"] = float(np.mean(flagged))
        if fooled.any():
          result[f"{tag}_detection_rate_successful"] = float(np.mean(flagged[fooled]))
        result[f"{tag}_undetected_success_rate"] = float(
            np.sum(fooled & ~flagged) / max(np.sum(correct), 1))
        self.distances[tag] = values[key]
    result.update(accuracy=result["clean_accuracy"], error=1.0 - result["clean_accuracy"],
                  chance=self.chance)
    return self._finished(result, started)

  def draw(self, model, workdir: str, writer, step: int) -> None:
    """``NAME_distances.png``: clean against attacked distances at the largest epsilon."""
    del model, writer, step
    if "clean" not in self.distances:
      return
    largest = max(self.epsilons)
    attacked = {f"{a} eps {largest:g}": self.distances[f"{a}_eps{largest:g}"] for a in self.attacks}
    figures.save_distance_histograms(
        os.path.join(workdir, f"{self.name}_distances.png"), self.distances["clean"], attacked,
        self.last_result["threshold"],
        f"{self.name}: {self.num_examples} test images; threshold = validation "
        f"{self.percentile:g}th percentile")


# Registered under these names in the config (capsjax/config/registries.py).
EVALUATORS = {"reconstruction_detection": ReconstructionDetectionEvaluator}
