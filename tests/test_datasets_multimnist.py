"""datasets.multimnist: pairs of different classes, the clipped sum, shifts, fixed test pairs,
and the jitted generator against a NumPy re-implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multimnist
from capsjax import datasets
from capsjax.common.errors import UsageError
from capsjax.datasets import augment
from capsjax.datasets import multimnist as generator
from helpers import write_idx_dataset


@pytest.fixture(scope="module")
def bars_200_40(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 200 train, 40 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=200, num_test=40)


def config(bars_200_40, **data):
  c = multimnist.get_config("smoke")
  c.data.source, c.data.dir, c.data.train_limit, c.data.test_limit = "idx", str(bars_200_40), 0, 0
  c.data.update(data)
  return c


def shift_numpy(image, dx, dy):
  """``image`` (h, w, c) moved dx right and dy down with zero fill: plain slicing."""
  out = np.zeros_like(image)
  h, w = image.shape[:2]
  out[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
      image[max(-dy, 0):h - max(dy, 0), max(-dx, 0):w - max(dx, 0)]
  return out


def test_partners_are_drawn_uniformly_from_the_other_classes():
  labels = np.array([3, 1, 3, 0, 1, 1, 2])
  table = generator.partner_table(labels, 4)
  for first in range(len(labels)):
    others = np.flatnonzero(labels != labels[first])
    grid = (np.arange(len(others)) + 0.5) / len(others)  # One draw per other digit.
    got = generator.draw_partners(grid, np.full(len(grid), labels[first]), **table)
    assert sorted(got.tolist()) == sorted(others.tolist())


def test_fixed_test_pairs(bars_200_40):
  builder = datasets.get(config(bars_200_40, pairs_per_digit=3))
  assert builder.info == datasets.DatasetInfo((36, 36, 1), 10, labels_per_example=2)
  splits = builder.load()
  test = splits["test"]
  assert len(test) == 40 * 3
  np.testing.assert_array_equal(test.examples["first"], np.repeat(np.arange(40), 3))
  labels = test.shared["digit_labels"]
  assert np.all(labels[test.examples["first"]] != labels[test.examples["second"]])
  assert np.abs(test.examples["shifts"]).max() == 4
  again = datasets.get(config(bars_200_40, pairs_per_digit=3)).load()["test"]
  other = datasets.get(config(bars_200_40, pairs_per_digit=3, pair_seed=1)).load()["test"]
  for key in ("second", "shifts"):
    np.testing.assert_array_equal(test.examples[key], again.examples[key])
  assert not np.array_equal(test.examples["shifts"], other.examples["shifts"])
  # A limited set is a fair sample of the pairs, not the first ones (which share base digits).
  limited = datasets.get(config(bars_200_40, pairs_per_digit=3, test_limit=7)).load()["test"]
  rows = {tuple(map(int, (f, s, *sh.ravel()))) for f, s, sh in zip(
      test.examples["first"], test.examples["second"], test.examples["shifts"])}
  kept = [tuple(map(int, (f, s, *sh.ravel()))) for f, s, sh in zip(
      limited.examples["first"], limited.examples["second"], limited.examples["shifts"])]
  assert len(kept) == len(set(kept)) == 7 and set(kept) <= rows
  first = limited.examples["first"]
  assert len(set(first.tolist())) >= 6 and first.max() - first.min() >= 20, first

  # The composed batch: the clipped sum of the two shifted digits, both kept.
  batch = jax.jit(builder.eval_batch)({k: v[:12] for k, v in test.examples.items()},
                                      test.shared)
  digits = test.shared["digits"]
  for k in range(12):
    (dx1, dy1), (dx2, dy2) = test.examples["shifts"][k]
    a = shift_numpy(digits[test.examples["first"][k]], dx1, dy1)
    b = shift_numpy(digits[test.examples["second"][k]], dx2, dy2)
    np.testing.assert_allclose(np.asarray(batch["images"][k]) * 255,
                               np.minimum(a.astype(int) + b.astype(int), 255), atol=1e-3)
    np.testing.assert_allclose(np.asarray(batch["digit_images"][k]) * 255, np.stack([a, b]),
                               atol=1e-3)
  assert np.asarray(batch["images"]).max() <= 1.0


def test_training_pairs_in_the_jitted_step_match_numpy(bars_200_40):
  builder = datasets.get(config(bars_200_40))
  train = builder.load()["train"]
  images, labels = train.examples["images"], train.examples["labels"]
  indices = np.arange(64, dtype=np.int32) % len(labels)
  key = jax.random.key(11)
  batch = jax.jit(builder.train_batch)(
      key, jnp.asarray(indices), {k: jnp.asarray(v) for k, v in train.examples.items()},
      {k: jnp.asarray(v) for k, v in train.shared.items()})

  # NumPy, from the same draws: the partner is the floor(u * m)-th of the m digits of other
  # classes (in class, then index order); each digit moves by an offset drawn as random_shift
  # draws it (row/column start of a crop of the 4-px zero-padded canvas).
  partner_key, first_key, second_key = jax.random.split(key, 3)
  uniform = np.asarray(jax.random.uniform(partner_key, indices.shape))
  offsets = [np.asarray(jax.random.randint(k, (64, 2), 0, 9)) for k in (first_key, second_key)]
  by_class = np.concatenate([np.flatnonzero(labels == c) for c in range(10)])
  for k, i in enumerate(indices):
    others = by_class[labels[by_class] != labels[i]]
    j = others[int(uniform[k] * len(others))]
    a = shift_numpy(images[i], 4 - offsets[0][k, 1], 4 - offsets[0][k, 0])
    b = shift_numpy(images[j], 4 - offsets[1][k, 1], 4 - offsets[1][k, 0])
    assert labels[i] != labels[j]
    np.testing.assert_array_equal(np.asarray(batch["labels"][k]), [labels[i], labels[j]])
    np.testing.assert_allclose(np.asarray(batch["images"][k]) * 255,
                               np.minimum(a.astype(int) + b.astype(int), 255), atol=1e-3)
    np.testing.assert_allclose(np.asarray(batch["digit_images"][k]) * 255, np.stack([a, b]),
                               atol=1e-3)


def test_shift_by_matches_the_host_shift():
  images = np.random.default_rng(0).integers(0, 255, (6, 9, 9, 1), dtype=np.uint8)
  shifts = np.array([[0, 0], [2, -1], [-3, 3], [1, 2], [-2, -2], [3, 0]], np.int32)
  moved = np.asarray(augment.shift_by(jnp.asarray(images), jnp.asarray(shifts), 3))
  np.testing.assert_array_equal(moved, augment.shift_each_image(images, shifts))


def test_bad_settings(bars_200_40):
  with pytest.raises(UsageError, match="shift_pixels=5 must lie in"):
    datasets.get(config(bars_200_40, shift_pixels=5))
  with pytest.raises(UsageError, match=r"pairs_per_digit=0 is out of range: it must be > 0"):
    datasets.get(config(bars_200_40, pairs_per_digit=0))


def test_an_evaluation_split_made_from_train_digits_has_the_test_layout(bars_200_40):
  builder = generator.MultiMNIST(config(bars_200_40, pairs_per_digit=2))
  splits = builder.load()
  made = builder.eval_split_like(splits["train"])
  assert set(made.examples) == set(splits["test"].examples)
  assert set(made.shared) == set(splits["test"].shared)
  assert len(made) == 2 * len(splits["train"])
  batch = jax.jit(builder.eval_batch)(made.first(16).examples, made.shared)
  assert batch["images"].shape == (16, 36, 36, 1)
  assert batch["digit_images"].shape == (16, 2, 36, 36, 1)
  labels = np.asarray(batch["labels"])
  assert (labels[:, 0] != labels[:, 1]).all()
  np.testing.assert_array_equal(labels[:, 0], splits["train"].examples["labels"][
      np.asarray(made.examples["first"][:16])])
