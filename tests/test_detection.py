"""The reconstruction-based detector (DARCCC): its threshold comes from validation images and
never from the test set, its false-positive rates, its detection rates against an independent
computation, and what it refuses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.common.errors import UsageError
from capsjax.evaluators import attacks
from capsjax.evaluators.detection import reconstruction_distance
from capsjax.datasets.sources import read_idx
from helpers import (build_evaluators, capsnet_evaluator_config, evaluator_config, make_images,
                     write_idx, write_idx_dataset)

SETTINGS = {"type": "reconstruction_detection", "attacks": ("fgsm",),
            "epsilons": (0.0, 0.3), "limit": 300}


@pytest.fixture(scope="module")
def bars_700_300(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 700 train, 300 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=700, num_test=300)


@pytest.fixture(scope="module")
def detected(bars_700_300):
  config = capsnet_evaluator_config(bars_700_300, detection=SETTINGS)
  config.data.validation_size = 400
  built, params, model, splits, _ = build_evaluators(config)
  return built["detection"], built["detection"].run(params), model, splits


def _images(split):
  return jnp.asarray(split.examples["images"] / 255.0, jnp.float32), jnp.asarray(
      split.examples["labels"])


def _l2(images, reconstructions):
  return np.sqrt(np.sum((np.asarray(images) - np.asarray(reconstructions)) ** 2, axis=(1, 2, 3)))


def _distances(model, images, labels):
  reconstruct = jax.jit(lambda x, y: model.apply({"images": x, "labels": y},
                                                 train=False).reconstructions)
  return _l2(images, reconstruct(images, labels))


def test_the_threshold_is_the_validation_percentile_not_the_test_one(tmp_path):
  """Test images unlike the training ones (half as bright): a threshold taken on them would be
  far from the validation images' percentile."""
  directory = write_idx_dataset(tmp_path, num_train=300, num_test=40)
  labels = read_idx(str(tmp_path / "t10k-labels-idx1-ubyte.gz"))
  write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", make_images(labels, seed=1) // 2)
  config = capsnet_evaluator_config(directory,
                                    detection={**SETTINGS, "epsilons": (0.0,), "limit": 40})
  config.data.validation_size = 100
  built, params, model, splits, _ = build_evaluators(config)
  result = built["detection"].run(params)
  validation = _distances(model, *_images(splits["validation"]))
  test = _distances(model, *_images(splits["test"]))
  assert result["threshold"] == pytest.approx(np.percentile(validation, 95), rel=1e-5)
  assert abs(np.percentile(test, 95) - np.percentile(validation, 95)) > 0.2
  assert len(built["detection"].distances["validation"]) == 100
  # The untrained decoder's grey images are farther from the dim ones: all flagged, where a
  # threshold taken on the test set would flag 5%.
  assert result["false_positive_rate"] > 0.9


def test_false_positive_rates_are_five_percent_up_to_sampling_error(detected):
  _, result, *_ = detected
  assert abs(result["validation_false_positive_rate"] - 0.05) <= 1 / 400
  # Test and validation images come from one generator: the test rate is 5% up to the
  # sampling error of both sets (two proportions of ~300 and 400: 3 standard errors, 4.4%).
  assert abs(result["false_positive_rate"] - 0.05) < 0.044
  # An attack of budget 0 moves nothing: its images are flagged as the clean ones are.
  assert result["fgsm_eps0_detection_rate"] == pytest.approx(result["false_positive_rate"])


def test_detection_rates_against_an_independent_computation(detected):
  _, result, model, splits = detected
  images, labels = _images(splits["test"].sample(300))

  def loss_fn(x):
    out = model.apply({"images": x, "labels": labels}, train=False)
    return attacks.cross_entropy(out.log_probabilities, labels), None

  @jax.jit  # One program: op by op, the attack's gradient through the routing took 20 s.
  def attacked(images):
    moved = attacks.fgsm(loss_fn, images, 0.3)
    before = model.apply({"images": images, "labels": labels}, train=False)
    after = model.apply({"images": moved, "labels": labels}, train=False)
    return moved, before.predictions, after.predictions, after.reconstructions

  moved, clean, after, reconstructions = map(np.asarray, attacked(images))
  flagged = _l2(moved, reconstructions) > result["threshold"]
  clean, after = clean == np.asarray(labels), after == np.asarray(labels)
  fooled = clean & ~after
  assert result["fgsm_eps0.3_detection_rate"] == pytest.approx(np.mean(flagged), abs=1e-6)
  assert result["fgsm_eps0.3_undetected_success_rate"] == pytest.approx(
      np.sum(fooled & ~flagged) / np.sum(clean), abs=1e-6)
  assert fooled.any()  # The attack fools some: the rate over the fooled ones is defined.
  assert result["fgsm_eps0.3_detection_rate_successful"] == pytest.approx(
      np.mean(flagged[fooled]), abs=1e-6)
  assert result["accuracy"] == pytest.approx(np.mean(clean))


def test_the_histogram_figure(detected, tmp_path):
  evaluator, *_ = detected
  evaluator.draw(None, str(tmp_path), None, 0)
  assert (tmp_path / "detection_distances.png").read_bytes()[:4] == b"\x89PNG"


def test_the_distance_is_the_l2_norm_per_example():
  images = jnp.zeros((2, 2, 2, 1))
  reconstructions = jnp.asarray([[[[3.0], [4.0]], [[0.0], [0.0]]],
                                 [[[1.0], [1.0]], [[1.0], [1.0]]]])
  np.testing.assert_allclose(reconstruction_distance(images, reconstructions), [5.0, 2.0])


def test_without_a_validation_split_it_is_refused(bars_700_300):
  with pytest.raises(UsageError, match="never on the test set.*validation_size"):
    build_evaluators(capsnet_evaluator_config(bars_700_300, detection=SETTINGS))


def test_a_model_without_a_decoder_is_refused(bars_700_300):
  config = evaluator_config(bars_700_300, detection=SETTINGS)  # The baseline CNN.
  config.data.validation_size = 50
  with pytest.raises(UsageError, match="does not reconstruct"):
    build_evaluators(config)


def test_each_rate_is_counted_over_its_own_examples(detected, monkeypatch):
  """run()'s bookkeeping on distances given by hand (six test images, one attack), where the
  rate over all attacked images, over the fooled ones and the false positives all differ."""
  evaluator = detected[0]
  validation = np.linspace(0.0, 1.0, 101)  # Threshold: the 95th percentile, 0.95.
  values = {
      "clean_accuracy": np.array([1, 1, 1, 1, 1, 0]),
      "clean_distance": np.array([0.1, 0.2, 2.0, 0.3, 0.4, 0.5]),
      "fgsm_eps0.3_distance": np.array([2.0, 0.1, 3.0, 0.2, 2.5, 0.1]),
      "fgsm_eps0.3_fooled": np.array([1, 1, 1, 0, 0, 0]),
      "fgsm_eps0.3_accuracy": np.array([0, 0, 0, 1, 1, 0]),
      # Budget 0 (the evaluator's checks read it): nothing moves.
      "fgsm_eps0_distance": np.array([0.1, 0.2, 2.0, 0.3, 0.4, 0.5]),
      "fgsm_eps0_fooled": np.zeros(6),
      "fgsm_eps0_accuracy": np.array([1, 1, 1, 1, 1, 0]),
  }

  class Runner:
    def collect(self, fn, variables, eval_set, progress=None):
      return {"distance": validation} if eval_set is evaluator.validation_set else values

  monkeypatch.setattr(evaluator, "batched", Runner())
  monkeypatch.setattr(evaluator, "attack_fns", {"fgsm": None})
  result = evaluator.run(None)
  assert result["threshold"] == pytest.approx(0.95)
  assert result["false_positive_rate"] == pytest.approx(1 / 6)
  assert result["fgsm_eps0.3_detection_rate"] == pytest.approx(3 / 6)     # Flagged: 0, 2, 4.
  assert result["fgsm_eps0.3_detection_rate_successful"] == pytest.approx(2 / 3)  # Of 0, 1, 2.
  assert result["fgsm_eps0.3_undetected_success_rate"] == pytest.approx(1 / 5)  # 1, of 5 right.
  assert result["fgsm_eps0.3_success_rate"] == pytest.approx(3 / 5)
  assert result["fgsm_eps0.3_accuracy"] == pytest.approx(2 / 6)
  assert result["clean_accuracy"] == pytest.approx(5 / 6)
