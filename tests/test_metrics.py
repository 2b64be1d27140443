"""metrics: top-k label sets on constructed scores."""

import jax.numpy as jnp
import numpy as np

from capsjax import metrics


def test_two_labels_both_one_none_and_ties():
  scores = jnp.asarray([
      [0.1, 0.9, 0.0, 0.8, 0.0],   # top-2 {1, 3}: both right
      [0.7, 0.9, 0.0, 0.1, 0.0],   # top-2 {1, 0}: one right
      [0.9, 0.0, 0.8, 0.0, 0.1],   # top-2 {0, 2}: none right
      [0.5, 0.5, 0.5, 0.0, 0.0],   # a tie: top_k takes the lower indices {0, 1}
      [0.0, 0.0, 0.5, 0.5, 0.5],   # a tie: {2, 3} -> one of {3, 4} right
  ])
  labels = jnp.asarray([[3, 1], [3, 1], [1, 3], [1, 0], [4, 3]])
  got = metrics.label_sets_correct(scores, labels)
  np.testing.assert_array_equal(np.asarray(got["accuracy"]), [1, 0, 0, 1, 0])
  np.testing.assert_array_equal(np.asarray(got["at_least_one"]), [1, 1, 0, 1, 1])
  np.testing.assert_array_equal(np.asarray(metrics.predictions(scores, 2))[:2],
                                [[1, 3], [1, 0]])


def test_one_label_is_plain_accuracy():
  scores = jnp.asarray([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]])
  got = metrics.label_sets_correct(scores, jnp.asarray([1, 2]))
  assert set(got) == {"accuracy"}
  np.testing.assert_array_equal(np.asarray(got["accuracy"]), [1, 0])
  np.testing.assert_array_equal(np.asarray(metrics.predictions(scores, 1)), [1, 0])
