"""Robustness to affine transforms (paper Sec. 5.2): the real affNIST test set when its files
are given, and the offline stand-in "affine MNIST" built from the MNIST test digits."""

from __future__ import annotations

import os

import numpy as np

from capsjax import datasets, evaluators
from capsjax.common import figures
from capsjax.config.settings import POSITIVE, Setting, at_least
from capsjax.common.errors import UsageError
from capsjax.datasets import affine, affnist


class _ExamplesFigure:
  """Evaluates ``self.set``, and draws its first examples with the model's predictions."""
  figure_title = ""

  def run(self, params) -> dict:
    return self.batched.evaluate(params, self.set)

  def draw(self, model, workdir, writer, step):
    n = min(int(self.config.eval.num_figure_examples) * 2, self.set.size)
    if n == 0:
      return
    batch = self.builder.eval_batch({k: v[:n] for k, v in self.set.host.examples.items()},
                                    self.set.host.shared)
    outputs = model.apply(batch, train=False)
    path = os.path.join(workdir, f"{self.name}_examples.png")
    figures.save_examples(path, np.asarray(batch["images"]), np.asarray(batch["labels"]),
                          np.asarray(outputs.predictions), self.figure_title)
    if writer is not None:
      writer.write_image(f"{self.name}/examples", step, figures.tile(
          np.asarray(batch["images"])[None]))


class AffineMNISTEvaluator(_ExamplesFigure, evaluators.Evaluator):
  """The offline stand-in for affNIST: each test digit under ``transforms_per_digit`` random
  affine transforms (:mod:`capsjax.datasets.affine`), drawn with ``seed``; the ranges are
  ``rotation_degrees``, ``shear``, ``scale_min``/``scale_max``. ``config.data.test_limit``
  limits the number of transformed images."""
  SETTINGS = {
      "transforms_per_digit": Setting(1, "Random transforms of each test digit.",
                                      check=at_least(1)),
      "rotation_degrees": Setting(20.0, "Rotations uniform in +-this."),
      "shear": Setting(0.2, "Shears uniform in +-this."),
      "scale_min": Setting(0.8, "Scales uniform in [scale_min, scale_max] ...", check=POSITIVE),
      "scale_max": Setting(1.2, "... (affNIST's 0.8, 1.2).", check=POSITIVE),
      "seed": Setting(0, "Draws the transforms."),
  }

  def __init__(self, *args):
    super().__init__(*args)
    s, test = self.setting, self.splits["test"]
    per_digit = int(s("transforms_per_digit"))
    limit = int(self.config.data.test_limit)
    digits = test.sample(-(-limit // per_digit) if limit else 0)
    ranges = affine.AffineRanges(float(s("rotation_degrees")), float(s("shear")),
                                 (float(s("scale_min")), float(s("scale_max"))))
    canvas = tuple(self.builder.info.image_shape[:2])
    images, labels = affine.random_affine(digits.examples["images"], digits.examples["labels"],
                                          per_digit, canvas, ranges, int(s("seed")))
    transformed = self.limited(datasets.Split({"images": images, "labels": labels}))
    self.set = self.batched.eval_set(transformed, self.builder.eval_batch)
    self.figure_title = (f"affine MNIST (a stand-in for affNIST, made here): rotation "
                         f"+-{ranges.rotation_degrees:g} deg, shear +-{ranges.shear:g}, scale "
                         f"{ranges.scale[0]:g}-{ranges.scale[1]:g}; (label, prediction)")


class AffNISTEvaluator(_ExamplesFigure, evaluators.Evaluator):
  """The real affNIST test set from ``path`` (``test.mat`` or the folder of test batches);
  skipped, with a message, while ``path`` is unset."""
  SETTINGS = {"path": Setting("", "test.mat or the folder of test batches (\"\": skipped).")}

  figure_title = "affNIST test set; (label, prediction)"

  def __init__(self, *args):
    super().__init__(*args)
    path = self.setting("path")
    if not path:
      raise evaluators.SkipEvaluation(
          f"no affNIST files given; set --config.evals.{self.name}.path=PATH to test.mat or "
          "the folder of test batches (https://www.cs.toronto.edu/~tijmen/affNIST/).")
    images, labels = affnist.load(path, self.builder.info.num_classes)
    expected = tuple(self.builder.info.image_shape)
    if images.shape[1:] != expected:
      raise UsageError(f"config.evals.{self.name}: its images are {images.shape[1:]} but the "
                       f"model takes {expected} (config.model.image_shape).")
    self.set = self.batched.eval_set(
        self.limited(datasets.Split({"images": images, "labels": labels})),
        self.builder.eval_batch)


# Registered under these names in the config (capsjax/config/registries.py).
EVALUATORS = {"affine_mnist": AffineMNISTEvaluator, "affnist": AffNISTEvaluator}
