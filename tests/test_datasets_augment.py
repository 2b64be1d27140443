"""datasets.augment: batches by epoch permutation, random shifts on the device, host shifts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.datasets import augment


def test_epoch_batches_cover_each_example_once_per_epoch():
  key = jax.random.PRNGKey(0)
  n, b = 23, 5
  steps_per_epoch = n // b
  for epoch in range(2):
    seen = np.concatenate([np.asarray(augment.epoch_batch_indices(key, jnp.int32(s), n, b))
                           for s in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)])
    assert len(set(seen.tolist())) == len(seen) == steps_per_epoch * b
  e0 = augment.epoch_batch_indices(key, jnp.int32(0), n, b)
  e1 = augment.epoch_batch_indices(key, jnp.int32(steps_per_epoch), n, b)
  assert not np.array_equal(np.asarray(e0), np.asarray(e1))


def test_random_shift_moves_content_and_pads_with_zeros():
  images = np.zeros((200, 9, 9, 1), np.float32)
  images[:, 4, 4] = 1.0
  shifted = np.asarray(augment.random_shift(jax.random.PRNGKey(1), jnp.asarray(images), 2))
  assert shifted.shape == images.shape
  positions = np.array([np.argwhere(s[..., 0] == 1.0)[0] for s in shifted])
  offsets = positions - 4
  assert offsets.min() == -2 and offsets.max() == 2
  assert len({tuple(o) for o in offsets}) == 25  # All 5x5 shifts occur.
  np.testing.assert_array_equal(shifted.sum(axis=(1, 2, 3)), 1.0)
  # An edge pixel can leave the image: zero padding, no wrap-around.
  edge = np.zeros((100, 9, 9, 1), np.float32)
  edge[:, 0, 0] = 1.0
  moved = np.asarray(augment.random_shift(jax.random.PRNGKey(2), jnp.asarray(edge), 2))
  assert 0 < moved.sum() < 100
  np.testing.assert_array_equal(augment.random_shift(jax.random.PRNGKey(1), jnp.asarray(images), 0),
                                images)


def test_shift_images_by_hand_and_covers_the_training_shifts():
  image = np.zeros((1, 5, 6, 1), np.uint8)
  image[0, 2, 3] = 7
  image[0, 0, 0] = 9                                  # Leaves the frame going up.
  expected = np.zeros_like(image)
  expected[0, 1, 5] = 7                               # 2 right, 1 up.
  np.testing.assert_array_equal(augment.shift_images(image, dx=2, dy=-1), expected)
  np.testing.assert_array_equal(augment.shift_images(image, 0, 0), image)
  # The 25 shifts of up to 2 px are exactly the images training's random shifts draw.
  by_hand = {augment.shift_images(image, dx, dy).tobytes()
             for dx in range(-2, 3) for dy in range(-2, 3)}
  many = jnp.asarray(np.repeat(image, 400, axis=0))
  drawn = np.asarray(augment.random_shift(jax.random.PRNGKey(0), many, 2))
  assert len(by_hand) == 25 and {d.tobytes() for d in drawn} == by_hand
  with pytest.raises(ValueError, match="out of its frame"):
    augment.shift_images(image, 6, 0)


