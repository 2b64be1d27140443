"""``data.order="stream"``: the official code's stream of shifted MNIST copies
(capsjax/datasets/stream_order.py), against re-derivations of the code's file and of the
windowed shuffle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mnist
from capsjax.common.errors import UsageError
from capsjax.datasets import stream_order
from capsjax.training import tasks
from helpers import parse_config_flags, train_on_shapes, write_shapes_dataset


def shift_2d(image, shift, max_shift):
  """The official code's shift (input_data/mnist/mnist_shift.py, ``shift_2d``), as it is."""
  max_shift += 1
  padded_image = np.pad(image, max_shift, "constant")
  rolled_image = np.roll(padded_image, shift[0], axis=0)
  rolled_image = np.roll(rolled_image, shift[1], axis=1)
  return rolled_image[max_shift:-max_shift, max_shift:-max_shift]


def code_file(images, shift):
  """The code's training file (``shift_write_mnist``): each image's shifts in a row."""
  return np.stack([shift_2d(image, (i, j), shift) for image in images
                   for i in np.arange(-shift, shift + 1) for j in np.arange(-shift, shift + 1)])


def test_batches_are_the_stream_shuffled_within_windows():
  key, batch, window = jax.random.key(3), 5, 12
  # By hand: the stream's first windows, each permuted by its own key, concatenated.
  stream = np.concatenate([
      w * window + np.asarray(jax.random.permutation(jax.random.fold_in(key, w), window))
      for w in range(6)])
  for step in range(12):  # Batches that straddle two windows too (5 does not divide 12).
    got = stream_order.batch_positions(key, jnp.int32(step), batch, window)
    np.testing.assert_array_equal(np.asarray(got), stream[step * batch:(step + 1) * batch])
  # Each window is read whole, once: the shuffle moves positions only within it.
  read = np.concatenate([np.asarray(stream_order.batch_positions(key, jnp.int32(s), 4, 12))
                         for s in range(6)])
  assert sorted(read[:12]) == list(range(12)) and sorted(read[12:]) == list(range(12, 24))


def test_examples_and_copies_follow_the_codes_file_over_and_over():
  examples, copies = stream_order.examples_and_copies(jnp.arange(2 * 3 * 25), 3, 25)
  expected = [(e, c) for _ in range(2) for e in range(3) for c in range(25)]
  assert list(zip(np.asarray(examples).tolist(), np.asarray(copies).tolist())) == expected


def test_mnist_copies_are_the_codes_shifted_images(tmp_path):
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(write_shapes_dataset(tmp_path / "shapes"))
  config.data.order = "stream"
  task = tasks.Task.from_config(config)
  assert task.dataset.stream_copies() == 25
  split = task.dataset.load()["train"]
  examples = {k: jnp.asarray(v) for k, v in split.examples.items()}
  indices, copies = stream_order.examples_and_copies(jnp.arange(50), len(split), 25)
  batch = task.dataset.train_stream_batch(jax.random.key(0), indices, copies, examples, {})
  expected = code_file(split.examples["images"][:2, ..., 0], 2) / 255.0
  np.testing.assert_allclose(np.asarray(batch["images"])[..., 0], expected, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(batch["labels"]),
                                np.repeat(split.examples["labels"][:2], 25))


@pytest.mark.parametrize("config_file,flags,message", [
    ("configs/mnist.py:smoke", ["--config.data.order=queue"],
     "config.data.order='queue' is out of range: it must be one of"),
    ("configs/mnist.py:smoke", ["--config.data.order=stream", "--config.data.stream_window=8"],
     "config.data.stream_window=8 is smaller than a batch"),
    ("configs/multimnist.py:smoke", ["--config.data.order=stream"], "'multimnist' has none"),
])
def test_orders_that_cannot_run_are_usage_errors(config_file, flags, message):
  config = parse_config_flags(*flags, config=config_file)
  with pytest.raises(UsageError, match=message):
    tasks.Task.from_config(config)


def test_a_tiny_capsnet_learns_from_the_stream(tmp_path):
  """The smoke model on three generated shapes, read as the code's stream: its batches hold
  several shifts of one shape, and it learns. Measured: 85% test accuracy after 40 steps (it
  has then seen 26 of the 384 shapes, each in its 25 shifts; with "permutation" ~100%), 100%
  after 80."""
  config = mnist.get_config("smoke")
  config.data.order, config.data.stream_window = "stream", 256
  summary, losses = train_on_shapes(config, tmp_path, 80, 3e-3, log_every=20)
  assert losses[-1] < 0.5 * losses[0], losses
  assert summary["chance"]["accuracy"] == 0.1
  assert summary["test_accuracy"] > 0.9, summary["evaluations"]["test"]
  assert summary["config"]["data"]["order"] == "stream"
