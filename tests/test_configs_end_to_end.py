"""The shipped configs beyond MNIST end to end (affNIST, MultiMNIST, CIFAR-10, SVHN,
smallNORB), through `train_and_evaluate` on generated or mocked data."""

import json

import numpy as np
import pytest

from helpers import assert_trained, final_params, write_affnist


def _smoke(config_module, variant, idx_dir, **train):
  config = config_module.get_config(variant)
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.train.update(train)
  return config


@pytest.mark.figures
def test_affnist_configs_end_to_end(idx_dir, tmp_path):
  """Tiny variants of configs/affnist.py, CapsNet and the baseline CNN: every evaluation lands
  in summary.json and metrics.jsonl; the baseline (no decoder) draws curves but no
  reconstructions."""
  import affnist
  from capsjax import train

  images = np.random.default_rng(0).integers(0, 256, (12, 40, 40), dtype=np.uint8)
  write_affnist(tmp_path / "test.mat", images, np.arange(12) % 10)
  for variant in ("smoke", "baseline_smoke"):
    config = _smoke(affnist, variant, idx_dir)
    config.evals.affnist.path = str(tmp_path / "test.mat")
    workdir = tmp_path / variant
    summary = train.train_and_evaluate(config, workdir)
    assert set(summary["evaluations"]) == {"test", "test_random_placement", "affine_mnist",
                                           "affnist"}
    assert summary["test_accuracy"] == summary["evaluations"]["test"]["accuracy"]
    assert json.loads((workdir / "summary.json").read_text())["evaluations"] == json.loads(
        json.dumps(summary["evaluations"]))
    kinds = {r["kind"] for r in map(json.loads, open(workdir / "metrics.jsonl"))}
    assert kinds == {"train", "test", "test_random_placement", "affine_mnist", "affnist"}
    for name in ("affine_mnist_examples.png", "affnist_examples.png"):
      assert (workdir / name).read_bytes()[:4] == b"\x89PNG", name
    assert (workdir / "reconstructions.png").exists() == (variant == "smoke")
    assert (workdir / "training_curves.png").exists()
  assert "cross_entropy" in summary["evaluations"]["test"]  # The baseline's own loss.


@pytest.mark.figures
def test_multimnist_end_to_end_resumes_exactly_and_draws_fig5(idx_dir, tmp_path):
  """The pairs drawn at each step are a function of the step: a run stopped at step 4 and
  resumed ends where an uninterrupted one does."""
  import multimnist
  from capsjax import train

  full = train.train_and_evaluate(_smoke(multimnist, "smoke", idx_dir), tmp_path / "full")

  def no_figures(config):  # The resumed run's figures are not looked at (the full run's are).
    config.eval.figures = False
    return config

  train.train_and_evaluate(no_figures(_smoke(multimnist, "smoke", idx_dir, num_steps=4)),
                           tmp_path / "resumed")
  resumed = train.train_and_evaluate(no_figures(_smoke(multimnist, "smoke", idx_dir)),
                                     tmp_path / "resumed")
  assert resumed["step"] == full["step"] == 8
  assert resumed["test_loss"] == full["test_loss"]
  assert set(full["evaluations"]["test"]) >= {"accuracy", "at_least_one", "loss",
                                              "margin_loss", "reconstruction_loss"}
  # Its predictions: two labels and the two top classes per pair; correct where both match.
  from capsjax.runs import predictions
  test = predictions.read(str(tmp_path / "full" / predictions.RUN_FILE))[0]["test"]
  assert test.label.shape == test.predicted.shape == (len(test), 2)
  both = np.all(np.sort(test.label, 1) == np.sort(test.predicted, 1), axis=1)
  np.testing.assert_array_equal(test.correct, both)
  assert test.correct.mean() == pytest.approx(full["test_accuracy"])
  assert len(set(test.digest.tolist())) > 0.9 * len(test)  # Pairs told apart.
  for name in ("reconstructions.png", "forced_reconstructions.png"):
    assert (tmp_path / "full" / name).read_bytes()[:4] == b"\x89PNG", name
  baseline = train.train_and_evaluate(_smoke(multimnist, "baseline_smoke", idx_dir),
                                      tmp_path / "baseline")
  assert "at_least_one" in baseline["evaluations"]["test"]
  assert not (tmp_path / "baseline" / "reconstructions.png").exists()


@pytest.mark.parametrize("name", ["cifar10", "svhn", "smallnorb"])
def test_image_configs_train_end_to_end_on_mock_data(tmp_path, name):
  """Our machines cannot download these datasets: tfds's mock data stands in (flax's
  examples test the same way)."""
  import importlib

  import tensorflow_datasets as tfds
  from capsjax import train

  config = importlib.import_module(name).get_config("smoke")
  with tfds.testing.mock_data(num_examples=64):
    summary = train.train_and_evaluate(config, tmp_path / name)
  assert summary["step"] == 8
  with tfds.testing.mock_data(num_examples=64):
    assert_trained(tmp_path / name)
  # The final checkpoint, restored and evaluated again, gives the summary's test accuracy.
  from capsjax.config import runconfig
  from capsjax.training.setup import Setup

  with tfds.testing.mock_data(num_examples=64):
    setup = Setup(runconfig.load(str(tmp_path / name)))
    again = setup.evaluations()["test"].run(final_params(tmp_path / name))
  assert again["accuracy"] == summary["test_accuracy"] and summary["selected_on"] == "final"
  # The run records the shape its dataset makes; the caller's config is not written.
  from capsjax import datasets

  assert summary["config"]["model"]["image_shape"] == list(
      datasets.get(config).info.image_shape)
  assert config.model.image_shape is None
