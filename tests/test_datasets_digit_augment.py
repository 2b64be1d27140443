"""Efficient-CapsNet's augmentation: each step against an independent reference (NumPy for the
rotation and the erasure, the reference's own TF ops for the squeeze), keys, switches, and the
training batches of the MNIST builder."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from capsjax.common.errors import UsageError
from capsjax.datasets import digit_augment as da
from capsjax.datasets import mnist
from helpers import make_images

ALL_ON = da.Settings(rotation_degrees=30.0, rotation_probability=0.5, margin_shift=True,
                     squeeze=True, erase_size=4)


def _digits(n=6, seed=0):
  """Bars on a black background (the generated digits without their noise): empty margins."""
  images = make_images(np.arange(n) % 10, seed)[..., None]
  return np.where(images == 255, 1.0, 0.0).astype(np.float32)


def numpy_warp_affine(image, matrix):
  """cv2.warpAffine(image, matrix) for one channel, float: output pixel (x, y) is the
  bilinear sample of the input at inverse(matrix) (x, y), zero outside (BORDER_CONSTANT)."""
  h, w = image.shape
  inverse = np.linalg.inv(np.vstack([matrix, [0, 0, 1]]))
  out = np.zeros_like(image, dtype=np.float64)
  padded = np.pad(image.astype(np.float64), 1)  # A zero border for neighbours outside.
  for y in range(h):
    for x in range(w):
      sx, sy, _ = inverse @ [x, y, 1]
      x0, y0 = int(np.floor(sx)), int(np.floor(sy))
      fx, fy = sx - x0, sy - y0
      value = 0.0
      for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
          yy, xx = y0 + dy, x0 + dx
          if 0 <= yy < h and 0 <= xx < w:
            value += wy * wx * padded[yy + 1, xx + 1]
      out[y, x] = value
  return out


def cv2_rotation_matrix(center, degrees):
  """cv2.getRotationMatrix2D(center, degrees, 1.0), as OpenCV documents it."""
  a, b = np.cos(np.deg2rad(degrees)), np.sin(np.deg2rad(degrees))
  cx, cy = center
  return np.array([[a, b, (1 - a) * cx - b * cy], [-b, a, b * cx + (1 - a) * cy]])


@pytest.mark.parametrize("degrees", [0.0, 7.0, -23.0, 29.0, 90.0])
def test_rotation_against_numpy_warp_affine(degrees):
  image = _digits(1)[0]
  expected = numpy_warp_affine(image[..., 0], cv2_rotation_matrix((14, 14), degrees))
  got = np.asarray(da.rotate(jnp.asarray(image), jnp.float32(degrees)))[..., 0]
  np.testing.assert_allclose(got, expected, atol=2e-5)


def test_a_quarter_turn_is_counter_clockwise_about_pixel_14_14():
  image = np.zeros((28, 28, 1), np.float32)
  image[14, 20] = 1.0  # Right of the centre ...
  turned = np.asarray(da.rotate(jnp.asarray(image), jnp.float32(90.0)))
  assert np.unravel_index(np.argmax(turned), turned.shape)[:2] == (8, 14)  # ... goes above it.


def test_random_rotation_on_a_fixed_key_is_a_whole_degree_turn_half_of_the_time():
  image = _digits(1)[0]
  candidates = {d: numpy_warp_affine(image[..., 0], cv2_rotation_matrix((14, 14), d))
                for d in range(-29, 30)}
  angles = []
  for seed in range(40):
    got = np.asarray(da.random_rotation(jax.random.PRNGKey(seed), jnp.asarray(image), 30.0,
                                        0.5))[..., 0]
    matches = [d for d, c in candidates.items() if np.allclose(got, c, atol=2e-5)]
    assert matches, f"key {seed}: not a whole-degree rotation of the image"
    angles.append(matches[0])
  turned = [a for a in angles if a != 0]
  assert 10 <= len(turned) <= 30  # About half of 40 (binomial, p = 1/2).
  assert max(abs(a) for a in angles) <= 29
  assert 4 < np.std(turned) < 16  # 30 x normal(0, 0.33), truncated: std about 10 degrees.


def test_uniform_rotation_turns_every_image_by_an_angle_spread_over_the_range():
  """``rotation_distribution="uniform"`` with probability 1: each key's angle, recovered from
  where a single bright pixel lands, is uniform in +-30 (the normal's would rarely pass 20)."""
  image = np.zeros((28, 28, 1), np.float32)
  image[14, 24] = 1.0  # 10 px right of the centre: its angle is the turn's.
  angles = []
  for seed in range(60):
    got = np.asarray(da.random_rotation(jax.random.PRNGKey(seed), jnp.asarray(image), 30.0,
                                        1.0, "uniform"))[..., 0]
    ys, xs = np.nonzero(got > 0)
    weights = got[ys, xs]
    y, x = np.average(ys, weights=weights), np.average(xs, weights=weights)
    angles.append(np.rad2deg(np.arctan2(14 - y, x - 14)))  # Counter-clockwise on screen.
  angles = np.asarray(angles)
  assert np.all(np.abs(angles) <= 30.5)
  assert np.mean(np.abs(angles) > 20) > 0.2  # Uniform: a third beyond 20 degrees.
  assert np.mean(np.abs(angles) < 1) < 0.1  # No unturned images.


def test_erase_against_numpy():
  image = np.random.RandomState(0).rand(28, 28, 1).astype(np.float32)
  expected = image.copy()
  expected[5:9, 17:21] = 0.0
  got = np.asarray(da.erase(jnp.asarray(image), jnp.int32(5), jnp.int32(17), 4))
  np.testing.assert_array_equal(got, expected)


def test_random_erase_on_a_fixed_key_zeroes_one_4x4_patch_in_rows_and_columns_4_to_25():
  ones = jnp.ones((28, 28, 1))
  corners = set()
  for seed in range(30):
    got = np.asarray(da.random_erase(jax.random.PRNGKey(seed), ones, 4))[..., 0]
    rows, columns = np.nonzero(got == 0)
    assert len(rows) == 16
    top, left = rows.min(), columns.min()
    np.testing.assert_array_equal(got[top:top + 4, left:left + 4], 0)
    assert 4 <= top <= 22 and 4 <= left <= 22  # floor(u x 19) + 4.
    corners.add((top, left))
  assert len(corners) > 20  # Positions vary with the key.


def test_margin_shift_keeps_every_digit_pixel_inside_the_image():
  images = _digits(10)
  for seed in range(10):
    for image in images:
      got = np.asarray(da.random_margin_shift(jax.random.PRNGKey(seed), jnp.asarray(image)))
      np.testing.assert_allclose(got.sum(), image.sum(), rtol=1e-6)  # Nothing wrapped off.
      np.testing.assert_array_equal(np.sort(got.ravel()), np.sort(image.ravel()))
      # A pure translation: the digit's bounding box moved, its content unchanged.
      ys, xs = np.nonzero(image[..., 0])
      gy, gx = np.nonzero(got[..., 0])
      dy, dx = gy.min() - ys.min(), gx.min() - xs.min()
      np.testing.assert_array_equal(np.roll(image, (dy, dx), axis=(0, 1)), got)


def test_margins_against_a_direct_count():
  image = np.zeros((28, 28, 1), np.float32)
  image[3:10, 5:21] = 1.0
  assert tuple(int(m) for m in da.margins(jnp.asarray(image))) == (5, 7, 3, 18)
  assert tuple(int(m) for m in da.margins(jnp.zeros((28, 28, 1)))) == (0, 0, 0, 0)


@pytest.mark.parametrize("width_mod, offset", [(1, 0), (4, 3), (7, 4)])
def test_squeeze_equals_the_references_tf_resize_and_pad(width_mod, offset):
  """The reference's ops: tf.image.resize(LANCZOS3, antialias) to 28 - width_mod columns,
  pad_to_bounding_box at the offset, crop to 28x28."""
  import tensorflow as tf  # A dependency on x86-64 (pyproject.toml).
  image = _digits(1)[0]
  resized = tf.image.resize(image, [28, 28 - width_mod], method="lanczos3", antialias=True)
  padded = tf.image.pad_to_bounding_box(resized, 0, offset, 28, 28 + offset)
  expected = tf.image.crop_to_bounding_box(padded, 0, 0, 28, 28).numpy()
  got = np.asarray(da.squeeze(jnp.asarray(image), jnp.int32(width_mod), jnp.int32(offset)))
  np.testing.assert_allclose(got, expected, atol=1e-5)


def test_augment_is_deterministic_for_a_key_and_varies_across_keys_and_images():
  augment = jax.jit(da.augment, static_argnums=2)  # As in the train step (op by op: ~20 s).
  images = jnp.asarray(_digits(4))  # 4: the shape of `same` below, one program for both.
  a = np.asarray(augment(jax.random.PRNGKey(3), images, ALL_ON))
  b = np.asarray(augment(jax.random.PRNGKey(3), images, ALL_ON))
  c = np.asarray(augment(jax.random.PRNGKey(4), images, ALL_ON))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  same = np.asarray(augment(jax.random.PRNGKey(3), jnp.stack([images[0]] * 4), ALL_ON))
  assert not np.allclose(same[0], same[1])  # Each image its own draws.


def test_switched_off_is_the_identity():
  images = jnp.asarray(_digits(4))
  np.testing.assert_array_equal(
      np.asarray(da.augment(jax.random.PRNGKey(0), images, da.Settings())), np.asarray(images))
  only_erase = np.asarray(da.augment(jax.random.PRNGKey(0), jnp.ones((4, 28, 28, 1)),
                                     da.Settings(erase_size=4)))
  assert all((only_erase[k] == 0).sum() == 16 for k in range(4))  # Nothing else changed.


def _builder(**data):
  config = ml_collections.ConfigDict(dict(
      seed=0, dataset="mnist", data=dict(source="idx", dir="", shift_pixels=0, pad=0, **data)))
  return mnist.MNIST(config)


def test_the_mnist_builder_augments_training_batches_only_when_asked():
  examples = {"images": jnp.asarray(make_images(np.arange(8) % 10, 1)[..., None]),
              "labels": jnp.arange(8) % 10}
  indices = jnp.arange(8)
  plain = _builder().train_batch(jax.random.PRNGKey(0), indices, examples, {})
  np.testing.assert_allclose(np.asarray(plain["images"]),
                             np.asarray(examples["images"], np.float32) / 255.0, rtol=1e-6)
  builder = _builder(rotation_degrees=30.0, margin_shift=True, squeeze=True, erase_size=4)
  augmented = builder.train_batch(jax.random.PRNGKey(0), indices, examples, {})
  assert not np.allclose(augmented["images"], plain["images"])
  evaluated = builder.eval_batch(examples, {})  # Evaluation: no augmentation.
  np.testing.assert_array_equal(np.asarray(evaluated["images"]), np.asarray(plain["images"]))


@pytest.mark.parametrize("key, value", [("rotation_degrees", -5.0), ("erase_size", 30),
                                        ("rotation_probability", 1.5),
                                        ("rotation_distribution", "gaussian")])
def test_bad_values_are_refused_naming_the_key(key, value):
  with pytest.raises(UsageError, match=f"config.data.{key}"):
    _builder(**{key: value})
