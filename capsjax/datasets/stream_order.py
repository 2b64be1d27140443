"""The official code's order of training examples, as a setting: ``data.order="stream"``.

The authors' MNIST training file (research/capsules/input_data/mnist/mnist_shift.py:109-123)
holds each training digit's 25 shifted copies (-2..2 px down, and for each of those -2..2 px
right) one after the other, the digits in file order. Training reads the file again and again
through ``tf.train.shuffle_batch``, a random queue that holds up to 5,000 + 3 x 128 = 5,384
examples (``mnist_input_record.py:215-222``). So a batch often holds several shifts of one digit,
and every pass over the file visits the digits in the same coarse order; a pass is 25 of
capsjax's epochs of 60,000 digits, so the paper's 50 epochs read the file twice.

``"stream"`` reproduces that stream (position q is copy ``q % copies`` of example
``(q // copies) % num_examples``) and stands in for the queue by shuffling consecutive windows of
``data.stream_window`` positions (5,384 by default), so that each batch is drawn from as many
examples as the queue held. It is a function of the step, as ``"permutation"`` is (each epoch a
fresh permutation of the examples, each draw a random shift): a run resumes exactly. What it does
not reproduce: the queue's tail (an example waits a geometric number of steps there, mean
window / batch, and may wait much longer) and the order of its two feeding threads, which no
run of the code repeats either.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from capsjax.config import run_settings
from capsjax.common.errors import UsageError

ORDERS = run_settings.ORDERS
SETTINGS = run_settings.DATA_ORDER  # config.data.order and its window.


def batch_positions(key: jax.Array, step: jax.Array, batch_size: int, window: int) -> jax.Array:
  """The stream positions of train ``step``, ``(batch_size,)`` int32.

  Positions ``q = step * batch_size + k`` (k < batch_size) in order, each moved within its
  window ``w = q // window`` to ``w * window + permutation(fold_in(key, w), window)[q % window]``.
  Needs ``batch_size <= window`` (a batch then touches at most two windows).
  """
  start = step * batch_size
  positions = start + jnp.arange(batch_size)
  first = start // window
  orders = jnp.stack([jax.random.permutation(jax.random.fold_in(key, first + k), window)
                      for k in (0, 1)])
  windows = positions // window
  return windows * window + orders[windows - first, positions % window]


def examples_and_copies(positions: jax.Array, num_examples: int,
                        copies: int) -> tuple[jax.Array, jax.Array]:
  """``(example indices, copy indices)`` of stream ``positions``: the stream is each example's
  ``copies`` copies in a row, the examples in order, over and over."""
  return (positions // copies) % num_examples, positions % copies


def check(config: ml_collections.ConfigDict, copies: int, dataset_name: str) -> None:
  """Raises UsageError naming the key when ``config.data.order`` (resolved) cannot run:
  ``"stream"`` on a dataset without one (``copies == 0``), or a window smaller than a batch."""
  if config.data.order != "stream":
    return
  if copies == 0:
    raise UsageError(f"config.data.order='stream' is the official code's stream of shifted "
                     f"MNIST digits; the dataset {dataset_name!r} has none. Use "
                     "config.data.order=permutation.")
  window = int(config.data.stream_window)
  if window < config.train.batch_size:
    raise UsageError(f"config.data.stream_window={window} is smaller than a batch "
                     f"(config.train.batch_size={config.train.batch_size}): use a window of at "
                     "least one batch (the code's queue held 5,384 examples).")
