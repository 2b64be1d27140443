"""Natural images through tensorflow-datasets: CIFAR-10, SVHN and smallNORB (paper Sec. 7).

Each is read once with tfds and kept on the device as uint8; the official code's preprocessing
(Sarasra/models research/capsules/input_data: cifar10_input.py, norb_input_record.py) runs inside
the jitted step, each part a ``config.data`` value (``crop``, ``flip``, ``brightness``,
``contrast_lower/upper``, ``standardize``; :attr:`TFDSImages.SETTINGS` says what each does).

Pixels stay in 0..255 until standardisation, as in the official code, so its ranges (brightness
63, contrast 0.2-1.8) apply unchanged. smallNORB's two stereo views are the two channels of one
image; ``resize`` shrinks its 96x96 images on the host first (48 in the official code; by
averaging pixel blocks, where the official code used TF's bilinear resize).

Without network access, point ``config.data.dir`` at the downloaded archives (tfds's manual dir)
or ``config.data.tfds_data_dir`` at prepared data.
"""
from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from capsjax import datasets
from capsjax.config.settings import NON_NEGATIVE, Setting, one_of
from capsjax.common.errors import UsageError
from capsjax.datasets import sources


def random_crop(key, images, size: int):
  """A ``size`` x ``size`` patch of each image at a uniformly random position."""
  batch, h, w, c = images.shape
  offsets = jax.random.randint(key, (batch, 2), 0, jnp.asarray([h - size + 1, w - size + 1]))
  return jax.vmap(lambda image, o: jax.lax.dynamic_slice(image, (o[0], o[1], 0),
                                                         (size, size, c)))(images, offsets)


def centre_crop(images, size: int):
  """The central ``size`` x ``size`` patch (offset ``(h - size) // 2``, as TF's
  ``resize_image_with_crop_or_pad``)."""
  return crop_at(images, size, 0, 0)


def crop_at(images, size: int, dy, dx):
  """The ``size`` x ``size`` patch whose centre is ``(dy, dx)`` px from the central patch's
  (TF's ``extract_glimpse(centered=True, normalized=False)``, as the matrix-capsule code's
  ``--patching`` takes them). ValueError if it leaves the image. ``dy``, ``dx`` may be traced
  (one compiled program for every offset); then the caller checks the bounds, since a
  ``dynamic_slice`` would clamp an offset that leaves the image."""
  h, w = images.shape[1:3]
  top, left = (h - size) // 2 + dy, (w - size) // 2 + dx
  if isinstance(dy, (int, np.integer)) and isinstance(dx, (int, np.integer)):
    if not (0 <= top <= h - size and 0 <= left <= w - size):
      raise ValueError(f"a {size}x{size} crop at offset ({dy}, {dx}) leaves the {h}x{w} "
                       "image.")
    return images[:, top:top + size, left:left + size]
  start = (0, top, left) + (0,) * (images.ndim - 3)
  return jax.lax.dynamic_slice(images, start, (images.shape[0], size, size, *images.shape[3:]))


def random_flip(key, images):
  """Each image mirrored left-right with probability 1/2."""
  flip = jax.random.bernoulli(key, 0.5, (images.shape[0],))
  return jnp.where(flip[:, None, None, None], images[:, :, ::-1], images)


def random_brightness(key, images, max_delta: float):
  """Each image plus one delta uniform in [-max_delta, max_delta]."""
  delta = jax.random.uniform(key, (images.shape[0], 1, 1, 1), minval=-max_delta, maxval=max_delta)
  return images + delta


def random_contrast(key, images, lower: float, upper: float):
  """Each image's channels scaled about their means by one factor uniform in [lower, upper]."""
  factor = jax.random.uniform(key, (images.shape[0], 1, 1, 1), minval=lower, maxval=upper)
  mean = jnp.mean(images, axis=(1, 2), keepdims=True)
  return (images - mean) * factor + mean


def standardize(images):
  """``(x - mean) / max(std, 1 / sqrt(n))`` per image (``tf.image.per_image_standardization``)."""
  n = np.prod(images.shape[1:])
  mean = jnp.mean(images, axis=(1, 2, 3), keepdims=True)
  std = jnp.std(images, axis=(1, 2, 3), keepdims=True)
  return (images - mean) / jnp.maximum(std, 1.0 / np.sqrt(n))


def block_mean(images: np.ndarray, size: int) -> np.ndarray:
  """Host-side downsampling of ``(n, h, w, c)`` uint8 images to ``size`` x ``size`` by averaging
  ``h / size`` blocks (h must be a multiple of size)."""
  n, h, w, c = images.shape
  if h % size or w % size:
    raise UsageError(f"config.data.resize={size} must divide the image size {h}x{w}.")
  blocks = images.reshape(n, size, h // size, size, w // size, c).astype(np.float32)
  return np.rint(blocks.mean(axis=(2, 4))).astype(np.uint8)


class TFDSImages(datasets.Builder):
  """Base of the natural-image builders; subclasses name the tfds features and the order of
  the training distortions."""
  SETTINGS: ClassVar[dict] = {
      **sources.SETTINGS,
      "data.resize": Setting(0, "Resize to this many px square first (0: as stored).",
                             check=NON_NEGATIVE),
      "data.crop": Setting(kind=int, meaning="Random N x N crops in training, the centre one "
                           "in evaluation (0: none).", check=NON_NEGATIVE),
      "data.flip": Setting(kind=bool, meaning="Random left-right flips in training."),
      "data.brightness": Setting(kind=float, meaning="Adds a delta uniform in +-this (pixels "
                                 "0..255; 0: none).", check=NON_NEGATIVE),
      "data.contrast_lower": Setting(kind=float, meaning="Each channel scaled about its mean by "
                                     "a factor uniform in [lower, upper] ...",
                                     check=NON_NEGATIVE),
      "data.contrast_upper": Setting(kind=float, meaning="... (1, 1: none).",
                                     check=NON_NEGATIVE),
      "data.standardize": Setting(kind=bool, meaning="tf.image.per_image_standardization "
                                  "(train and evaluation)."),
  }
  IMAGE_KEYS: ClassVar[tuple[str, ...]] = ("image",)
  LABEL_KEY: ClassVar[str] = "label"
  STORED_SHAPE: ClassVar[tuple[int, int, int]] = (32, 32, 3)
  NUM_CLASSES: ClassVar[int] = 10
  TRAIN_OPS: ClassVar[tuple[str, ...]] = ("crop", "flip", "brightness", "contrast")

  def __init__(self, config):
    super().__init__(config)
    d = config.data
    if d.source != "tfds":
      raise UsageError(f"config.dataset={self.name!r} reads tensorflow-datasets only; set "
                       f"config.data.source='tfds' (got {d.source!r}).")
    h, w, c = self.STORED_SHAPE
    self.resize = int(d.resize)
    if self.resize:
      h = w = self.resize
    self.stored_shape = (h, w, c)
    self.crop = int(d.crop)
    if not 0 <= self.crop <= min(h, w):
      raise UsageError(f"config.data.crop={self.crop} must lie in [0, {min(h, w)}] for "
                       f"{h}x{w} images (0: no crop).")
    side = self.crop or h
    self.info = datasets.DatasetInfo((side, side if self.crop else w, c), self.NUM_CLASSES)

  def train_spec(self):
    return {"images": jax.ShapeDtypeStruct(self.stored_shape, np.uint8),
            "labels": jax.ShapeDtypeStruct((), np.int32)}

  def load(self, partition=None) -> dict[str, datasets.Split]:
    splits = sources.load(self.config.data, self.STORED_SHAPE, self.info.num_classes,
                          seed=self.config.seed, shape_source=f"the {self.name} images",
                          image_keys=self.IMAGE_KEYS, label_key=self.LABEL_KEY, idx_ok=False,
                          partition=partition)
    if self.resize:
      for split in splits.values():
        split.examples["images"] = block_mean(split.examples["images"], self.resize)
    return splits

  def train_batch(self, key, indices, examples, shared):
    del shared
    d = self.config.data
    images = examples["images"][indices].astype(jnp.float32)  # 0..255, as the official code.
    for op, op_key in zip(self.TRAIN_OPS, jax.random.split(key, len(self.TRAIN_OPS))):
      if op == "crop" and self.crop:
        images = random_crop(op_key, images, self.crop)
      elif op == "flip" and d.flip:
        images = random_flip(op_key, images)
      elif op == "brightness" and d.brightness:
        images = random_brightness(op_key, images, float(d.brightness))
      elif op == "contrast" and (d.contrast_lower, d.contrast_upper) != (1.0, 1.0):
        images = random_contrast(op_key, images, float(d.contrast_lower), float(d.contrast_upper))
    return {"images": self._finish(images), "labels": examples["labels"][indices]}

  def eval_batch(self, examples, shared):
    del shared
    images = _pixels(examples["images"])
    if self.crop:
      images = centre_crop(images, self.crop)
    return {"images": self._finish(images), "labels": examples["labels"]}

  def eval_batch_moved(self, examples, shared):
    """An ``eval_batch`` whose crop is moved from the centre by ``shared["crop_offset"]``
    (``(dy, dx)`` px, int32, :func:`crop_at`), for evaluations that average over crops: the
    offset is an argument of the compiled step, so every crop runs one program. The caller
    checks that the offset stays inside the image."""
    if not self.crop:
      raise UsageError(f"config.dataset={self.name!r} has no crop (config.data.crop=0): "
                       "there is nothing to move.")
    offset = shared["crop_offset"]
    images = crop_at(_pixels(examples["images"]), self.crop, offset[0], offset[1])
    return {"images": self._finish(images), "labels": examples["labels"]}

  def _finish(self, images):
    return standardize(images) if self.config.data.standardize else images / 255.0


def _pixels(images):
  """Pixels as floats in 0..255; floats are pixels in [0, 1] (``Builder.eval_batch``)."""
  return (images * 255.0 if jnp.issubdtype(images.dtype, jnp.floating)
          else images.astype(jnp.float32))


class CIFAR10(TFDSImages):
  """CIFAR-10: 32x32 RGB, 10 classes; crop, flip, brightness, contrast (official order)."""


class SVHN(TFDSImages):
  """SVHN's cropped digits (tfds ``svhn_cropped``): 32x32 RGB, 10 classes."""


def azimuth_degrees(label_azimuth: np.ndarray) -> np.ndarray:
  """tfds ``smallnorb``'s ``label_azimuth`` (0..17: the files' 0, 2, ..., 34 halved by tfds)
  in degrees: 0, 20, ..., 340 (the dataset's documentation: file value x 10)."""
  return np.asarray(label_azimuth) * 20


def elevation_degrees(label_elevation: np.ndarray) -> np.ndarray:
  """tfds ``smallnorb``'s ``label_elevation`` (0..8) in degrees: 30, 35, ..., 70."""
  return 30 + 5 * np.asarray(label_elevation)


# The training viewpoints of Hinton, Sabour & Frosst 2018, Sec. 5.1: azimuths 300-40 degrees
# (a third of them), the 3 lowest elevations (of 9).
FAMILIAR_VIEWPOINTS = {
    "azimuth": ("label_azimuth",
                lambda f: np.isin(azimuth_degrees(f["label_azimuth"]), (300, 320, 340, 0, 20, 40))),
    "elevation": ("label_elevation", lambda f: elevation_degrees(f["label_elevation"]) <= 40),
}
NOVEL_SPLIT = "novel_viewpoints"


class SmallNORB(TFDSImages):
  """smallNORB: the two 96x96 stereo views as two channels, the 5 categories as labels;
  brightness and contrast before the crop (official order), no flip.

  ``config.data.viewpoint_split`` = ``"azimuth"`` or ``"elevation"``: the novel-viewpoint
  experiments of the matrix-capsules paper (Sec. 5.1). Training (and validation) keep the
  images at the familiar viewpoints (azimuths 300, 320, 340, 0, 20, 40; or elevations 30, 35,
  40), ``test`` the test images at those viewpoints, and the split ``novel_viewpoints`` the
  test images at the others (azimuths 60-280; elevations 45-70): evaluate it with
  ``config.evals.novel_viewpoints = dict(type="split", split="novel_viewpoints")``."""
  IMAGE_KEYS = ("image", "image2")
  LABEL_KEY = "label_category"
  STORED_SHAPE = (96, 96, 2)
  NUM_CLASSES = 5
  TRAIN_OPS = ("brightness", "contrast", "crop")
  SETTINGS = {**TFDSImages.SETTINGS,
              "data.viewpoint_split": Setting("", "Train and test on these viewpoints: "
                                              "\"azimuth\" | \"elevation\" (\"\": all).",
                                              check=one_of("", *FAMILIAR_VIEWPOINTS))}

  def __init__(self, config):
    super().__init__(config)
    self.viewpoint_split = config.data.viewpoint_split
    evals = config.evals
    if self.viewpoint_split and not any(
        (evals[name].get("split") if hasattr(evals[name], "get") else None) == NOVEL_SPLIT
        for name in evals):
      # Else the run's "test accuracy" would cover the familiar views alone, with no word.
      raise UsageError(
          f"config.data.viewpoint_split={self.viewpoint_split!r} holds the novel viewpoints "
          "out of training, and config.evals evaluates none of them. Use the variant "
          f"--config=configs/smallnorb.py:{self.viewpoint_split} (it evaluates them as "
          f"'{NOVEL_SPLIT}' and holds out a validation split), or add "
          f"--config.evals.{NOVEL_SPLIT}=... with split='{NOVEL_SPLIT}'.")

  def load(self) -> dict[str, datasets.Split]:
    if not self.viewpoint_split:
      return super().load()
    key, familiar = FAMILIAR_VIEWPOINTS[self.viewpoint_split]
    return super().load(partition=((key,), familiar, NOVEL_SPLIT))


# Registered under these names in the config (capsjax/config/registries.py).
DATASETS = {"cifar10": CIFAR10, "svhn": SVHN, "smallnorb": SmallNORB}
