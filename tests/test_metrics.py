"""metrics: top-k label sets on constructed scores."""

import jax.numpy as jnp
import numpy as np

from capsjax.models import metrics


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


def test_capsule_saturation_against_hand_computed_lengths():
  # Two examples, four class capsules each, built with known lengths along random directions.
  lengths = np.array([[0.5, 0.96, 0.2, 0.999], [0.94, 0.0, 1.0 - 1e-4, 0.3]])
  directions = np.random.default_rng(0).normal(size=(2, 4, 16))
  directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
  capsules = jnp.asarray(directions * lengths[..., None], jnp.float32)
  from capsjax import routing

  got = metrics.capsule_saturation(routing.safe_norm(capsules))
  assert metrics.SATURATED_LENGTH == 0.95
  # Example 0: mean (0.5 + 0.96 + 0.2 + 0.999) / 4 = 0.66475; 2 of 4 above 0.95.
  # Example 1: mean (0.94 + 0 + 0.9999 + 0.3) / 4 = 0.559975; 1 of 4 above 0.95.
  np.testing.assert_allclose(np.asarray(got["class_capsule_length"]), [0.66475, 0.559975],
                             rtol=1e-5)
  np.testing.assert_allclose(np.asarray(got["saturated_fraction"]), [0.5, 0.25])


def _count_chance(n, k):
  """Chance levels by enumerating every guess of k classes against every label set."""
  import itertools

  sets = list(itertools.combinations(range(n), k))
  exact = sum(guess == labels for labels in sets for guess in sets)
  some = sum(bool(set(guess) & set(labels)) for labels in sets for guess in sets)
  return exact / len(sets) ** 2, some / len(sets) ** 2


def test_chance_levels_against_a_direct_count():
  for n, k in [(10, 1), (10, 2), (5, 1), (5, 2), (6, 3)]:
    exact, some = _count_chance(n, k)
    got = metrics.chance_levels(n, k)
    np.testing.assert_allclose(got["accuracy"], exact, rtol=1e-12)
    if k > 1:
      np.testing.assert_allclose(got["at_least_one"], some, rtol=1e-12)
    else:
      assert set(got) == {"accuracy"}
  # MultiMNIST's numbers, as the README quotes them.
  np.testing.assert_allclose(metrics.chance_levels(10, 2)["accuracy"], 1 / 45)
  np.testing.assert_allclose(metrics.chance_levels(10, 2)["at_least_one"], 17 / 45)
