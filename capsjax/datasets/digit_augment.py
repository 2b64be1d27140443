"""Efficient-CapsNet's MNIST augmentation, on the device inside the jitted train step.

As the reference's ``utils/pre_process_mnist.py`` (EscVM/Efficient-CapsNet) applies it to each
training image, in this order (the constants are MNIST's 28 px; here they follow the image's
height h and width w, and give the reference's values at 28x28; each function's docstring has
the reference's formula): **rotation** (``image_rotate_random``: :func:`random_rotation`, applied
to half the images), **shift within the margins** (``image_shift_rand``:
:func:`random_margin_shift`, so the digit stays whole), **squeeze** (``image_squish_random``:
:func:`random_squeeze`, Lanczos-3 with antialiasing) and **erasure** (``image_erase_random``:
:func:`random_erase`, a 4x4 patch set to zero).

Where we differ from the reference, and why:

* The rotation is bilinear on float pixels (``jax.scipy.ndimage.map_coordinates``, order 1, zero
  outside); OpenCV's ``warpAffine`` interpolates in fixed point (1/32 px), so pixels differ by
  rounding.
* The squeeze is one ``jax.image.scale_and_translate`` (the kernel of TF's Lanczos-3 resize with
  antialiasing, which ``tf.image.resize`` calls) with the scale ``(w - width_mod) / w`` and the
  offset as translation; the reference resizes to ``w - width_mod`` columns and then pads. Both
  sample the same kernel at the same points; values are not clipped (nor are the reference's).
* The random numbers come from JAX's generator (one key per image and step), not TF's.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from capsjax.config import settings as settings_lib
from capsjax.config.settings import Setting, between, one_of

AMOUNT_STD = 0.33      # The reference's normal(0, .33) for every random amount.
AMOUNT_MAX = 0.9999    # ... clipped below 1, so no shift reaches past a margin.

# ``config.data`` of the digit datasets: every step off by default (zero or False); the
# reference's: 30 degrees, half the images, normal amounts, margin shifts, squeezing and a
# 4x4 erasure (configs/efficient_capsnet.py).
SETTINGS = {
    "rotation_degrees": Setting(0.0, "Random rotations up to this angle in training (the "
                                "reference: 30).", check=between(0, 180, open_high=True)),
    "rotation_probability": Setting(0.5, "The share of images rotated (the reference: 1/2).",
                                    check=between(0, 1)),
    "rotation_distribution": Setting("normal", "The reference's 30 x normal(0, .33) clipped; "
                                     "\"uniform\": any angle up to the limit.",
                                     check=one_of("normal", "uniform")),
    "margin_shift": Setting(False, "Shifts within each digit's own empty margins."),
    "squeeze": Setting(False, "Width shrunk by 1..7 px (Lanczos-3)."),
    "erase_size": Setting(0, "One square patch of this side set to zero (0: none; the "
                          "reference: 4).", check=between(0, 8)),
}


class Settings(NamedTuple):
  """The values of :data:`SETTINGS` in a run; zero or False switches a step off."""
  rotation_degrees: float = SETTINGS["rotation_degrees"].default
  rotation_probability: float = SETTINGS["rotation_probability"].default
  rotation_distribution: str = SETTINGS["rotation_distribution"].default
  margin_shift: bool = SETTINGS["margin_shift"].default
  squeeze: bool = SETTINGS["squeeze"].default
  erase_size: int = SETTINGS["erase_size"].default

  @classmethod
  def from_config(cls, data) -> "Settings":
    """From ``config.data`` (its values checked; one it lacks is its default: off)."""
    return cls(**settings_lib.read(data, SETTINGS, "config.data"))

  @property
  def active(self) -> bool:
    return bool(self.rotation_degrees or self.margin_shift or self.squeeze or self.erase_size)


def _amounts(key: jax.Array, n: int) -> jax.Array:
  """The reference's amounts: min(|normal(0, 0.33)|, 0.9999)."""
  return jnp.minimum(jnp.abs(jax.random.normal(key, (n,)) * AMOUNT_STD), AMOUNT_MAX)


def rotate(image: jax.Array, degrees: jax.Array) -> jax.Array:
  """Turns ``image`` ``(h, w, c)`` by ``degrees`` counter-clockwise about the pixel (w/2, h/2),
  as ``cv2.warpAffine(image, cv2.getRotationMatrix2D((w/2, h/2), degrees, 1))``: each output
  pixel (x, y) samples the input bilinearly at M^{-1} (x, y), zero outside."""
  h, w, c = image.shape
  cx, cy = w / 2, h / 2
  theta = jnp.deg2rad(degrees)
  alpha, beta = jnp.cos(theta), jnp.sin(theta)
  # OpenCV's M = [[a, b, (1-a)cx - b cy], [-b, a, b cx + (1-a) cy]]; its inverse rotation:
  y, x = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32),
                      indexing="ij")
  dx, dy = x - cx, y - cy
  source_x = alpha * dx - beta * dy + cx
  source_y = beta * dx + alpha * dy + cy
  channels = [jax.scipy.ndimage.map_coordinates(image[..., k], [source_y, source_x], order=1,
                                                mode="constant", cval=0.0) for k in range(c)]
  return jnp.stack(channels, axis=-1)


def random_rotation(key: jax.Array, image: jax.Array, max_degrees: float,
                    probability: float, distribution: str = "normal") -> jax.Array:
  """``image`` turned with ``probability`` (reference: 1/2 as ``r1 <= 0``) by
  ``trunc(r0 x max_degrees)`` degrees, r0 ~ normal(0, 0.33) clipped to ±0.9999 (the
  reference's ``"normal"``), or by an angle uniform in ±``max_degrees`` (``"uniform"``: the
  rotation analogue of the novel-viewpoint experiments, where training covers every angle of
  the familiar range evenly)."""
  angle_key, apply_key = jax.random.split(key)
  if distribution == "uniform":
    degrees = jax.random.uniform(angle_key, (), minval=-max_degrees, maxval=max_degrees)
  else:
    r0 = jnp.clip(jax.random.normal(angle_key, ()) * AMOUNT_STD, -AMOUNT_MAX, AMOUNT_MAX)
    degrees = jnp.trunc(r0 * max_degrees)  # Python's int(): toward zero.
  apply = jax.random.uniform(apply_key, ()) < probability
  return jnp.where(apply, rotate(image, degrees), image)


def margins(image: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Empty columns left and right of the digit, empty rows above and below it (all 0 for a
  blank image, which then stays where it is)."""
  h, w, _ = image.shape
  columns = jnp.sum(image, axis=(0, 2)) > 0
  rows = jnp.sum(image, axis=(1, 2)) > 0

  def ends(filled, size):
    index = jnp.arange(size)
    first = jnp.min(jnp.where(filled, index, size))
    last = jnp.max(jnp.where(filled, index, -1))
    blank = ~jnp.any(filled)
    return jnp.where(blank, 0, first), jnp.where(blank, 0, size - 1 - last)

  return (*ends(columns, w), *ends(rows, h))  # (left, right), (top, bottom).


def random_margin_shift(key: jax.Array, image: jax.Array) -> jax.Array:
  """The reference's ``image_shift_rand``: per axis an amount a and a direction; left/up by
  ``floor(a x margin)``, right/down by ``floor(a x (1 + margin))`` px. Since a < 1 the digit's
  pixels stay inside the image (the roll only wraps empty rows and columns)."""
  direction_key, amount_key = jax.random.split(key)
  directions = jnp.floor(jax.random.uniform(direction_key, (2,)) * 2).astype(jnp.int32)
  amounts = _amounts(amount_key, 2)
  left, right, top, bottom = margins(image)
  x_shifts = jnp.stack([jnp.floor(-amounts[0] * left), jnp.floor(amounts[0] * (1 + right))])
  y_shifts = jnp.stack([jnp.floor(-amounts[1] * top), jnp.floor(amounts[1] * (1 + bottom))])
  dx = x_shifts[directions[1]].astype(jnp.int32)
  dy = y_shifts[directions[0]].astype(jnp.int32)
  return jnp.roll(jnp.roll(image, dy, axis=0), dx, axis=1)


def squeeze(image: jax.Array, width_mod: jax.Array, offset: jax.Array) -> jax.Array:
  """``image`` ``(h, w, c)`` resized to ``w - width_mod`` columns (Lanczos-3, antialiased) and
  placed ``offset`` columns from the left of a zero ``(h, w, c)`` canvas."""
  w = image.shape[1]
  scale = (w - width_mod.astype(jnp.float32)) / w
  return jax.image.scale_and_translate(image, image.shape, spatial_dims=(1,), scale=scale[None],
      translation=offset.astype(jnp.float32)[None], method="lanczos3", antialias=True)


def random_squeeze(key: jax.Array, image: jax.Array) -> jax.Array:
  """The reference's ``image_squish_random``: ``width_mod = floor(a0 x w/4 + 1)``, offset
  ``width_mod // 2 + floor(a1 x 2)``."""
  amounts = _amounts(key, 2)
  width_mod = jnp.floor(amounts[0] * (image.shape[1] / 4) + 1).astype(jnp.int32)
  offset = width_mod // 2 + jnp.floor(amounts[1] * 2).astype(jnp.int32)
  return squeeze(image, width_mod, offset)


def erase(image: jax.Array, row: jax.Array, column: jax.Array, size: int) -> jax.Array:
  """``image`` with the ``size x size`` patch at (row, column) set to zero."""
  h, w, _ = image.shape
  rows = jnp.arange(h)[:, None, None]
  columns = jnp.arange(w)[None, :, None]
  inside = (rows >= row) & (rows < row + size) & (columns >= column) & (columns < column + size)
  return jnp.where(inside, 0.0, image)


def random_erase(key: jax.Array, image: jax.Array, size: int) -> jax.Array:
  """The reference's ``image_erase_random``: the patch at ``floor(u x (n - 9)) + 4`` per axis
  (rows and columns 4..22 of 28)."""
  h, w, _ = image.shape
  u = jax.random.uniform(key, (2,))
  row = jnp.floor(u[0] * (h - 9)).astype(jnp.int32) + 4
  column = jnp.floor(u[1] * (w - 9)).astype(jnp.int32) + 4
  return erase(image, row, column, size)


def augment(key: jax.Array, images: jax.Array, settings: Settings) -> jax.Array:
  """Rotation, shift within the margins, squeeze and erasure (those switched on), each image
  with its own draws: image k of ``images`` ``(batch, h, w, c)`` floats uses ``fold_in(key, k)``
  of the step's ``key``."""
  if not settings.active:
    return images

  def one(k, image):
    rotation_key, shift_key, squeeze_key, erase_key = jax.random.split(k, 4)
    if settings.rotation_degrees:
      image = random_rotation(rotation_key, image, settings.rotation_degrees,
                              settings.rotation_probability, settings.rotation_distribution)
    if settings.margin_shift:
      image = random_margin_shift(shift_key, image)
    if settings.squeeze:
      image = random_squeeze(squeeze_key, image)
    if settings.erase_size:
      image = random_erase(erase_key, image, settings.erase_size)
    return image

  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(images.shape[0]))
  return jax.vmap(one)(keys, images)


__all__ = ["Settings", "augment", "erase", "margins", "random_erase", "random_margin_shift",
           "random_rotation", "random_squeeze", "rotate", "squeeze"]
