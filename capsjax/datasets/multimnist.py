"""MultiMNIST (paper Sec. 6): two overlapping MNIST digits of different classes per image.

``config.dataset = "multimnist"``. Each example overlays two digits of different classes from the
same split: each is centred on a canvas ``data.pad`` px larger on every side (36x36 for the paper's
4), moved by up to ``data.shift_pixels`` (4) px in x and y independently, and the two are added and
clipped at 255, as the official generator does (``min(a + b, 255)``, Sarasra/models
research/capsules/input_data/mnist/mnist_shift.py). Each digit's own shifted image is kept: it is
the reconstruction target of its capsule.

Training draws fresh pairs every step, inside the jitted step, from the MNIST training digits on the
device: the first digit of each pair follows the epoch's permutation, its partner is drawn uniformly
from the digits of the other classes (the official generator: 1,000 partners per digit, drawn once).
Validation and test sets are fixed, deterministic given ``data.pair_seed``: ``data.pairs_per_digit``
partners per digit (the paper: 1,000, i.e. 10M test pairs), stored as indices and shifts and
composed on the device when evaluated; ``data.test_limit`` limits their size.

A batch holds ``images`` (the merged pair), ``labels`` ``(batch, 2)`` and ``digit_images``
``(batch, 2, h, w, 1)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from capsjax import datasets
from capsjax.common.errors import UsageError
from capsjax.config.settings import POSITIVE, Setting
from capsjax.datasets import augment, sources
from capsjax.datasets.mnist import SHIFT_SETTINGS

DIGIT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10


def partner_table(labels: np.ndarray, num_classes: int) -> dict[str, np.ndarray]:
  """Indices sorted by class (``order``), where each class starts (``starts``) and its size
  (``counts``): enough to draw a digit of another class in O(1) on the device."""
  order = np.argsort(labels, kind="stable").astype(np.int32)
  counts = np.bincount(labels, minlength=num_classes).astype(np.int32)
  starts = (np.cumsum(counts) - counts).astype(np.int32)
  return {"order": order, "starts": starts, "counts": counts}


def draw_partners(uniform, first_labels, order, starts, counts):
  """Digits drawn uniformly from those whose class differs from ``first_labels``.

  ``uniform`` in [0, 1) picks position ``r`` among the ``n - counts[c]`` other digits;
  positions at or after class ``c``'s block skip over it. Works with NumPy and JAX arrays.
  """
  n = order.shape[0]
  others = n - counts[first_labels]
  r = (uniform * others).astype(np.int32)
  r = r + counts[first_labels] * (r >= starts[first_labels])
  return order[r]


def merge(first, second):
  """``min(a + b, 255)`` of two uint8 images, as uint8 (the official generator's merge)."""
  total = first.astype(np.int32) + second.astype(np.int32)
  return (np.minimum if isinstance(total, np.ndarray) else jnp.minimum)(total, 255).astype(np.uint8)


class MultiMNIST(datasets.Builder):
  """Two overlapping digits per image; see the module docstring."""
  SETTINGS = {
      **sources.SETTINGS, **SHIFT_SETTINGS,
      "data.pairs_per_digit": Setting(kind=int, meaning="Fixed test pairs per test digit "
                                      "(paper: 1,000).", check=POSITIVE),
      "data.pair_seed": Setting(kind=int, meaning="Draws the fixed test (and validation) "
                                "pairs."),
  }

  def __init__(self, config):
    super().__init__(config)
    d = config.data
    self.pad, self.shift = int(d.pad), int(d.shift_pixels)
    self.pairs_per_digit, self.pair_seed = int(d.pairs_per_digit), int(d.pair_seed)
    if self.shift > self.pad:
      raise UsageError(f"config.data.shift_pixels={self.shift} must lie in [0, config.data.pad="
                       f"{self.pad}] so that shifted digits stay on the canvas.")
    side = DIGIT_SHAPE[0] + 2 * self.pad
    self.info = datasets.DatasetInfo((side, side, 1), NUM_CLASSES, labels_per_example=2)

  def train_shared(self, examples):
    """The partner table: training pairs are drawn from it on the device."""
    return partner_table(examples["labels"], self.info.num_classes)

  def eval_split_like(self, split):
    """Fixed pairs of a train split's digits, in the layout of the test split."""
    return datasets.Split(self.fixed_pairs(split.examples["labels"], seed=self.pair_seed),
                          {"digits": split.examples["images"],
                           "digit_labels": split.examples["labels"]})

  def load(self) -> dict[str, datasets.Split]:
    data = ml_collections.ConfigDict(self.config.data)  # A copy (of a frozen one too).
    data.test_limit = 0  # It limits the pairs below, not the digits they are made of.
    digits = sources.load(data, DIGIT_SHAPE, self.info.num_classes, seed=self.config.seed)
    splits = {}
    for name, split in digits.items():
      images = augment.pad_images(split.examples["images"], self.pad)
      labels = split.examples["labels"]
      if name == "train":
        examples = {"images": images, "labels": labels}
        splits[name] = datasets.Split(examples, self.train_shared(examples))
        continue
      pairs = self.fixed_pairs(labels, seed=self.pair_seed + (name == "validation"))
      pairs = datasets.Split(pairs).sample(int(self.config.data.test_limit or 0)).examples
      splits[name] = datasets.Split(pairs, {"digits": images, "digit_labels": labels})
    return splits

  def fixed_pairs(self, labels: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """``pairs_per_digit`` pairs per digit (digit-major): indices and both digits' shifts."""
    if not len(labels):
      return {"first": np.zeros(0, np.int32), "second": np.zeros(0, np.int32),
              "shifts": np.zeros((0, 2, 2), np.int32)}
    if len(np.unique(labels)) < 2:
      raise UsageError("MultiMNIST needs digits of at least two classes in each split.")
    rng = np.random.default_rng(seed)
    n = len(labels) * self.pairs_per_digit
    first = np.repeat(np.arange(len(labels), dtype=np.int32), self.pairs_per_digit)
    table = partner_table(labels, self.info.num_classes)
    second = draw_partners(rng.uniform(size=n), labels[first], **table)
    shifts = rng.integers(-self.shift, self.shift + 1, size=(n, 2, 2)).astype(np.int32)
    return {"first": first, "second": second, "shifts": shifts}

  def train_batch(self, key, indices, examples, shared):
    partner_key, first_key, second_key = jax.random.split(key, 3)
    labels = examples["labels"]
    partners = draw_partners(jax.random.uniform(partner_key, indices.shape), labels[indices],
                             shared["order"], shared["starts"], shared["counts"])
    first = augment.random_shift(first_key, examples["images"][indices], self.shift)
    second = augment.random_shift(second_key, examples["images"][partners], self.shift)
    return self._batch(first, second, jnp.stack([labels[indices], labels[partners]], axis=1))

  def eval_batch(self, examples, shared):
    digits = shared["digits"]
    first = augment.shift_by(digits[examples["first"]], examples["shifts"][:, 0], self.shift)
    second = augment.shift_by(digits[examples["second"]], examples["shifts"][:, 1], self.shift)
    labels = shared["digit_labels"]
    return self._batch(first, second,
                       jnp.stack([labels[examples["first"]], labels[examples["second"]]], 1))

  def reconstruction_targets(self, batch: dict) -> jax.Array:
    """Each digit's own image, ``(batch, 2, h, w, 1)`` (paper Sec. 6: each digit is
    reconstructed from the capsule of its label)."""
    return batch["digit_images"]

  @staticmethod
  def _batch(first, second, labels) -> dict:
    return {"images": augment.to_float(merge(first, second)), "labels": labels,
            "digit_images": augment.to_float(jnp.stack([first, second], axis=1))}


# Registered (capsjax/config/registries.py): this module's name in the config.
DATASET = MultiMNIST
