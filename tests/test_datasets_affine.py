"""datasets.affine: the affine MNIST stand-in against NumPy/SciPy references."""

import numpy as np
import pytest
import scipy.ndimage

from capsjax.datasets import affine, augment
from helpers import make_images


def digits(n=6, seed=0):
  labels = np.arange(n) % 10
  return make_images(labels, seed)[..., None], labels


def test_identity_reproduces_the_centred_digit():
  images, _ = digits()
  out = affine.warp(images, np.repeat(np.eye(2)[None], len(images), 0),
                    np.zeros((len(images), 2)), (40, 40))
  np.testing.assert_array_equal(out, augment.pad_images(images, 6))


@pytest.mark.parametrize("turns", [1, 2, 3])
def test_quarter_turns_are_exact_rotations(turns):
  """On the 40x40 grid a rotation by a multiple of 90 degrees about the centre maps pixels onto
  pixels, so it must equal NumPy's rot90 (counter-clockwise as displayed)."""
  images = augment.pad_images(digits()[0], 6)
  angle = np.full(len(images), turns * np.pi / 2)
  ones = np.ones(len(images))
  matrices = affine.linear_part(angle, 0 * ones, ones, ones)
  out = affine.warp(images, matrices, np.zeros((len(images), 2)), (40, 40))
  np.testing.assert_array_equal(out, np.rot90(images, k=turns, axes=(1, 2)))


def test_general_transform_matches_scipy_affine_transform():
  images = digits(3)[0]
  matrices = affine.linear_part(np.deg2rad(np.array([30.0, -17.0, 8.0])),
                                np.array([0.15, -0.2, 0.0]), np.array([1.1, 0.85, 1.0]),
                                np.array([0.9, 1.2, 1.0]))
  translations = np.array([[2.5, -3.0], [0.0, 4.25], [-6.0, 1.0]])
  out = affine.warp(images, matrices, translations, (40, 40))
  for k in range(len(images)):
    # scipy maps output coordinates o to input ones as M o + offset; "grid-constant" pads
    # with zeros and interpolates across the edge, as warp does.
    inverse = np.linalg.inv(matrices[k])
    offset = np.array([13.5, 13.5]) - inverse @ (np.array([19.5, 19.5]) + translations[k])
    reference = scipy.ndimage.affine_transform(images[k, ..., 0].astype(np.float64), inverse,
                                               offset=offset, output_shape=(40, 40), order=1,
                                               mode="grid-constant", cval=0.0)
    np.testing.assert_allclose(out[k, ..., 0], np.clip(np.rint(reference), 0, 255), atol=1)


def test_random_set_is_deterministic_in_range_and_prefix_stable():
  images, labels = digits(8)
  images = augment.pad_images(images, 6)
  a, la = affine.random_affine(images, labels, 3, (40, 40), seed=5)
  b, _ = affine.random_affine(images, labels, 3, (40, 40), seed=5)
  c, _ = affine.random_affine(images, labels, 3, (40, 40), seed=6)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  np.testing.assert_array_equal(la, np.repeat(labels, 3))
  assert a.shape == (24, 40, 40, 1) and a.dtype == np.uint8
  prefix, _ = affine.random_affine(images[:2], labels[:2], 3, (40, 40), seed=5)
  np.testing.assert_array_equal(prefix, a[:6])


def test_translation_keeps_every_digit_whole_and_spreads_positions():
  """The digit's box always fits: its ink is kept (up to resampling and the area change
  of the scale and shear), and the translations move digits all over the canvas."""
  images, labels = digits(10)
  images = augment.pad_images(images, 6)
  images[:, :6] = 0  # The generated background noise would count as ink up to the edge.
  images = np.where(images > 200, images, 0).astype(np.uint8)
  out, _ = affine.random_affine(images, labels, 20, (40, 40), seed=1)
  ranges = affine.AffineRanges()
  ink_in = np.repeat(images.reshape(10, -1).sum(1), 20).astype(np.float64)
  ink_out = out.reshape(200, -1).sum(1)
  low_area = ranges.scale[0] ** 2 * 0.9
  assert np.all(ink_out > low_area * ink_in) and np.all(ink_out < 1.5 * 1.1 * ink_in)
  rows = np.arange(40)
  centre_y = (out[..., 0].sum(2) * rows).sum(1) / out[..., 0].sum((1, 2))
  assert centre_y.max() - centre_y.min() > 10
