"""MNIST-format digits with random shifts (paper Sec. 5), and expanded MNIST (Sec. 5.2).

``config.dataset = "mnist"`` serves any grey image/label set read by :mod:`capsjax.datasets.sources`
(MNIST, Fashion-MNIST, IDX folders). Training shifts every image by up to
``config.data.shift_pixels`` px with zero fill, inside the jitted step (the paper: 2 px).

``config.data.pad > 0`` centres each digit on a black canvas ``pad`` px larger on every side, once,
on the host. With ``shift_pixels == pad`` the training shift then places each digit at a uniformly
random position of the canvas: the paper's "expanded MNIST" for the affNIST experiment (each 28x28
digit on a 40x40 background; the official code builds it with ``--pad=6 --shift=6``). The test split
stays centred.

Efficient-CapsNet's augmentation (:mod:`capsjax.datasets.digit_augment`: rotation, shift within the
digit's margins, squeeze, erasure; ``config.data.rotation_degrees``, ``margin_shift``, ``squeeze``,
``erase_size``, all off by default) runs before the shifts, in training only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from capsjax import datasets
from capsjax.config import settings as settings_lib
from capsjax.config.settings import NON_NEGATIVE, Rule, Setting
from capsjax.datasets import augment, digit_augment, sources

# The shifts of the digit datasets (MNIST's and MultiMNIST's ``config.data``).
SHIFT_SETTINGS = {
    "data.shift_pixels": Setting(kind=int, meaning="Training shifts of up to N px in x and y, "
                                 "zero filled (the paper's 2).", check=NON_NEGATIVE),
    "data.pad": Setting(0, "Digits centred on a canvas this many px larger per side.",
                        check=NON_NEGATIVE),
}
SHIFT_RULES = (Rule(("data.pad", "data.shift_pixels"), lambda pad, shift: not pad or shift <= pad,
                    "shift_pixels <= pad where pad > 0 (else shifts push digits off the "
                    "canvas)"),)


class MNIST(datasets.Builder):
  """28x28 grey images and one of 10 labels each; the batches' images are
  ``28 + 2 * data.pad`` px square."""
  FILE_SHAPE = (28, 28, 1)
  NUM_CLASSES = 10
  SETTINGS = {**sources.SETTINGS, **SHIFT_SETTINGS,
              **settings_lib.prefixed("data", digit_augment.SETTINGS)}
  RULES = SHIFT_RULES

  def __init__(self, config):
    super().__init__(config)
    d = config.data
    self.pad, self.shift = int(d.pad), int(d.shift_pixels)
    settings_lib.check_rules(SHIFT_RULES, {"data.pad": self.pad, "data.shift_pixels": self.shift})
    augmentation = digit_augment.Settings.from_config(d)
    # Efficient-CapsNet's augmentation, or None: decided here, not in every traced step.
    self.digit_augment = augmentation if augmentation.active else None
    h, w, c = self.FILE_SHAPE
    self.info = datasets.DatasetInfo((h + 2 * self.pad, w + 2 * self.pad, c), self.NUM_CLASSES)

  def describe(self) -> str:
    """As every builder, named by ``config.data.name`` (this builder reads MNIST and
    Fashion-MNIST)."""
    text = super().describe()
    name = self.config.data.name
    return name + text[len(self.name):] if name else text

  def load(self) -> dict[str, datasets.Split]:
    splits = sources.load(self.config.data, self.FILE_SHAPE, self.info.num_classes,
                          seed=self.config.seed,
                          shape_source=f"the {self.name!r} dataset's image shape")
    for split in splits.values():
      split.examples["images"] = augment.pad_images(split.examples["images"], self.pad)
    return splits

  def _digits(self, key, indices, examples):
    """``(images, key)``: the train digits ``indices`` as floats, through Efficient-CapsNet's
    augmentation where it is set, and the key left for the shifts."""
    images = augment.to_float(examples["images"][indices])
    if self.digit_augment is not None:
      digit_key, key = jax.random.split(key)
      images = digit_augment.augment(digit_key, images, self.digit_augment)
    return images, key

  def train_batch(self, key, indices, examples, shared):
    del shared
    images, key = self._digits(key, indices, examples)
    return {"images": augment.random_shift(key, images, self.shift),
            "labels": examples["labels"][indices]}

  def stream_copies(self) -> int:
    """The official code's file holds each digit's (2 shift + 1)^2 shifts in a row."""
    return (2 * self.shift + 1) ** 2

  def train_stream_batch(self, key, indices, copies, examples, shared):
    """Copy k of a digit is the official code's k-th shift (``mnist_shift.py:109-123``): down
    by ``k // (2 shift + 1) - shift`` px, right by ``k % (2 shift + 1) - shift``."""
    del shared
    images, _ = self._digits(key, indices, examples)
    side = 2 * self.shift + 1
    shifts = jnp.stack([copies % side - self.shift, copies // side - self.shift], axis=-1)
    return {"images": augment.shift_by(images, shifts, self.shift),
            "labels": examples["labels"][indices]}


# Registered (capsjax/config/registries.py): this module's name in the config.
DATASET = MNIST
