"""Evaluations of the dataset's own splits: as they are, on a grid of shifts, or shifted once
at random (a fixed copy)."""

from __future__ import annotations

import copy

import jax
import numpy as np

from capsjax import datasets, evaluators
from capsjax.config.settings import NON_NEGATIVE, Setting
from capsjax.common.errors import UsageError
from capsjax.datasets import augment
from capsjax.runs import predictions, reporting


SPLIT = Setting("test", "The split evaluated: test, or validation where the run holds one out.")


def _images_of(evaluator: evaluators.Evaluator, split: datasets.Split) -> np.ndarray:
  if "images" not in split.examples:
    raise UsageError(f"config.evals.{evaluator.name}: type {evaluator.type_name!r} moves "
                     "images, but this dataset's examples hold none.")
  return split.examples["images"]


class SplitEvaluator(evaluators.Evaluator):
  """A split of the dataset (``split``: ``test`` or ``validation``) as it is; the runs keep
  its predictions per example (:mod:`capsjax.runs.predictions`)."""
  SETTINGS = {"split": SPLIT}

  def __init__(self, *args):
    super().__init__(*args)
    self.set = self.batched.eval_set(self.limited(self._chosen_split()), self.builder.eval_batch)

  def run(self, params) -> dict:
    return self.run_and_predict(params)[0]

  def sampled(self, n: int) -> evaluators.Evaluator:
    """The first ``n`` of a fixed permutation of the examples evaluated (nested in them)."""
    if not n or n >= len(self.set.host):
      return self
    sample = copy.copy(self)
    sample.set = self.batched.eval_set(self.set.host.sample(n), self.builder.eval_batch)
    sample.examples = n
    return sample

  def run_and_predict(self, params) -> tuple[dict, predictions.Predictions]:
    metrics, per_example, outputs = self.batched.evaluate_examples(params, self.set)
    return metrics, predictions.Predictions.of(
        self.set.host, outputs["scores"], per_example["accuracy"], outputs["labels"],
        self.builder.info.labels_per_example)


class ShiftGridEvaluator(evaluators.Evaluator):
  """The split moved by every (dx, dy) with ``|dx|, |dy| <= max_shift`` px (zero fill, as
  the training shifts): ``accuracy`` is the mean over the shifts, ``accuracy_by_shift``
  maps ``"dx,dy"`` to each one's accuracy."""
  SETTINGS = {"split": SPLIT,
              "max_shift": Setting(2, "Every shift up to this many px.",
                                   check=NON_NEGATIVE)}

  def __init__(self, *args):
    super().__init__(*args)
    self.split = self.limited(self._chosen_split())
    images = _images_of(self, self.split)
    self.max_shift = int(self.setting("max_shift"))
    largest = min(images.shape[1:3]) - 1
    if not 0 <= self.max_shift <= largest:
      raise UsageError(f"max_shift={self.max_shift} (config.evals.{self.name}): use 0 up to "
                       f"{largest} pixels.")
    self.shifts = [(dx, dy) for dy in range(-self.max_shift, self.max_shift + 1)
                   for dx in range(-self.max_shift, self.max_shift + 1)]

  def run(self, params) -> dict:
    images = self.split.examples["images"]
    accuracies = {}
    for n, (dx, dy) in enumerate(self.shifts, 1):
      moved = self.batched.eval_set(self.split.with_examples(
          images=augment.shift_images(images, dx, dy)), self.builder.eval_batch)
      accuracies[f"{dx},{dy}"] = self.batched.evaluate(params, moved)["accuracy"]
      if jax.process_index() == 0:
        reporting.count_progress(f"{self.name}: shift", n, len(self.shifts))
    mean = float(np.mean(list(accuracies.values())))
    return {"accuracy": mean, "error": 1.0 - mean, "accuracy_by_shift": accuracies}


def shift_table(accuracies: dict[str, float], max_shift: int) -> str:
  """Accuracies (%) as a grid: a row per dy, a column per dx."""
  shifts = range(-max_shift, max_shift + 1)
  lines = ["test accuracy (%) by shift; rows dy (down +), columns dx (right +):",
           "dy\\dx " + "".join(f"{dx:>7d}" for dx in shifts)]
  for dy in shifts:
    lines.append(f"{dy:>5d} " + "".join(f"{100 * accuracies[f'{dx},{dy}']:>7.2f}" for dx in shifts))
  return "\n".join(lines)


class RandomlyShiftedEvaluator(evaluators.Evaluator):
  """One fixed copy of the split, each image shifted by a random (dx, dy) with
  ``|dx|, |dy| <= max_shift`` (default ``config.data.shift_pixels``), drawn with ``seed``.

  On expanded MNIST (``data.pad`` = ``shift_pixels`` = 6) this is the test set with every
  digit at a random position of the 40x40 canvas, like the training images.
  """
  SETTINGS = {"split": SPLIT,
              "max_shift": Setting(None, "Shifts up to this many px; unset: the run's "
                                   "data.shift_pixels.", kind=int | None, check=NON_NEGATIVE),
              "seed": Setting(0, "Draws the shifts.")}

  def __init__(self, *args):
    super().__init__(*args)
    split = self.limited(self._chosen_split())
    images = _images_of(self, split)
    max_shift = self.setting("max_shift")
    max_shift = int(self.config.data.shift_pixels if max_shift is None else max_shift)
    rng = np.random.default_rng(int(self.setting("seed")))
    self.shifts = rng.integers(-max_shift, max_shift + 1, size=(len(split), 2))
    moved = split.with_examples(images=augment.shift_each_image(images, self.shifts))
    self.set = self.batched.eval_set(moved, self.builder.eval_batch)

  def run(self, params) -> dict:
    return self.batched.evaluate(params, self.set)


# Registered under these names in the config (capsjax/config/registries.py).
EVALUATORS = {"split": SplitEvaluator, "shifted": ShiftGridEvaluator,
              "randomly_shifted": RandomlyShiftedEvaluator}
