"""The transforms evaluator: each transform against an independent one, the identities, the
familiar and novel rotation averages, the figure and the settings it refuses."""

import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.common.errors import UsageError
from capsjax.datasets import augment
from capsjax.evaluators.transforms import transform
from helpers import build_evaluators, evaluator_config, write_idx_dataset

SMALL = {"type": "transforms", "rotations": (-60.0, -30.0, 0.0, 45.0, 90.0),
         "scales": (0.8, 1.0), "shears": (0.0, 0.3), "translations": (0.0, 2.0),
         "familiar_degrees": 30.0, "limit": 24}


@pytest.fixture(scope="module")
def bars_64_24(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 64 train, 24 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=24)


def _images():
  rng = np.random.default_rng(0)
  return rng.integers(0, 256, (3, 28, 28, 1)).astype(np.uint8)


@pytest.mark.parametrize("kind,value", [("rotations", 0.0), ("scales", 1.0), ("shears", 0.0),
                                        ("translations", 0.0)])
def test_the_identity_of_each_transform_changes_nothing(kind, value):
  images = _images()
  np.testing.assert_array_equal(transform(images, kind, value), images)


def test_a_whole_pixel_translation_is_a_shift_with_zero_fill():
  images = _images()
  np.testing.assert_array_equal(transform(images, "translations", 3.0),
                                augment.shift_images(images, 3, 0))


def scipy_transform(image: np.ndarray, kind: str, value: float) -> np.ndarray:
  """One grey image ``(h, w)`` moved about its centre by SciPy's affine warp (bilinear, zero
  outside): output pixel o samples the input at ``F^-1 (o - c) + c`` for the forward map F on
  (y, x): a counter-clockwise turn on screen, a scale, or the shear ``x += k y``."""
  import scipy.ndimage

  c = (np.array(image.shape) - 1) / 2
  if kind == "rotations":
    t = np.deg2rad(value)
    forward = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
  elif kind == "scales":
    forward = np.diag([value, value])
  else:
    forward = np.array([[1.0, 0.0], [value, 1.0]])
  inverse = np.linalg.inv(forward)
  out = scipy.ndimage.affine_transform(image.astype(np.float64), inverse, offset=c - inverse @ c,
                                       order=1, mode="grid-constant", cval=0.0)
  return np.clip(np.rint(out), 0, 255)


@pytest.mark.parametrize("kind,value", [
    ("rotations", -60.0), ("rotations", -30.0), ("rotations", 30.0), ("rotations", 45.0),
    ("rotations", 90.0), ("scales", 0.8), ("scales", 1.3), ("shears", 0.3), ("shears", -0.5)])
def test_each_transform_is_scipys_affine_warp(kind, value):
  """Against SciPy's warp (an implementation of its own): equal but for rounding at .5 (one
  grey level on a few pixels; measured: rotations and 0.8 exact, 1.3 on 0.1%, shear 0.3 on
  2% of the pixels)."""
  images = _images()
  ours = transform(images, kind, value)[..., 0].astype(np.float64)
  theirs = np.stack([scipy_transform(image[..., 0], kind, value) for image in images])
  difference = np.abs(ours - theirs)
  assert difference.max() <= 1 and np.mean(difference > 0) < 0.03, (difference.max(),
                                                                     np.mean(difference > 0))


@pytest.mark.parametrize("degrees", [-60.0, 30.0, 45.0, 90.0])
def test_rotations_turn_as_scipys_rotate(degrees):
  """The direction and centre of a turn, from SciPy's own rotation (positive: counter-clockwise
  on screen), not from the matrix written above."""
  import scipy.ndimage

  image = _images()[0, ..., 0]
  theirs = scipy.ndimage.rotate(image.astype(np.float64), degrees, reshape=False, order=1,
                                mode="grid-constant", cval=0.0)
  ours = transform(_images()[:1], "rotations", degrees)[0, ..., 0].astype(np.float64)
  assert np.abs(ours - np.clip(np.rint(theirs), 0, 255)).max() <= 1


def test_a_quarter_turn_is_counter_clockwise_and_a_half_scale_halves_offsets():
  image = np.zeros((1, 29, 29, 1), np.uint8)
  image[0, 14, 22] = 255  # 8 px right of the centre (14, 14).
  turned = transform(image, "rotations", 90.0)[0, ..., 0]
  assert np.unravel_index(np.argmax(turned), turned.shape) == (6, 14)  # 8 px above it.
  scaled = transform(image, "scales", 0.5)[0, ..., 0]
  assert np.unravel_index(np.argmax(scaled), scaled.shape) == (14, 18)
  sheared = transform(np.roll(image, 6, axis=1), "shears", 0.5)[0, ..., 0]  # Below by 6 ...
  assert np.unravel_index(np.argmax(sheared), sheared.shape) == (20, 25)  # x += 0.5 * 6.


def test_the_sweeps_and_the_familiar_and_novel_averages(bars_64_24, tmp_path):
  built, params, model, splits, _ = build_evaluators(evaluator_config(bars_64_24, transforms=SMALL))
  evaluator = built["transforms"]
  result = evaluator.run(params)
  # The untransformed sets are the sample itself: the accuracy of the test split's sample.
  test = built["test"].run(params)["accuracy"]
  for key in ("rotation_0_accuracy", "scale_1_accuracy", "shear_0_accuracy",
              "translation_0_accuracy"):
    assert result[key] == pytest.approx(test)
  # Every other value: the sample moved by that transform (tested above), scored by hand.
  images, labels = splits["test"].examples["images"], splits["test"].examples["labels"]
  moved_accuracies = []
  for kind, name in (("rotations", "rotation"), ("scales", "scale"), ("shears", "shear"),
                     ("translations", "translation")):
    for value in SMALL[kind]:
      moved = transform(images, kind, value)
      outputs = model.apply({"images": jnp.asarray(moved / 255.0, jnp.float32),
                             "labels": jnp.asarray(labels)}, train=False)
      by_hand = float(np.mean(np.asarray(outputs.predictions) == labels))
      assert result[f"{name}_{value:g}_accuracy"] == pytest.approx(by_hand), (kind, value)
      moved_accuracies.append(by_hand)
  assert len(set(moved_accuracies)) > 1  # The transforms matter to this model.
  familiar = np.mean([result[f"rotation_{a}_accuracy"] for a in ("-30", "0")])
  novel = np.mean([result[f"rotation_{a}_accuracy"] for a in ("-60", "45", "90")])
  assert result["familiar_rotation_accuracy"] == pytest.approx(familiar)
  assert result["novel_rotation_accuracy"] == pytest.approx(novel)
  assert result["accuracy"] == result["novel_rotation_accuracy"]
  assert result["chance"] == pytest.approx(0.1)
  evaluator.draw(None, str(tmp_path), None, 0)
  assert (tmp_path / "transforms_curves.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("settings,message", [
    ({"familiar_degrees": 95.0}, "familiar_degrees=95"),
    ({"rotations": (0.0, 10.0)}, "within and beyond"),
    ({"scales": (0.0, 1.0)}, r"scales=\(0\.0, 1\.0\) is out of range: it must be each > 0"),
    ({"split": "nope"}, "split='nope'"),
])
def test_bad_settings_are_usage_errors(bars_64_24, settings, message):
  with pytest.raises(UsageError, match=message):
    build_evaluators(evaluator_config(bars_64_24, transforms={**SMALL, **settings}))
