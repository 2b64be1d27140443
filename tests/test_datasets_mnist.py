"""datasets.mnist: the registered "mnist" builder and expanded MNIST (pad + random placement)."""

import jax
import numpy as np
import pytest

import affnist
import mnist
from capsjax import datasets
from capsjax.common.errors import UsageError
from capsjax.config import schema
from helpers import write_idx_dataset


@pytest.fixture(scope="module")
def bars_64_16(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 64 train, 16 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=16)


def expanded_config(bars_64_16):
  c = affnist.get_config("smoke")
  c.data.source, c.data.dir = "idx", str(bars_64_16)
  c.data.train_limit = c.data.test_limit = 0
  return c


def test_registry_picks_the_builder_and_names_unknown_ones(bars_64_16):
  c = mnist.get_config("smoke")
  assert isinstance(datasets.get(c), datasets.mnist.MNIST) and "mnist" in datasets.names()
  c.dataset = "imagenet"
  with pytest.raises(UsageError, match="config.dataset='imagenet' is not a registered"):
    datasets.get(c)


def test_expanded_mnist_centres_digits_on_the_canvas(bars_64_16):
  builder = datasets.get(expanded_config(bars_64_16))
  assert builder.info.image_shape == (40, 40, 1)
  splits = builder.load()
  plain = mnist.get_config()
  plain.data.source, plain.data.dir = "idx", str(bars_64_16)
  digits = datasets.get(plain).load()
  for name in ("train", "test"):
    padded = splits[name].examples["images"]
    assert padded.shape[1:] == (40, 40, 1)
    np.testing.assert_array_equal(padded[:, 6:34, 6:34], digits[name].examples["images"])
    assert padded.sum() == digits[name].examples["images"].sum()  # Nothing else on the canvas.
  test = builder.eval_batch(splits["test"].examples, {})
  np.testing.assert_allclose(np.asarray(test["images"]),
                             splits["test"].examples["images"] / 255.0, rtol=1e-6)


def test_expanded_placement_in_the_jitted_step_matches_numpy(bars_64_16):
  """Each digit lands wholly inside 40x40 at a uniformly random offset of up to 6 px, the same
  placement a NumPy re-implementation makes from the same draws."""
  builder = datasets.get(expanded_config(bars_64_16))
  train = builder.load()["train"]
  examples = {k: jax.numpy.asarray(v) for k, v in train.examples.items()}
  key = jax.random.key(7)
  indices = jax.numpy.asarray(np.tile(np.arange(64), 20))  # 1280 placements.
  batch = jax.jit(builder.train_batch)(key, indices, examples, {})
  placed = np.asarray(batch["images"])
  np.testing.assert_array_equal(np.asarray(batch["labels"]), train.examples["labels"][indices])

  # NumPy: the digit's top-left corner at 12 - offset, offsets drawn as random_shift draws them.
  offsets = np.asarray(jax.random.randint(key, (len(indices), 2), 0, 13))
  digits = train.examples["images"][np.asarray(indices), 6:34, 6:34].astype(np.float32) / 255
  expected = np.zeros((len(indices), 40, 40, 1), np.float32)
  for k, (oy, ox) in enumerate(offsets):
    expected[k, 12 - oy:40 - oy, 12 - ox:40 - ox] = digits[k]
  np.testing.assert_allclose(placed, expected, rtol=1e-6)

  np.testing.assert_allclose(placed.sum((1, 2, 3)), digits.sum((1, 2, 3)), rtol=1e-5)  # Whole.
  corners = 12 - offsets
  assert corners.min() == 0 and corners.max() == 12
  assert len({tuple(c) for c in corners}) == 169  # Every one of the 13 x 13 positions.


def test_bad_padding_settings(bars_64_16):
  c = expanded_config(bars_64_16)
  c.data.shift_pixels = 7
  with pytest.raises(UsageError, match=r"config\.data\.pad=6, config\.data\.shift_pixels=7: "
                                       r"they must satisfy shift_pixels <= pad"):
    datasets.get(c)
  c = expanded_config(bars_64_16)
  c.model.image_shape = (44, 44, 1)
  with pytest.raises(UsageError, match=r"image_shape=\(44, 44, 1\) but the dataset 'mnist' "
                                       r"makes images of shape \(40, 40, 1\)"):
    schema.resolve_config(c)


def test_samples_of_two_sizes_nest():
  """data.test_limit's samples: the first N of one fixed permutation, so that runs of two
  limits share every example of the smaller (a comparison of them is on those)."""
  from capsjax import datasets

  split = datasets.Split({"images": np.zeros((1000, 2, 2, 1), np.uint8),
                          "labels": np.arange(1000) % 10})
  small, large = split.sample(128), split.sample(256)
  assert len(small) == 128 and len(large) == 256
  assert set(small.ids.tolist()) <= set(large.ids.tolist())
  assert (np.diff(large.ids) > 0).all()  # In the split's order.
  assert split.sample(128).ids.tolist() == small.ids.tolist()  # Fixed.
  assert split.sample(0) is split and split.sample(1000) is split
