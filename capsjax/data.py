"""Datasets: read once into host memory, validate, then live on the device.

Two sources (``config.data.source``):
  * ``"tfds"``: any tensorflow-datasets name. Online it downloads; offline,
    ``config.data.dir`` may hold the original archive files, which tfds then
    uses as its manual dir (it checks their checksums).
  * ``"idx"``: a folder of MNIST-format IDX files (``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
    ``t10k-labels-idx1-ubyte``, each raw or ``.gz``), read with NumPy alone.

Batching, shuffling and the random shifts run on the device inside the jitted
train step (:func:`gather_batch`, :func:`random_shift`), so the input pipeline
never stalls the accelerator.
"""

from __future__ import annotations

import gzip
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from capsjax.errors import UsageError

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_UBYTE = 0x08


class Dataset(NamedTuple):
  """Images ``(n, h, w, c)`` uint8 and labels ``(n,)`` int32, on the host."""
  train_images: np.ndarray
  train_labels: np.ndarray
  validation_images: np.ndarray
  validation_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray


def load(config: ml_collections.ConfigDict, image_shape, num_classes: int,
         seed: int = 0) -> Dataset:
  """Loads ``config`` (``config.data``), validates it and splits off validation.

  Raises:
    UsageError: with the path or config key at fault and what to do.
  """
  if config.source == "idx":
    splits = _load_idx(config.dir)
  elif config.source == "tfds":
    splits = _load_tfds(config.name, config.dir, config.tfds_data_dir)
  else:
    raise UsageError(f"config.data.source must be 'tfds' or 'idx', got {config.source!r}.")
  where = config.dir if config.source == "idx" else f"tfds dataset {config.name!r}"
  for split in ("train", "test"):
    images, labels = splits[split]
    _check_split(split, images, labels, tuple(image_shape), num_classes, where)
    if split == "train" and config.train_limit:
      images, labels = images[:config.train_limit], labels[:config.train_limit]
    if split == "test" and config.test_limit:
      images, labels = images[:config.test_limit], labels[:config.test_limit]
    splits[split] = (images, labels)

  train_images, train_labels = splits["train"]
  n_val = int(config.validation_size)
  if n_val < 0 or n_val >= len(train_images):
    raise UsageError(f"config.data.validation_size={n_val} must be in [0, "
                     f"{len(train_images)}) for {len(train_images)} training examples.")
  order = np.random.default_rng(seed).permutation(len(train_images))
  val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
  return Dataset(train_images[train_idx], train_labels[train_idx],
                 train_images[val_idx], train_labels[val_idx], *splits["test"])


def _check_split(split, images, labels, image_shape, num_classes, where):
  if images.ndim == 3:  # IDX and tfds give grey images without a channel axis.
    images = images[..., None]
  if images.shape[1:] != image_shape:
    raise UsageError(f"{where}: {split} images have shape {images.shape[1:]}, but "
                     f"config.model.image_shape is {image_shape}. Set "
                     f"--config.model.image_shape='{images.shape[1:]}' or use matching data.")
  if len(images) != len(labels):
    raise UsageError(f"{where}: {len(images)} {split} images but {len(labels)} labels; "
                     "the files do not belong together.")
  if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
    raise UsageError(f"{where}: {split} labels lie in [{labels.min()}, {labels.max()}], "
                     f"outside [0, {num_classes}) of config.model.num_classes={num_classes}.")


def read_idx(path: str) -> np.ndarray:
  """Reads one IDX file (raw or gzip) of unsigned bytes into an array."""
  try:
    with open(path, "rb") as f:
      raw = f.read()
    if raw[:2] == b"\x1f\x8b":
      raw = gzip.decompress(raw)
  except (OSError, EOFError) as e:
    raise UsageError(f"Cannot read IDX file {path}: {e}. Replace it with an intact copy.") from e
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _IDX_UBYTE or raw[3] == 0:
    raise UsageError(f"{path} is not an IDX file of unsigned bytes (bad magic number "
                     f"{raw[:4].hex() or 'empty'}, expected 0000 08 0N). Replace it with the "
                     "original MNIST-format file.")
  ndim = raw[3]
  header = 4 + 4 * ndim
  shape = tuple(int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim))
  if len(raw) != header + int(np.prod(shape)):
    raise UsageError(f"{path}: the header says shape {shape} ({int(np.prod(shape))} bytes) but "
                     f"the file holds {len(raw) - header} bytes of data; it is truncated or "
                     "corrupt. Replace it with an intact copy.")
  return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def _find_idx(directory: str, stem: str) -> str:
  for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"),
               stem.replace("-idx", ".idx") + ".gz"):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      return path
  raise UsageError(f"{directory} has no {stem}[.gz]. An idx data dir needs the four MNIST-format "
                   f"files {', '.join(IDX_FILES.values())} (raw or .gz).")


def _load_idx(directory: str | None) -> dict:
  if not directory:
    raise UsageError("config.data.source='idx' needs --config.data.dir=PATH, a folder with "
                     "MNIST-format IDX files.")
  if not os.path.isdir(directory):
    raise UsageError(f"config.data.dir={directory!r} does not exist or is not a folder. "
                     "Point it at a folder with MNIST-format IDX files.")
  arrays = {key: read_idx(_find_idx(directory, stem)) for key, stem in IDX_FILES.items()}
  for key in ("train_images", "test_images"):
    if arrays[key].ndim != 3:
      raise UsageError(f"{_find_idx(directory, IDX_FILES[key])}: expected images of shape "
                       f"(n, h, w), got {arrays[key].shape}.")
  for key in ("train_labels", "test_labels"):
    if arrays[key].ndim != 1:
      raise UsageError(f"{_find_idx(directory, IDX_FILES[key])}: expected labels of shape (n,), "
                       f"got {arrays[key].shape}.")
  return {split: (arrays[f"{split}_images"][..., None], arrays[f"{split}_labels"].astype(np.int32))
          for split in ("train", "test")}


def _load_tfds(name: str, manual_dir: str | None, data_dir: str | None) -> dict:
  import tensorflow_datasets as tfds  # Heavy (TensorFlow); only for this source.

  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise UsageError(f"Unknown tensorflow-datasets name config.data.name={name!r}. "
                     "See https://www.tensorflow.org/datasets/catalog, or use "
                     "--config.data.source=idx for IDX files.") from e
  download_config = None
  if manual_dir:
    if not os.path.isdir(manual_dir):
      raise UsageError(f"config.data.dir={manual_dir!r} does not exist or is not a folder; "
                       "for tfds it must hold the original archive files.")
    download_config = tfds.download.DownloadConfig(manual_dir=manual_dir)
  try:
    builder.download_and_prepare(download_config=download_config)
  except Exception as e:  # tfds raises many types; all mean "could not prepare".
    raise UsageError(f"tensorflow-datasets could not prepare {name!r} "
                     f"(manual dir {manual_dir!r}): {type(e).__name__}: {e}. Offline, set "
                     "--config.data.dir to a folder with the original archives, or use "
                     "--config.data.source=idx.") from e
  splits = {}
  for split in ("train", "test"):
    data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
    splits[split] = (np.asarray(data["image"], np.uint8), np.asarray(data["label"], np.int32))
  return splits


# --- On the device, inside the jitted step. ---

def epoch_batch_indices(key: jax.Array, step: jax.Array, num_examples: int,
                        batch_size: int) -> jax.Array:
  """Indices of the examples of train ``step``: each epoch is a fresh permutation.

  Epoch e = step // steps_per_epoch uses permutation(fold_in(key, e)); the
  last ``num_examples % batch_size`` examples of each permutation are dropped.
  Being a function of the step, the data position resumes exactly.
  """
  steps_per_epoch = num_examples // batch_size
  epoch, position = jnp.divmod(step, steps_per_epoch)
  permutation = jax.random.permutation(jax.random.fold_in(key, epoch), num_examples)
  return jax.lax.dynamic_slice(permutation, (position * batch_size,), (batch_size,))


def random_shift(key: jax.Array, images: jax.Array, max_shift: int) -> jax.Array:
  """Shifts each image by up to ``max_shift`` px in x and y, filling with zeros.

  Args:
    images: ``(batch, h, w, c)``.
  """
  if max_shift <= 0:
    return images
  batch, h, w, _ = images.shape
  padded = jnp.pad(images, ((0, 0), (max_shift, max_shift), (max_shift, max_shift), (0, 0)))
  offsets = jax.random.randint(key, (batch, 2), 0, 2 * max_shift + 1)

  def crop(image, offset):
    return jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (h, w, image.shape[-1]))

  return jax.vmap(crop)(padded, offsets)


def shift_images(images: np.ndarray, dx: int, dy: int) -> np.ndarray:
  """Moves every image ``dx`` px right and ``dy`` px down (negative: left, up).

  Pixels shifted out are dropped and the uncovered border is zero, as in
  training's random shifts; used on the host to measure shift robustness.

  Args:
    images: ``(n, h, w, c)``.
  """
  _, h, w, _ = images.shape
  if abs(dx) >= w or abs(dy) >= h:
    raise ValueError(f"shift ({dx}, {dy}) moves a {h}x{w} image out of its frame.")
  shifted = np.zeros_like(images)
  shifted[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
      images[:, max(-dy, 0):h - max(dy, 0), max(-dx, 0):w - max(dx, 0)]
  return shifted


def to_float(images: jax.Array) -> jax.Array:
  """uint8 pixels -> float32 in [0, 1]."""
  return images.astype(jnp.float32) / 255.0
