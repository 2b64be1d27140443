"""Reader for the real affNIST test set (MATLAB files, https://www.cs.toronto.edu/~tijmen/affNIST/).

Each file holds a struct ``affNISTdata`` whose field ``image`` is ``1600 x N`` uint8 (one 40x40
image per column) and ``label_int`` ``1 x N`` (0-9). The test set comes as ``test.mat`` or as the
batch files ``test_batches/1.mat`` ... ``32.mat``; point ``config.evals.affnist.path`` at either
file or folder. Read with ``scipy.io.loadmat``; each column is reshaped row-major to 40x40, as the
public readers of these files do.
"""

from __future__ import annotations

import os
import re

import numpy as np

from capsjax.common.errors import UsageError

IMAGE_SIDE = 40


def mat_files(path: str) -> list[str]:
  """``path`` itself, or the ``.mat`` files of the folder ``path`` in numeric order."""
  if os.path.isdir(path):
    names = [n for n in os.listdir(path) if n.endswith(".mat")]
    if not names:
      raise UsageError(f"affNIST folder {path} holds no .mat files; point the path at test.mat "
                       "or at the folder of test batches (1.mat ... 32.mat).")
    number = lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]
    return [os.path.join(path, n) for n in sorted(names, key=number)]
  if not os.path.isfile(path):
    raise UsageError(f"affNIST file {path} not found; point the path at test.mat or at the "
                     "folder of test batches, downloaded from "
                     "https://www.cs.toronto.edu/~tijmen/affNIST/.")
  return [path]


def read_mat(path: str, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
  """``(images (n, 40, 40, 1) uint8, labels (n,) int32)`` of one affNIST ``.mat`` file."""
  import scipy.io  # Comes with JAX.

  try:
    contents = scipy.io.loadmat(path)
  except Exception as e:  # scipy raises several types for files that are not MATLAB's.
    raise UsageError(f"Cannot read {path} as a MATLAB file: {type(e).__name__}: {e}.") from e
  if "affNISTdata" not in contents:
    raise UsageError(f"{path} has no struct 'affNISTdata' (found "
                     f"{sorted(k for k in contents if not k.startswith('__'))}); it is not an "
                     "affNIST file.")
  struct = contents["affNISTdata"]
  fields = struct.dtype.names or ()
  missing = [f for f in ("image", "label_int") if f not in fields]
  if missing:
    raise UsageError(f"{path}: the struct affNISTdata lacks {missing} (has {list(fields)}).")
  image = np.asarray(struct["image"][0, 0])
  labels = np.asarray(struct["label_int"][0, 0]).reshape(-1)
  if image.ndim != 2 or image.shape[0] != IMAGE_SIDE * IMAGE_SIDE:
    raise UsageError(f"{path}: affNISTdata.image has shape {image.shape}; expected "
                     f"({IMAGE_SIDE * IMAGE_SIDE}, N), one 40x40 image per column.")
  if image.shape[1] != len(labels):
    raise UsageError(f"{path}: {image.shape[1]} images but {len(labels)} labels.")
  if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
    raise UsageError(f"{path}: labels lie in [{labels.min()}, {labels.max()}], outside "
                     f"[0, {num_classes}).")
  images = image.T.reshape(-1, IMAGE_SIDE, IMAGE_SIDE, 1).astype(np.uint8)
  return images, labels.astype(np.int32)


def load(path: str, num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
  """All images and labels of the affNIST file or folder ``path``."""
  parts = [read_mat(p, num_classes) for p in mat_files(path)]
  return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
