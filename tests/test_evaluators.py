"""evaluators: batched weighted means against one NumPy pass, the shift grid, the fixed random
copy, the affine sets, the registry."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

import mnist_baseline
from capsjax import evaluators
from capsjax.common.errors import UsageError
from capsjax.training import evaluation, runtime, tasks
from helpers import write_idx_dataset
from test_datasets_affnist import write_affnist


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=37)


def make_config(idx_dir, **evals):
  c = mnist_baseline.get_config("smoke")
  c.data.source, c.data.dir, c.data.test_limit = "idx", str(idx_dir), 0
  c.eval.batch_size = 8
  for name, settings in evals.items():
    c.evals[name] = ml_collections.ConfigDict(settings)
  return c


def build(config):
  task = tasks.Task.from_config(config)
  splits = task.dataset.load()
  model = task.model(nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  runner = evaluation.Runner(task, runtime.make_mesh(), config.eval.batch_size)
  messages = []
  built = evaluators.build_all(task.config, task.dataset, splits, runner, log=messages.append)
  return built, params, model, splits, messages


def test_batched_weighted_means_equal_one_pass_over_the_set(idx_dir):
  built, params, model, splits, _ = build(make_config(idx_dir))
  got = built["test"].run(params)
  test = splits["test"].examples
  assert len(test["images"]) == 37  # Not a multiple of the batch: padding must weigh 0.
  batch = {"images": jnp.asarray(test["images"] / 255.0, jnp.float32),
           "labels": jnp.asarray(test["labels"])}
  outputs = model.apply(batch, train=False)
  loss, _ = model.loss(outputs, batch)
  accuracy = float(np.mean(np.asarray(outputs.predictions) == test["labels"]))
  np.testing.assert_allclose(got["loss"], float(np.mean(loss)), rtol=1e-5)
  np.testing.assert_allclose(got["cross_entropy"], got["loss"], rtol=1e-6)
  assert got["accuracy"] == pytest.approx(accuracy) and got["error"] == pytest.approx(1 - accuracy)


def test_shift_grid_and_its_centre(idx_dir):
  config = make_config(idx_dir, grid={"type": "shifted", "max_shift": 1})
  built, params, *_ = build(config)
  test, grid = built["test"].run(params), built["grid"].run(params)
  by_shift = grid["accuracy_by_shift"]
  assert sorted(by_shift) == sorted(f"{dx},{dy}" for dx in (-1, 0, 1) for dy in (-1, 0, 1))
  assert by_shift["0,0"] == test["accuracy"]
  assert grid["accuracy"] == pytest.approx(np.mean(list(by_shift.values())))
  bad = make_config(idx_dir, grid={"type": "shifted", "max_shift": 28})
  with pytest.raises(UsageError, match="max_shift=28 .*use 0 up to 27"):
    build(bad)


def test_randomly_shifted_copy_is_fixed_by_its_seed(idx_dir):
  config = make_config(idx_dir, moved={"type": "randomly_shifted", "seed": 3},
                       again={"type": "randomly_shifted", "seed": 3},
                       other={"type": "randomly_shifted", "seed": 4},
                       none={"type": "randomly_shifted", "max_shift": 0})
  built, params, *_ = build(config)
  shifts = built["moved"].shifts
  assert np.abs(shifts).max() <= config.data.shift_pixels and shifts.shape == (37, 2)
  np.testing.assert_array_equal(shifts, built["again"].shifts)
  assert not np.array_equal(shifts, built["other"].shifts)
  assert built["moved"].run(params) == built["again"].run(params)
  assert built["none"].run(params) == built["test"].run(params)


def test_affine_sets_and_the_test_limit(idx_dir, tmp_path):
  config = make_config(idx_dir, affine_mnist={"type": "affine_mnist", "transforms_per_digit": 3,
                                              "seed": 0},
                       affnist={"type": "affnist", "path": None})
  config.data.test_limit = 10
  built, params, model, splits, messages = build(config)
  assert built["affine_mnist"].set.size == 10 and built["test"].set.size == 10
  assert "affnist" not in built and "set --config.evals.affnist.path" in messages[0]
  metrics = built["affine_mnist"].run(params)
  host = built["affine_mnist"].set.host.examples  # The transformed digits, by hand:
  outputs = model.apply({"images": jnp.asarray(host["images"] / 255.0, jnp.float32),
                         "labels": jnp.asarray(host["labels"])}, train=False)
  by_hand = float(np.mean(np.asarray(outputs.predictions) == host["labels"]))
  assert metrics["accuracy"] == pytest.approx(by_hand) and np.isfinite(metrics["loss"])
  built["affine_mnist"].draw(model, str(tmp_path), None, 0)
  assert (tmp_path / "affine_mnist_examples.png").read_bytes()[:4] == b"\x89PNG"

  # The real files' 40x40 images do not fit this 28x28 model: refused, naming both shapes.
  images = np.random.default_rng(0).integers(0, 256, (5, 40, 40), dtype=np.uint8)
  write_affnist(tmp_path / "test.mat", images, np.arange(5))
  config.evals.affnist.path = str(tmp_path / "test.mat")
  with pytest.raises(UsageError, match=r"images are \(40, 40, 1\) but the model takes "
                                       r"\(28, 28, 1\)"):
    build(config)


def test_validation_split_is_evaluated_and_the_registry_checks_types(idx_dir):
  config = make_config(idx_dir)
  config.data.validation_size = 16
  built, *_ = build(config)
  assert set(built) == {"test", "validation"} and built["validation"].set.size == 16
  config.evals.extra = ml_collections.ConfigDict({"type": "top5"})
  with pytest.raises(UsageError, match="config.evals.extra.type='top5' is not a registered"):
    evaluators.validate(config)
  del config.evals["extra"], config.evals["test"]
  with pytest.raises(UsageError, match="needs an evaluation named 'test'"):
    evaluators.validate(config)


def test_a_misspelled_evaluator_setting_is_refused_not_defaulted():
  """Every capsjax evaluator declares the settings it reads: one it does not have (here
  ``epsilon`` for ``epsilons``) stops the run naming it, instead of running the default. A
  researcher's own evaluator that declares none is not checked."""
  for kind, key in (("adversarial", "epsilon"), ("split", "splits"),
                    ("reconstruction_detection", "percentil"), ("transforms", "rotation")):
    settings = {"mine": ml_collections.ConfigDict({"type": kind, key: 1})}
    with pytest.raises(UsageError, match=rf"config.evals.mine.{key} is not a setting of "
                                         rf"evaluator type '{kind}'; it has \["):
      evaluators.check_types(settings)
  evaluators.check_types({"mine": ml_collections.ConfigDict(
      {"type": "adversarial", "epsilons": (0.1,), "limit": 10})})
  own = f"{__file__}:Undeclared"
  evaluators.check_types({"mine": ml_collections.ConfigDict({"type": own, "anything": 1})})
  with pytest.raises(UsageError, match="config.evals.mine.epsilom is not a setting"):
    evaluators.check_types({"mine": ml_collections.ConfigDict(
        {"type": "examples/input_gradients.py:FGSM", "epsilom": 0.1})})


class Undeclared(evaluators.Evaluator):
  """A researcher's evaluator without ``SETTINGS``: its settings are not checked."""
