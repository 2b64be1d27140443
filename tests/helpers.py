"""Shared test helpers."""

import jax
import numpy as np


def largest_intermediate(fn, *args) -> int:
  """Element count of the largest array any equation of ``fn``'s jaxpr makes,
  looking inside nested jaxprs (jit, scan, while, cond, custom_vjp)."""
  closed = jax.make_jaxpr(fn)(*args)

  def walk(jaxpr):
    largest = 0
    for eqn in jaxpr.eqns:
      for var in eqn.outvars:
        largest = max(largest, int(np.prod(var.aval.shape)))
      for param in eqn.params.values():
        for sub in (param if isinstance(param, (tuple, list)) else (param,)):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            largest = max(largest, walk(inner))
    return largest

  return walk(closed.jaxpr)


def write_idx(path, array: np.ndarray) -> None:
  """Writes an uint8 IDX file (gzip if ``path`` ends in .gz)."""
  import gzip

  array = np.asarray(array, np.uint8)
  header = bytes([0, 0, 8, array.ndim]) + b"".join(
      int(n).to_bytes(4, "big") for n in array.shape)
  raw = header + array.tobytes()
  if str(path).endswith(".gz"):
    raw = gzip.compress(raw)
  with open(path, "wb") as f:
    f.write(raw)


def make_images(labels: np.ndarray, seed: int, size: int = 28) -> np.ndarray:
  """Learnable fake digits: a bright bar whose position and angle encode the label."""
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 40, size=(len(labels), size, size)).astype(np.float32)
  for k, label in enumerate(labels):
    row = 4 + 2 * int(label)
    if label % 2:
      images[k, 4:size - 4, row:row + 3] = 255
    else:
      images[k, row:row + 3, 4:size - 4] = 255
  return images.astype(np.uint8)


def write_idx_dataset(directory, num_train=512, num_test=128, gz=True, seed=0):
  """A folder of the four MNIST-format files with generated data."""
  import os

  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  suffix = ".gz" if gz else ""
  for split, n in (("train", num_train), ("t10k", num_test)):
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    write_idx(os.path.join(directory, f"{split}-images-idx3-ubyte{suffix}"),
              make_images(labels, seed + n))
    write_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte{suffix}"), labels)
  return directory
