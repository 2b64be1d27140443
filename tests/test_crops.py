"""Crops moved from the centre (capsjax/datasets/images.py: crop_at) and the crop-averaging
evaluator (capsjax/evaluators/crops.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.datasets.images import centre_crop, crop_at
from capsjax.evaluators.crops import CODE_OFFSETS
from helpers import assert_trained


def test_crop_at_moves_the_centre_crop_by_the_offset():
  images = np.arange(2 * 48 * 48 * 2).reshape(2, 48, 48, 2)
  np.testing.assert_array_equal(crop_at(images, 32, 0, 0), centre_crop(images, 32))
  np.testing.assert_array_equal(crop_at(images, 32, 1, -2), images[:, 9:41, 6:38])
  np.testing.assert_array_equal(crop_at(images, 32, -8, 8), images[:, 0:32, 16:48])
  with pytest.raises(ValueError, match=r"offset \(9, 0\) leaves the 48x48 image"):
    crop_at(images, 32, 9, 0)
  # Traced offsets (one compiled program for every crop) take the same patches.
  moved = jax.jit(lambda offset: crop_at(jnp.asarray(images), 32, offset[0], offset[1]))
  for offset in ((0, 0), (1, -2), (-8, 8), (3, -3)):
    np.testing.assert_array_equal(moved(np.asarray(offset, np.int32)),
                                  crop_at(images, 32, *offset))


def test_the_codes_thirteen_crops():
  assert len(set(CODE_OFFSETS)) == 13 and CODE_OFFSETS[0] == (0, 0)
  assert {abs(dy) for dy, _ in CODE_OFFSETS[1:]} == {1, 2, 3}
  assert all(abs(dy) == abs(dx) for dy, dx in CODE_OFFSETS)  # Diagonal shifts only.


def test_offsets_beyond_the_image_are_refused(tmp_path):
  import smallnorb_em
  import tensorflow_datasets as tfds
  from capsjax.common.errors import UsageError
  from capsjax.training.setup import Setup

  config = smallnorb_em.get_config("smoke")
  config.evals.patching.offsets = ((0, 0), (9, 9))
  with tfds.testing.mock_data(num_examples=32), pytest.raises(
      UsageError, match=r"patching.offsets=.*moves at most \(8, 8\) px"):
    Setup(config).evaluations()


def test_smallnorb_em_trains_on_mock_data_and_its_centre_crop_is_the_test_set(tmp_path):
  """configs/smallnorb_em.py end to end on tfds mock data (smallNORB cannot be downloaded
  here): the crop-averaging evaluation's centre crop scores what the test evaluation does."""
  import ml_collections
  import smallnorb_em
  import tensorflow_datasets as tfds
  from capsjax import train
  from capsjax.training.setup import Setup

  config = smallnorb_em.get_config("smoke")
  assert tuple(config.evals.patching.get("offsets", CODE_OFFSETS)) == CODE_OFFSETS
  config.train.num_steps = 2
  config.evals.patching.offsets = ((0, 0), (1, 1), (-3, 3))
  with tfds.testing.mock_data(num_examples=64):
    summary = train.train_and_evaluate(config, tmp_path)
  assert summary["step"] == 2
  with tfds.testing.mock_data(num_examples=64):
    assert_trained(tmp_path)
  patching = summary["evaluations"]["patching"]
  assert patching["crops"] == 3 and patching["chance"] == 0.2
  assert patching["centre_accuracy"] == summary["test_accuracy"]
  # The averaged accuracy by hand: each crop scored on its own (an evaluator of that one
  # offset), the scores summed over the crops, the argmax against the labels.
  from capsjax import evaluators
  from capsjax.config import runconfig
  from helpers import final_state

  with tfds.testing.mock_data(num_examples=64):
    setup = Setup(runconfig.load(str(tmp_path)))
    variables = final_state(tmp_path).variables
    per_crop = []
    for offset in ((0, 0), (1, 1), (-3, 3)):
      settings = ml_collections.ConfigDict({"type": "crop_average", "offsets": (offset,)})
      one = evaluators.build({"one": settings}, setup.config, setup.task.dataset,
                             setup.splits, setup.batched, log=print)["one"]
      per_crop.append(setup.batched.scores(variables, one.sets[0]))
  labels = per_crop[0][1]
  total = sum(scores for scores, _ in per_crop)
  assert patching["accuracy"] == pytest.approx(np.mean(np.argmax(total, axis=1) == labels))
  # The crops' scores differ (this briefly trained model predicts the same classes for all
  # three, though: the averaging itself is checked on designed scores below).
  assert not np.allclose(per_crop[0][0], per_crop[2][0])
  # Designed scores of the three crops of two examples (5 classes): the centre crop gets
  # example 0 wrong, the sum of the crops gets both right, their maximum both wrong.
  designed = [np.array([[0.9, 0.0, 0.0, 0.0, 0.0], [0.0, 0.6, 0.0, 0.0, 0.0]]),   # (0, 0)
              np.array([[0.0, 0.8, 0.0, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0, 0.0]]),   # (1, 1)
              np.array([[0.0, 0.7, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.7]])]   # (-3, 3)
  designed_labels = np.array([1, 1])
  with tfds.testing.mock_data(num_examples=64):
    evaluator = evaluators.build(
        {"patching": ml_collections.ConfigDict({"type": "crop_average",
                                                "offsets": ((0, 0), (1, 1), (-3, 3))})},
        setup.config, setup.task.dataset, setup.splits, setup.batched,
        log=print)["patching"]

  # The crops share one copy of the split on the devices and differ only in their offset.
  assert all(crops.examples is evaluator.sets[0].examples for crops in evaluator.sets)
  assert [tuple(np.asarray(crops.shared["crop_offset"])) for crops in evaluator.sets] == [
      (0, 0), (1, 1), (-3, 3)]

  class Designed:  # Each crop's set scored as designed.
    def scores(self, params, crops):
      return designed[evaluator.sets.index(crops)], designed_labels

  evaluator.batched = Designed()
  result = evaluator.run(variables)
  assert result["centre_accuracy"] == 0.5 and result["accuracy"] == 1.0
  assert np.mean(np.max(designed, axis=0).argmax(1) == designed_labels) == 0.0


def test_crop_average_sums_the_scores_of_every_crop_before_the_argmax():
  """Three crops whose scores each pick another class for the first example: the average
  picks the class no single crop leads with (by hand), so an evaluator that kept one crop,
  or voted per crop, would score it differently."""
  from capsjax.evaluators.crops import CropAverageEvaluator

  scores = [np.array([[0.6, 0.0, 0.5], [0.9, 0.1, 0.0]]),
            np.array([[0.0, 0.6, 0.5], [0.8, 0.0, 0.1]]),
            np.array([[0.1, 0.1, 0.6], [0.0, 0.9, 0.0]])]  # Sums: [0.7, 0.7, 1.6], [1.7, 1, .1]
  labels = np.array([2, 0])

  class Runner:
    def scores(self, params, crop):
      return scores[crop], labels

  evaluator = CropAverageEvaluator.__new__(CropAverageEvaluator)
  evaluator.name, evaluator.batched, evaluator.num_classes = "patching", Runner(), 3
  evaluator.offsets, evaluator.sets = ((0, 0), (1, 1), (-1, -1)), [0, 1, 2]
  result = evaluator.run(params=None)
  assert result["accuracy"] == 1.0 and result["error"] == 0.0 and result["crops"] == 3
  assert result["centre_accuracy"] == 0.5  # The first crop alone: example 0 wrong.
  assert result["chance"] == pytest.approx(1 / 3)
