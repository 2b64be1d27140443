"""A dataset of one's own, named by import path: generated bars, four orientations.

    python -m capsjax.main --config=examples/config.py:dataset --workdir=/tmp/ex_data
    # in any config: config.dataset = "examples/bars_dataset.py:Bars"

A dataset is a :class:`capsjax.datasets.Builder` (the interface is in
``capsjax/datasets/__init__.py``): ``info`` (image shape, classes) set in ``__init__``, and
``load()`` returning host arrays of the splits. The defaults of ``train_batch`` and
``eval_batch`` (uint8 pixels to floats in [0, 1], no augmentation) serve it; override them
for augmentation inside the jitted step.

Each image is ``config.data.size`` px square, black, with one bright bar of 5 to 8 px at a
random position: horizontal (class 0), vertical (1), diagonal (2) or anti-diagonal (3), plus
uniform noise up to ``config.data.noise`` (of 255). Chance is 25%. Train and test sets
(``config.data.num_train``, ``num_test``) are drawn with ``config.data.seed`` and
``seed + 1``: a generated stand-in for tests and examples, not a benchmark.
"""

import numpy as np

from capsjax import datasets
from capsjax.common.errors import UsageError

_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))  # (dy, dx) per class.


def draw_bars(n: int, size: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """``n`` images ``(n, size, size, 1)`` uint8 and their labels ``(n,)`` int32."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, len(_DIRECTIONS), n).astype(np.int32)
  lengths = rng.integers(5, 9, n)
  images = rng.uniform(0, noise, (n, size, size)).astype(np.float32)
  for k, (label, length) in enumerate(zip(labels, lengths)):
    dy, dx = _DIRECTIONS[label]
    y0 = rng.integers(0, size - dy * (length - 1))
    x_lo, x_hi = (0, size - dx * (length - 1)) if dx >= 0 else (length - 1, size)
    x0 = rng.integers(x_lo, x_hi)
    steps = np.arange(length)
    images[k, y0 + dy * steps, x0 + dx * steps] = 255.0
  return images.round().astype(np.uint8)[..., None], labels


class Bars(datasets.Builder):
  """Generated bars; settings in ``config.data``: size, noise, num_train, num_test, seed."""

  def __init__(self, config):
    super().__init__(config)
    d = config.data
    if not 9 <= d.size <= 256:
      raise UsageError(f"config.data.size={d.size!r}: use 9 to 256 px (bars are up to 8 px).")
    if not 0 <= d.noise <= 255:
      raise UsageError(f"config.data.noise={d.noise!r}: use 0 to 255.")
    self.info = datasets.DatasetInfo((d.size, d.size, 1), len(_DIRECTIONS))

  def load(self) -> dict[str, datasets.Split]:
    d = self.config.data
    splits = {}
    for offset, (name, n) in enumerate((("train", d.num_train), ("test", d.num_test))):
      images, labels = draw_bars(n, d.size, d.noise, d.seed + offset)
      splits[name] = datasets.Split({"images": images, "labels": labels})
    return splits
