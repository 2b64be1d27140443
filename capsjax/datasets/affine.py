"""Random affine transforms of digits: the offline stand-in for affNIST ("affine MNIST").

affNIST (Tieleman, https://www.cs.toronto.edu/~tijmen/affNIST/) puts every MNIST test digit through
random affine transforms into 40x40. Its files cannot be downloaded on our machines, so this module
makes a stand-in of the same kind from the MNIST test digits: each digit under
``transforms_per_digit`` random transforms, deterministic given a seed. It is *not* affNIST and is
named "affine MNIST" wherever it appears.

Ranges (config values; the defaults are ours, chosen to resemble affNIST's description: rotation,
shear, per-axis scale and a large translation): rotation uniform in +-``rotation_degrees`` (20),
shear factor uniform in +-``shear`` (0.2), each axis scaled by a factor uniform in ``scale`` (0.8,
1.2), then a translation uniform over every position that keeps the digit's bounding box inside the
canvas (the digit is never cut). Pixels are resampled bilinearly, host-side with NumPy.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class AffineRanges:
  """Ranges of the random transforms; see the module docstring."""
  rotation_degrees: float = 20.0
  shear: float = 0.2
  scale: tuple[float, float] = (0.8, 1.2)


def linear_part(rotation: np.ndarray, shear: np.ndarray, scale_x: np.ndarray,
                scale_y: np.ndarray) -> np.ndarray:
  """``(n, 2, 2)`` matrices acting on ``(y, x)`` offsets: scale, then shear ``x += k y``,
  then rotate by ``rotation`` radians (counter-clockwise on screen, where y points down)."""
  c, s = np.cos(rotation), np.sin(rotation)
  zeros, ones = np.zeros_like(c), np.ones_like(c)
  # In (x, y) with y down, a counter-clockwise turn on screen is [[c, s], [-s, c]].
  rotate = np.stack([np.stack([c, s], -1), np.stack([-s, c], -1)], -2)
  shear_m = np.stack([np.stack([ones, shear], -1), np.stack([zeros, ones], -1)], -2)
  scale = np.stack([np.stack([scale_x, zeros], -1), np.stack([zeros, scale_y], -1)], -2)
  return (rotate @ shear_m @ scale)[:, ::-1, ::-1]  # (x, y) -> (y, x) order on both sides.


def warp(images: np.ndarray, matrices: np.ndarray, translations: np.ndarray,
         out_hw: tuple[int, int]) -> np.ndarray:
  """Maps each image's centre to the canvas centre through ``matrix`` plus ``translation``.

  Output pixel q samples the input at ``A^-1 (q - c_out - t) + c_in`` bilinearly,
  zero outside; centres are ``(size - 1) / 2``.

  Args:
    images: ``(n, h, w, c)`` uint8.
    matrices: ``(n, 2, 2)`` acting on ``(y, x)``.
    translations: ``(n, 2)`` as ``(ty, tx)`` px.
    out_hw: the canvas ``(H, W)``.

  Returns:
    ``(n, H, W, c)`` uint8.
  """
  n, h, w, channels = images.shape
  out_h, out_w = out_hw
  grid = np.stack(np.meshgrid(np.arange(out_h), np.arange(out_w), indexing="ij"), -1)
  grid = grid.reshape(-1, 2).astype(np.float64) - [(out_h - 1) / 2, (out_w - 1) / 2]
  inverse = np.linalg.inv(matrices)
  # (n, H*W, 2) source coordinates (y, x).
  source = np.einsum("nij,npj->npi", inverse, grid[None] - translations[:, None, :])
  source += [(h - 1) / 2, (w - 1) / 2]
  y0, x0 = np.floor(source[..., 0]), np.floor(source[..., 1])
  wy, wx = source[..., 0] - y0, source[..., 1] - x0
  y0, x0 = y0.astype(np.int64), x0.astype(np.int64)
  flat = images.reshape(n, h * w, channels).astype(np.float64)
  rows = np.arange(n)[:, None]
  out = np.zeros((n, out_h * out_w, channels))
  for dy, dx, weight in ((0, 0, (1 - wy) * (1 - wx)), (0, 1, (1 - wy) * wx),
                         (1, 0, wy * (1 - wx)), (1, 1, wy * wx)):
    yy, xx = y0 + dy, x0 + dx
    inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
    index = np.where(inside, yy * w + xx, 0)
    out += np.where(inside, weight, 0.0)[..., None] * flat[rows, index]
  return np.clip(np.rint(out), 0, 255).astype(np.uint8).reshape(n, out_h, out_w, channels)


def _box_corners(images: np.ndarray) -> np.ndarray:
  """``(n, 4, 2)`` corners (y, x) of each image's non-zero pixels, about its centre."""
  n, h, w, _ = images.shape
  ink = images.reshape(n, h, w, -1).max(axis=-1) > 0
  rows, cols = ink.any(axis=2), ink.any(axis=1)
  first = lambda a: np.where(a.any(1), a.argmax(1), 0)
  last = lambda a: np.where(a.any(1), a.shape[1] - 1 - a[:, ::-1].argmax(1), 0)
  top, bottom, left, right = first(rows), last(rows), first(cols), last(cols)
  corners = np.stack([np.stack([top, left], -1), np.stack([top, right], -1),
                      np.stack([bottom, left], -1), np.stack([bottom, right], -1)], 1)
  return corners - [(h - 1) / 2, (w - 1) / 2]


def random_affine(images: np.ndarray, labels: np.ndarray, transforms_per_digit: int,
                  out_hw: tuple[int, int], ranges: AffineRanges = AffineRanges(),
                  seed: int = 0, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
  """Every image under ``transforms_per_digit`` random transforms (image-major order).

  Deterministic given ``seed``; the transforms of the first m outputs do not
  depend on how many images follow (the draws are one row per output).

  Returns:
    ``(n * transforms_per_digit, H, W, c)`` uint8 images and their labels.
  """
  repeat = lambda a: np.repeat(a, transforms_per_digit, axis=0)
  images, labels = repeat(images), repeat(labels)
  u = np.random.default_rng(seed).uniform(size=(len(images), 6))
  spread = lambda column, low, high: low + (high - low) * u[:, column]
  angle = np.deg2rad(spread(0, -ranges.rotation_degrees, ranges.rotation_degrees))
  matrices = linear_part(angle, spread(1, -ranges.shear, ranges.shear),
                         spread(2, *ranges.scale), spread(3, *ranges.scale))
  # Translation: uniform over the offsets that keep the transformed box in the canvas.
  box = np.einsum("nij,nkj->nki", matrices, _box_corners(images))
  half = np.array([(out_hw[0] - 1) / 2, (out_hw[1] - 1) / 2])
  low, high = -half - box.min(axis=1), half - box.max(axis=1)
  fits = low <= high
  low, high = np.where(fits, low, 0.0), np.where(fits, high, 0.0)
  translations = low + (high - low) * u[:, 4:6]
  out = [warp(images[k:k + chunk], matrices[k:k + chunk], translations[k:k + chunk], out_hw)
         for k in range(0, len(images), chunk)]
  return np.concatenate(out) if out else images[:0], labels
