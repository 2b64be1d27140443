"""datasets.images: the distortions against NumPy for a fixed key, the tfds pipelines of
CIFAR-10, SVHN and smallNORB on tfds.testing.mock_data (our machines cannot download them)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

import cifar10
import smallnorb
import svhn
from capsjax import datasets
from capsjax.common.errors import UsageError
from capsjax.datasets import images as ops



def batch(seed=0, shape=(5, 8, 8, 3)):
  return np.random.default_rng(seed).uniform(0, 255, shape).astype(np.float32)


def test_random_crop_and_centre_crop():
  x, key = batch(), jax.random.key(3)
  got = np.asarray(ops.random_crop(key, jnp.asarray(x), 5))
  offsets = np.asarray(jax.random.randint(key, (5, 2), 0, jnp.asarray([4, 4])))
  for k, (top, left) in enumerate(offsets):
    np.testing.assert_array_equal(got[k], x[k, top:top + 5, left:left + 5])
  assert len({tuple(o) for o in offsets}) > 1
  np.testing.assert_array_equal(np.asarray(ops.centre_crop(jnp.asarray(x), 4)), x[:, 2:6, 2:6])
  np.testing.assert_array_equal(np.asarray(ops.centre_crop(jnp.asarray(x), 5)), x[:, 1:6, 1:6])


def test_flip_brightness_contrast_standardize():
  x, key = batch(1), jax.random.key(4)
  flips = np.asarray(jax.random.bernoulli(key, 0.5, (5,)))
  got = np.asarray(ops.random_flip(key, jnp.asarray(x)))
  for k in range(5):
    np.testing.assert_array_equal(got[k], x[k, :, ::-1] if flips[k] else x[k])
  assert 0 < flips.sum() < 5

  delta = np.asarray(jax.random.uniform(key, (5, 1, 1, 1), minval=-63, maxval=63))
  np.testing.assert_allclose(np.asarray(ops.random_brightness(key, jnp.asarray(x), 63.0)),
                             x + delta, rtol=1e-6)
  assert np.abs(delta).max() <= 63

  factor = np.asarray(jax.random.uniform(key, (5, 1, 1, 1), minval=0.2, maxval=1.8))
  mean = x.mean(axis=(1, 2), keepdims=True)  # Per image and channel, as TF's adjust_contrast.
  np.testing.assert_allclose(np.asarray(ops.random_contrast(key, jnp.asarray(x), 0.2, 1.8)),
                             (x - mean) * factor + mean, rtol=1e-4, atol=1e-3)

  n = x[0].size
  expected = (x - x.mean(axis=(1, 2, 3), keepdims=True)) / np.maximum(
      x.std(axis=(1, 2, 3), keepdims=True), 1 / np.sqrt(n))
  np.testing.assert_allclose(np.asarray(ops.standardize(jnp.asarray(x))), expected,
                             rtol=1e-4, atol=1e-4)
  flat = np.full((1, 4, 4, 2), 7.0, np.float32)  # Zero variance: divided by 1/sqrt(32).
  np.testing.assert_array_equal(np.asarray(ops.standardize(jnp.asarray(flat))), 0.0)


def test_block_mean_downsamples_by_averaging():
  x = np.arange(2 * 4 * 4 * 1, dtype=np.uint8).reshape(2, 4, 4, 1)
  got = ops.block_mean(x, 2)
  np.testing.assert_array_equal(got[0, :, :, 0], [[2, 4], [10, 12]])  # rint of 2.5, 4.5, ...
  with pytest.raises(UsageError, match="resize=3 must divide"):
    ops.block_mean(x, 3)


@pytest.mark.parametrize("module,shape,classes,stored", [
    (cifar10, (24, 24, 3), 10, (32, 32, 3)),
    (svhn, (32, 32, 3), 10, (32, 32, 3)),
    (smallnorb, (32, 32, 2), 5, (48, 48, 2)),
])
def test_pipelines_on_mock_data(module, shape, classes, stored):
  config = module.get_config("smoke")
  builder = datasets.get(config)
  assert builder.info.image_shape == shape and builder.info.num_classes == classes
  with tfds.testing.mock_data(num_examples=24):
    splits = builder.load()
  train, test = splits["train"], splits["test"]
  assert train.examples["images"].shape == (24, *stored)
  assert train.examples["images"].dtype == np.uint8
  assert test.examples["labels"].max() < classes
  examples = {k: jnp.asarray(v) for k, v in train.examples.items()}
  got = jax.jit(builder.train_batch)(jax.random.key(0), jnp.arange(8), examples, {})
  assert got["images"].shape == (8, *shape)
  evaluated = np.asarray(jax.jit(builder.eval_batch)(examples, {})["images"])
  # The evaluation images by hand: the central crop (TF's offset), then TF's per-image
  # standardisation (x - mean) / max(std, 1/sqrt(n)), or just /255.
  x = train.examples["images"].astype(np.float64)
  h, size = x.shape[1], config.data.crop or x.shape[1]
  x = x[:, (h - size) // 2:(h - size) // 2 + size, (h - size) // 2:(h - size) // 2 + size]
  if config.data.standardize:
    n = np.prod(x.shape[1:])
    mean, std = x.mean(axis=(1, 2, 3), keepdims=True), x.std(axis=(1, 2, 3), keepdims=True)
    expected = (x - mean) / np.maximum(std, 1 / np.sqrt(n))
  else:
    expected = x / 255.0
  np.testing.assert_allclose(evaluated, expected, rtol=1e-4, atol=1e-4)


def test_only_the_tfds_source():
  config = cifar10.get_config("smoke")
  config.data.source = "idx"
  with pytest.raises(UsageError, match="reads tensorflow-datasets only"):
    datasets.get(config)


def test_azimuth_and_elevation_labels_in_degrees():
  np.testing.assert_array_equal(ops.azimuth_degrees(np.array([0, 1, 15, 17])), [0, 20, 300, 340])
  np.testing.assert_array_equal(ops.elevation_degrees(np.array([0, 2, 8])), [30, 40, 70])


@pytest.mark.parametrize("variant,key,to_degrees,familiar", [
    ("azimuth", "label_azimuth", ops.azimuth_degrees, {300, 320, 340, 0, 20, 40}),
    ("elevation", "label_elevation", ops.elevation_degrees, {30, 35, 40}),
])
def test_viewpoint_splits_on_mock_data(variant, key, to_degrees, familiar):
  """Each image found among tfds's own examples by its pixels: no training viewpoint in the
  novel-view set, none other in the training, validation or familiar test sets."""
  config = smallnorb.get_config(f"smoke,{variant}")
  builder = datasets.get(config)
  with tfds.testing.mock_data(num_examples=120):
    splits = builder.load()
    raw = {}
    for split in ("train", "test"):
      parts = list(tfds.as_numpy(tfds.builder("smallnorb").as_dataset(split=split,
                                                                       batch_size=4096)))
      images = np.concatenate([np.concatenate([p["image"], p["image2"]], -1) for p in parts])
      degrees = to_degrees(np.concatenate([p[key] for p in parts]))
      raw[split] = {ops.block_mean(images[k:k + 1], 48).tobytes(): int(d)
                    for k, d in enumerate(degrees)}
  viewpoints = lambda name, source: [raw[source][image[None].tobytes()]
                                     for image in splits[name].examples["images"]]
  seen = viewpoints("train", "train") + viewpoints("validation", "train")
  assert set(seen) <= familiar and len(splits["validation"]) == 20
  assert len(seen) == sum(d in familiar for d in raw["train"].values())
  assert set(viewpoints("test", "test")) <= familiar
  novel = viewpoints("novel_viewpoints", "test")
  assert novel and not set(novel) & familiar
  assert len(novel) + len(splits["test"]) == len(raw["test"])
  assert config.evals.novel_viewpoints.split == "novel_viewpoints"


def test_a_viewpoint_split_needs_a_known_axis():
  config = smallnorb.get_config("smoke")
  config.data.viewpoint_split = "lighting"
  with pytest.raises(UsageError, match="viewpoint_split='lighting'"):
    datasets.get(config)


def test_a_viewpoint_split_by_flag_alone_is_refused_naming_the_variant():
  """The flag alone would hold the novel viewpoints out of training and never evaluate them."""
  config = smallnorb.get_config("smoke")
  config.data.viewpoint_split = "azimuth"
  with pytest.raises(UsageError, match=r"evaluates none of them. Use the variant "
                     r"--config=configs/smallnorb.py:azimuth"):
    datasets.get(config)
  datasets.get(smallnorb.get_config("smoke,azimuth"))  # The variant evaluates them.
