"""Data: IDX reading and validation, device-side batching and shifts."""

import gzip
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mnist
from capsjax import data
from capsjax.errors import UsageError
from helpers import write_idx, write_idx_dataset


def data_config(directory, **overrides):
  c = mnist.get_config("smoke").data
  c.source = "idx"
  c.dir = str(directory)
  c.train_limit = 0
  c.test_limit = 0
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
  write_idx_dataset(tmp_path, num_train=40, num_test=12, gz=gz)
  ds = data.load(data_config(tmp_path), (28, 28, 1), 10)
  assert ds.train_images.shape == (40, 28, 28, 1) and ds.train_images.dtype == np.uint8
  assert ds.test_labels.shape == (12,) and ds.test_labels.dtype == np.int32
  raw = data.read_idx(os.path.join(tmp_path, "t10k-labels-idx1-ubyte" + (".gz" if gz else "")))
  np.testing.assert_array_equal(raw, ds.test_labels)


def test_validation_split_is_disjoint_and_limits_apply(tmp_path):
  write_idx_dataset(tmp_path, num_train=50, num_test=20)
  ds = data.load(data_config(tmp_path, validation_size=10, test_limit=5), (28, 28, 1), 10)
  assert len(ds.train_images) == 40 and len(ds.validation_images) == 10
  assert len(ds.test_images) == 5
  full = data.load(data_config(tmp_path), (28, 28, 1), 10)
  rows = {img.tobytes() for img in full.train_images}
  train_rows = {img.tobytes() for img in ds.train_images}
  val_rows = {img.tobytes() for img in ds.validation_images}
  assert not train_rows & val_rows and train_rows | val_rows == rows


def test_missing_dir(tmp_path):
  with pytest.raises(UsageError, match="does not exist"):
    data.load(data_config(tmp_path / "nope"), (28, 28, 1), 10)


def test_missing_file_names_expected_files(tmp_path):
  write_idx_dataset(tmp_path)
  os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
  with pytest.raises(UsageError, match="t10k-labels-idx1-ubyte"):
    data.load(data_config(tmp_path), (28, 28, 1), 10)


def test_bad_magic_names_the_path(tmp_path):
  write_idx_dataset(tmp_path)
  path = tmp_path / "train-images-idx3-ubyte.gz"
  path.write_bytes(gzip.compress(b"\x12\x34\x56\x78" + bytes(100)))
  with pytest.raises(UsageError, match=f"{path}.*bad magic"):
    data.load(data_config(tmp_path), (28, 28, 1), 10)


def test_truncated_file(tmp_path):
  write_idx_dataset(tmp_path, gz=False)
  path = tmp_path / "train-images-idx3-ubyte"
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(UsageError, match="truncated or corrupt"):
    data.load(data_config(tmp_path), (28, 28, 1), 10)


def test_corrupt_gzip(tmp_path):
  write_idx_dataset(tmp_path)
  path = tmp_path / "train-labels-idx1-ubyte.gz"
  path.write_bytes(path.read_bytes()[:20])
  with pytest.raises(UsageError, match="Cannot read IDX file"):
    data.load(data_config(tmp_path), (28, 28, 1), 10)


def test_label_out_of_range(tmp_path):
  write_idx_dataset(tmp_path, num_train=20)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.full(20, 12, np.uint8))
  with pytest.raises(UsageError, match="num_classes=10"):
    data.load(data_config(tmp_path), (28, 28, 1), 10)


def test_count_mismatch(tmp_path):
  write_idx_dataset(tmp_path, num_train=20)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(19, np.uint8))
  with pytest.raises(UsageError, match="20 train images but 19 labels"):
    data.load(data_config(tmp_path), (28, 28, 1), 10)


def test_image_shape_mismatch_names_config_key(tmp_path):
  write_idx_dataset(tmp_path)
  with pytest.raises(UsageError, match="config.model.image_shape"):
    data.load(data_config(tmp_path), (36, 36, 1), 10)


def test_unknown_source(tmp_path):
  with pytest.raises(UsageError, match="source must be 'tfds' or 'idx'"):
    data.load(data_config(tmp_path, source="csv"), (28, 28, 1), 10)


def test_unknown_tfds_name():
  c = data_config("", source="tfds", name="no_such_dataset_xyz")
  with pytest.raises(UsageError, match="Unknown tensorflow-datasets name"):
    data.load(c, (28, 28, 1), 10)


def test_epoch_batches_cover_each_example_once_per_epoch():
  key = jax.random.PRNGKey(0)
  n, b = 23, 5
  steps_per_epoch = n // b
  for epoch in range(2):
    seen = np.concatenate([np.asarray(data.epoch_batch_indices(key, jnp.int32(s), n, b))
                           for s in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)])
    assert len(set(seen.tolist())) == len(seen) == steps_per_epoch * b
  e0 = data.epoch_batch_indices(key, jnp.int32(0), n, b)
  e1 = data.epoch_batch_indices(key, jnp.int32(steps_per_epoch), n, b)
  assert not np.array_equal(np.asarray(e0), np.asarray(e1))


def test_random_shift_moves_content_and_pads_with_zeros():
  images = np.zeros((200, 9, 9, 1), np.float32)
  images[:, 4, 4] = 1.0
  shifted = np.asarray(data.random_shift(jax.random.PRNGKey(1), jnp.asarray(images), 2))
  assert shifted.shape == images.shape
  positions = np.array([np.argwhere(s[..., 0] == 1.0)[0] for s in shifted])
  offsets = positions - 4
  assert offsets.min() == -2 and offsets.max() == 2
  assert len({tuple(o) for o in offsets}) == 25  # All 5x5 shifts occur.
  np.testing.assert_array_equal(shifted.sum(axis=(1, 2, 3)), 1.0)
  # An edge pixel can leave the image: zero padding, no wrap-around.
  edge = np.zeros((100, 9, 9, 1), np.float32)
  edge[:, 0, 0] = 1.0
  moved = np.asarray(data.random_shift(jax.random.PRNGKey(2), jnp.asarray(edge), 2))
  assert 0 < moved.sum() < 100
  np.testing.assert_array_equal(data.random_shift(jax.random.PRNGKey(1), jnp.asarray(images), 0),
                                images)


def test_shift_images_by_hand_and_covers_the_training_shifts():
  image = np.zeros((1, 5, 6, 1), np.uint8)
  image[0, 2, 3] = 7
  image[0, 0, 0] = 9                                  # Leaves the frame going up.
  expected = np.zeros_like(image)
  expected[0, 1, 5] = 7                               # 2 right, 1 up.
  np.testing.assert_array_equal(data.shift_images(image, dx=2, dy=-1), expected)
  np.testing.assert_array_equal(data.shift_images(image, 0, 0), image)
  # The 25 shifts of up to 2 px are exactly the images training's random shifts draw.
  by_hand = {data.shift_images(image, dx, dy).tobytes()
             for dx in range(-2, 3) for dy in range(-2, 3)}
  many = jnp.asarray(np.repeat(image, 400, axis=0))
  drawn = np.asarray(data.random_shift(jax.random.PRNGKey(0), many, 2))
  assert len(by_hand) == 25 and {d.tobytes() for d in drawn} == by_hand
  with pytest.raises(ValueError, match="out of its frame"):
    data.shift_images(image, 6, 0)


SHARED_MNIST = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "mnist")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(SHARED_MNIST), reason="needs ../shared/data/mnist")
def test_tfds_offline_from_manual_dir_matches_idx(tmp_path):
  """tfds prepares MNIST offline from the original archives; same data as the idx source."""
  c = data_config(SHARED_MNIST, source="tfds", name="mnist", tfds_data_dir=str(tmp_path))
  from_tfds = data.load(c, (28, 28, 1), 10)
  from_idx = data.load(data_config(SHARED_MNIST), (28, 28, 1), 10)
  assert from_tfds.train_images.shape == (60000, 28, 28, 1)
  np.testing.assert_array_equal(np.bincount(from_tfds.test_labels),
                                np.bincount(from_idx.test_labels))
  assert from_tfds.test_images.astype(np.int64).sum() == from_idx.test_images.astype(np.int64).sum()
