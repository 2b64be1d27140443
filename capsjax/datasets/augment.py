"""Augmentation and batching on the device, inside the jitted train step (pixels to floats, the
order of the examples, shifts and crops), plus the host-side shifts that evaluation uses to measure
shift robustness."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def to_float(images: jax.Array) -> jax.Array:
  """uint8 pixels -> float32 in [0, 1]; floats are taken to be in [0, 1] already and kept."""
  if np.issubdtype(images.dtype, np.floating):
    return images
  return images.astype(np.float32) / 255.0


def epoch_batch_indices(key: jax.Array, step: jax.Array, num_examples: int,
                        batch_size: int) -> jax.Array:
  """Indices of the examples of train ``step``: each epoch is a fresh permutation.

  Epoch e = step // steps_per_epoch uses permutation(fold_in(key, e)); the last
  ``num_examples % batch_size`` examples of each permutation are dropped. Being a function of the
  step, the data position resumes exactly.
  """
  epoch = step // (num_examples // batch_size)
  return batch_from_permutation(epoch_permutation(key, epoch, num_examples), step, batch_size)


def epoch_permutation(key: jax.Array, epoch: jax.Array, num_examples: int) -> jax.Array:
  """The order of the examples in ``epoch``: ``permutation(fold_in(key, epoch))``."""
  return jax.random.permutation(jax.random.fold_in(key, epoch), num_examples)


def batch_from_permutation(permutation: jax.Array, step: jax.Array, batch_size: int) -> jax.Array:
  """The indices of train ``step`` in its epoch's ``permutation`` (:func:`epoch_permutation`):
  :func:`epoch_batch_indices` for callers that draw the permutation once for many steps (a
  permutation of 60,000 costs more than a small model's step on a CPU)."""
  position = step % (permutation.shape[0] // batch_size)
  return jax.lax.dynamic_slice(permutation, (position * batch_size,), (batch_size,))


def random_shift(key: jax.Array, images: jax.Array, max_shift: int) -> jax.Array:
  """Shifts each image of ``images`` ``(batch, h, w, c)`` by up to ``max_shift`` px in x and y,
  filling with zeros."""
  if max_shift <= 0:
    return images
  offsets = jax.random.randint(key, (images.shape[0], 2), 0, 2 * max_shift + 1)
  return _crop_padded(images, offsets, max_shift)


def shift_by(images: jax.Array, shifts: jax.Array, max_shift: int) -> jax.Array:
  """Moves image k of ``images`` ``(batch, h, w, c)`` by ``shifts[k] = (dx, dy)`` px (``shifts``
  ``(batch, 2)`` integers; right and down; ``|.| <= max_shift``), filling with zeros:
  :func:`shift_images` on the device, one shift per image."""
  if max_shift <= 0:
    return images
  return _crop_padded(images, max_shift - shifts[:, ::-1], max_shift)


def _crop_padded(images, offsets, max_shift):
  """Zero-pads by ``max_shift`` and crops each image back at ``offsets[k] = (row, col)``."""
  _, h, w, c = images.shape
  padded = jnp.pad(images, ((0, 0), (max_shift, max_shift), (max_shift, max_shift), (0, 0)))
  crop = lambda image, offset: jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (h, w, c))
  return jax.vmap(crop)(padded, offsets)


def shift_images(images: np.ndarray, dx: int, dy: int) -> np.ndarray:
  """Moves every image of ``images`` ``(n, h, w, c)`` ``dx`` px right and ``dy`` px down
  (negative: left, up). Pixels shifted out are dropped and the uncovered border is zero, as in
  training's random shifts; used on the host to measure shift robustness."""
  _, h, w, _ = images.shape
  if abs(dx) >= w or abs(dy) >= h:
    raise ValueError(f"shift ({dx}, {dy}) moves a {h}x{w} image out of its frame.")
  shifted = np.zeros_like(images)
  shifted[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
      images[:, max(-dy, 0):h - max(dy, 0), max(-dx, 0):w - max(dx, 0)]
  return shifted


def shift_each_image(images: np.ndarray, shifts: np.ndarray) -> np.ndarray:
  """Moves image k of ``images`` ``(n, h, w, c)`` by ``shifts[k] = (dx, dy)`` (``shifts``
  ``(n, 2)`` integers; host-side; see :func:`shift_images`)."""
  shifted = np.zeros_like(images)
  for dx, dy in np.unique(shifts, axis=0):
    rows = np.flatnonzero((shifts[:, 0] == dx) & (shifts[:, 1] == dy))
    shifted[rows] = shift_images(images[rows], int(dx), int(dy))
  return shifted


def pad_images(images: np.ndarray, pad: int) -> np.ndarray:
  """Centres ``(n, h, w, c)`` images on a black canvas ``pad`` px larger on each side."""
  if pad <= 0:
    return images
  return np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
