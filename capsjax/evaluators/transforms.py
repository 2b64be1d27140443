"""Accuracy against how far the test images are moved from what training showed: rotation,
scale, shear and translation, each swept alone, and the rotation analogue of the novel-
viewpoint experiments (Hinton, Sabour & Frosst 2018, Sec. 5.1) that this CPU can measure.

    c.data.rotation_degrees, c.data.rotation_probability = 30.0, 1.0
    c.data.rotation_distribution = "uniform"          # train on every angle within +-30
    c.evals.transforms = dict(type="transforms", familiar_degrees=30.0, limit=1000)

The familiar rotations are those within +-``familiar_degrees`` (default
``config.data.rotation_degrees`` when training rotates, else 30), the range training covered;
the novel ones lie beyond it, up to 90 degrees: ``familiar_rotation_accuracy`` and
``novel_rotation_accuracy`` average the accuracies of the grid's angles in each range. As with
smallNORB's novel viewpoints, compare models at matched familiar accuracy
(:mod:`capsjax.stats.matched`), not at matched training steps.

Settings: :attr:`TransformsEvaluator.SETTINGS`, with their defaults (angles counter-clockwise,
scales on both axes, shears ``x += k y``, shifts horizontal in px, positive to the right; ``limit``
a fair sample).

Every transform is about the image centre, resampled bilinearly on the host with zero fill
(:func:`capsjax.datasets.affine.warp`; the canvas keeps its size, so large scales and shifts
cut the digit). It reports ``{kind}_{value:g}_accuracy`` for each, the familiar and novel
rotation accuracies, ``chance``, ``accuracy`` (the number the training log prints): the
novel-rotation accuracy, and ``seconds`` (its wall time, compilation included). After a run,
``NAME_curves.png`` plots the four sweeps, the familiar range shaded, chance dashed.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import numpy as np

from capsjax import datasets, evaluators
from capsjax.common import figures
from capsjax.config.settings import NON_NEGATIVE, POSITIVE, Setting, between, each
from capsjax.common.errors import UsageError
from capsjax.datasets import affine
from capsjax.runs import reporting

KINDS = ("rotations", "scales", "shears", "translations")


def transform(images: np.ndarray, kind: str, value: float) -> np.ndarray:
  """``images`` ``(n, h, w, c)`` uint8, every one moved by one transform about its centre."""
  n = len(images)
  zero, one, full = np.zeros(n), np.ones(n), np.full(n, value)
  # Per kind: the rotation (radians), shear, x and y scale; translations move right: (ty, tx).
  linear = {"rotations": (np.deg2rad(full), zero, one, one), "scales": (zero, zero, full, full),
            "shears": (zero, full, one, one), "translations": (zero, zero, one, one)}
  if kind not in linear:
    raise ValueError(f"unknown transform {kind!r}")
  translations = np.stack([zero, full if kind == "translations" else zero], axis=1)
  return affine.warp(images, affine.linear_part(*linear[kind]), translations, images.shape[1:3])


class TransformsEvaluator(evaluators.Evaluator):
  """Accuracy per rotation, scale, shear and translation; familiar against novel rotations."""
  type_name = "transforms"
  SETTINGS = {
      "rotations": Setting(tuple(float(d) for d in range(-90, 91, 15)), "Angles in degrees."),
      "scales": Setting(tuple(round(0.6 + 0.1 * k, 1) for k in range(9)), "Scale factors.",
                        check=each(POSITIVE)),
      "shears": Setting(tuple(round(-0.4 + 0.1 * k, 1) for k in range(9)), "Shears."),
      "translations": Setting(tuple(float(t) for t in range(-6, 7, 2)), "Shifts in px."),
      "familiar_degrees": Setting(None, "Rotations up to this are familiar; unset: the run's "
                                  "data.rotation_degrees, or 30 if it trains none.",
                                  kind=float | None, check=between(0, 90, open_high=True)),
      "split": Setting("test", "The split evaluated."),
      "limit": Setting(1000, "Examples (0: all).", check=NON_NEGATIVE),
  }

  def __init__(self, *args):
    super().__init__(*args)
    get, where = self.setting, f"config.evals.{self.name}"
    self.sweeps = {kind: tuple(float(v) for v in get(kind)) for kind in KINDS}
    familiar = get("familiar_degrees")
    if familiar is None:
      data = self.config.data
      familiar = float(data.rotation_degrees if "rotation_degrees" in data else 0) or 30.0
    self.familiar = float(familiar)
    rotations = self.sweeps["rotations"]
    if not (any(abs(a) <= self.familiar for a in rotations)
            and any(self.familiar < abs(a) <= 90 for a in rotations)):
      raise UsageError(f"{where}.rotations={rotations}: give angles within and beyond "
                       f"familiar_degrees={self.familiar:g} (up to 90).")
    sample = self._chosen_split().sample(self.count("limit"))
    if "images" not in sample.examples or sample.examples["images"].dtype != np.uint8:
      raise UsageError(f"{where}: type 'transforms' moves uint8 images; this dataset's "
                       "examples hold none.")
    self.num_examples = len(sample)
    self.sets = {(kind, value): self.batched.eval_set(datasets.Split(
        {**sample.examples, "images": transform(sample.examples["images"], kind, value)},
        sample.shared)) for kind, values in self.sweeps.items() for value in values}
    self.chance = self.batched.task.chance_levels()["accuracy"]

  def run(self, variables) -> dict:
    result = {}
    started = time.perf_counter()
    every = 1 if reporting.is_terminal(sys.stderr) else -(-len(self.sets) // 4)
    for n, ((kind, value), eval_set) in enumerate(self.sets.items(), 1):
      result[f"{kind[:-1]}_{value:g}_accuracy"] = self.batched.evaluate(
          variables, eval_set)["accuracy"]
      if jax.process_index() == 0 and (n % every == 0 or n == len(self.sets)):
        reporting.count_progress(f"{self.name}: transformed set", n, len(self.sets))
    angles = self.sweeps["rotations"]
    at = lambda a: result[f"rotation_{a:g}_accuracy"]
    result["familiar_rotation_accuracy"] = float(np.mean(
        [at(a) for a in angles if abs(a) <= self.familiar]))
    result["novel_rotation_accuracy"] = float(np.mean(
        [at(a) for a in angles if self.familiar < abs(a) <= 90]))
    result.update(accuracy=result["novel_rotation_accuracy"],
                  error=1.0 - result["novel_rotation_accuracy"], chance=self.chance)
    result["seconds"] = time.perf_counter() - started  # Compilation included.
    self.last_result = result
    return result

  def draw(self, model, workdir: str, writer, step: int) -> None:
    """``NAME_curves.png``: the last :meth:`run`'s accuracy against each transform."""
    del model, writer, step
    result = getattr(self, "last_result", None)
    if result is None:
      return
    curves = {kind: (values, [result[f"{kind[:-1]}_{v:g}_accuracy"] for v in values])
              for kind, values in self.sweeps.items()}
    figures.save_transform_curves(
        os.path.join(workdir, f"{self.name}_curves.png"), curves, self.chance, self.familiar,
        f"{self.name}: {self.num_examples} test images each")


# Registered (capsjax/config/registries.py): this module's name in the config.
EVALUATOR = TransformsEvaluator
