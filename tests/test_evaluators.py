"""evaluators: batched weighted means against one NumPy pass, the shift grid, the fixed random
copy, the affine sets, the registry."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from capsjax import evaluators
from capsjax.common.errors import UsageError
from capsjax.evaluators import splits as splits_evaluators
from helpers import build_evaluators, evaluator_config, write_affnist, write_idx_dataset


@pytest.fixture(scope="module")
def bars_64_37(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 64 train, 37 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=37)


def test_batched_weighted_means_equal_one_pass_over_the_set(bars_64_37):
  built, params, model, splits, _ = build_evaluators(evaluator_config(bars_64_37))
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


def moved_by_hand(images: np.ndarray, dx: int, dy: int) -> np.ndarray:
  """Image content moved ``dx`` px right and ``dy`` px down, zero fill, pixel by pixel."""
  out = np.zeros_like(images)
  h, w = images.shape[1:3]
  for y in range(h):
    for x in range(w):
      if 0 <= y - dy < h and 0 <= x - dx < w:
        out[:, y, x] = images[:, y - dy, x - dx]
  return out


def accuracy_by_hand(model, images: np.ndarray, labels: np.ndarray) -> float:
  outputs = model.apply({"images": jnp.asarray(images / 255.0, jnp.float32),
                         "labels": jnp.asarray(labels)}, train=False)
  return float(np.mean(np.asarray(outputs.predictions) == labels))


def test_shift_grid_moves_the_images_by_each_shift_and_averages(bars_64_37):
  """Each shift's accuracy against the test digits moved by hand (so a shift that did
  nothing, or moved the other way, fails: this model's predictions change with the shift)."""
  config = evaluator_config(bars_64_37, grid={"type": "shifted", "max_shift": 1})
  built, params, model, splits, _ = build_evaluators(config)
  test, grid = built["test"].run(params), built["grid"].run(params)
  by_shift = grid["accuracy_by_shift"]
  assert sorted(by_shift) == sorted(f"{dx},{dy}" for dx in (-1, 0, 1) for dy in (-1, 0, 1))
  assert by_shift["0,0"] == test["accuracy"]
  images, labels = splits["test"].examples["images"], splits["test"].examples["labels"]
  expected = {f"{dx},{dy}": accuracy_by_hand(model, moved_by_hand(images, dx, dy), labels)
              for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
  assert by_shift == pytest.approx(expected)
  assert len(set(expected.values())) > 1  # The shifts matter to this model.
  assert grid["accuracy"] == pytest.approx(np.mean(list(by_shift.values())))
  bad = evaluator_config(bars_64_37, grid={"type": "shifted", "max_shift": 28})
  with pytest.raises(UsageError, match="max_shift=28 .*use 0 up to 27"):
    build_evaluators(bad)


def test_the_shift_table_has_a_row_per_dy_and_a_column_per_dx():
  accuracies = {f"{dx},{dy}": (10 * (dy + 1) + (dx + 1)) / 100
                for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
  lines = splits_evaluators.shift_table(accuracies, 1).splitlines()
  assert "rows dy (down +), columns dx (right +)" in lines[0]
  assert lines[1].split() == ["dy\\dx", "-1", "0", "1"]
  assert [line.split() for line in lines[2:]] == [
      ["-1", "0.00", "1.00", "2.00"], ["0", "10.00", "11.00", "12.00"],
      ["1", "20.00", "21.00", "22.00"]]


def test_randomly_shifted_copy_is_fixed_by_its_seed(bars_64_37):
  config = evaluator_config(bars_64_37, moved={"type": "randomly_shifted", "seed": 3},
                       again={"type": "randomly_shifted", "seed": 3},
                       other={"type": "randomly_shifted", "seed": 4},
                       none={"type": "randomly_shifted", "max_shift": 0})
  built, params, model, splits, _ = build_evaluators(config)
  shifts = built["moved"].shifts
  assert np.abs(shifts).max() <= config.data.shift_pixels and shifts.shape == (37, 2)
  np.testing.assert_array_equal(shifts, built["again"].shifts)
  assert not np.array_equal(shifts, built["other"].shifts)
  assert built["moved"].run(params) == built["again"].run(params)
  assert built["none"].run(params) == built["test"].run(params)
  # Image k moved by its own (dx, dy), by hand.
  images, labels = splits["test"].examples["images"], splits["test"].examples["labels"]
  moved = np.stack([moved_by_hand(images[k:k + 1], dx, dy)[0]
                    for k, (dx, dy) in enumerate(shifts)])
  np.testing.assert_array_equal(built["moved"].set.host.examples["images"], moved)
  assert built["moved"].run(params)["accuracy"] == pytest.approx(
      accuracy_by_hand(model, moved, labels))


def test_affine_sets_and_the_test_limit(bars_64_37, tmp_path):
  config = evaluator_config(
      bars_64_37, affine_mnist={"type": "affine_mnist", "transforms_per_digit": 3, "seed": 0},
      affnist={"type": "affnist", "path": None})
  config.data.test_limit = 10
  built, params, model, splits, messages = build_evaluators(config)
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
    build_evaluators(config)


def test_validation_split_is_evaluated_and_the_registry_checks_types(bars_64_37):
  config = evaluator_config(bars_64_37)
  config.data.validation_size = 16
  built, *_ = build_evaluators(config)
  assert set(built) == {"test", "validation"} and built["validation"].set.size == 16
  config.evals.extra = ml_collections.ConfigDict({"type": "top5"})
  with pytest.raises(UsageError, match="config.evals.extra.type='top5' is not a registered"):
    build_evaluators(config)
  del config.evals["extra"], config.evals["test"]
  with pytest.raises(UsageError, match="needs an evaluation named 'test'"):
    build_evaluators(config)


def test_a_resolved_configs_evaluators_are_built_resolving_and_looking_up_nothing(
    bars_64_37, monkeypatch):
  """config.evals and the validation evaluation the data add were resolved with the config (its
  choices): building their evaluators resolves no setting and asks no registry."""
  from capsjax.config import registries, schema, settings

  config = evaluator_config(bars_64_37)
  config.data.validation_size = 16
  resolved = schema.resolve_config(config)
  assert resolved.choices.held_out.to_dict() == {"type": "split", "split": "validation"}
  assert resolved.choices.evaluators == {"split": splits_evaluators.SplitEvaluator}

  # Evaluations besides the config's (capsjax.evaluate's --evals) are resolved once, up front.
  extra, classes = evaluators.check_types({"shifts": ml_collections.ConfigDict(
      {"type": "shifted", "max_shift": 1})})
  assert classes == {"shifted": splits_evaluators.ShiftGridEvaluator}

  def refuse(*args, **kwargs):
    raise AssertionError(f"resolved or looked up again: {args}")
  for module, name in ((schema, "resolve_evaluation"), (settings, "resolve"),
                       (registries.EVALUATORS, "get"), (registries.ROUTERS, "get")):
    monkeypatch.setattr(module, name, refuse)
  built, _, _, splits, _ = build_evaluators(resolved)
  assert set(built) == {"test", "validation"} and built["validation"].set.size == 16
  assert built["validation"].settings is resolved.choices.held_out
  test = built["test"]
  shifts = evaluators.build(extra, resolved, test.builder, splits, test.batched, classes=classes)
  assert shifts["shifts"].settings.to_dict() == {"type": "shifted", "split": "test",
                                                 "max_shift": 1}


def test_a_misspelled_evaluator_setting_is_refused_not_defaulted():
  """Every capsjax evaluator declares the settings it reads: one it does not have (here
  ``epsilon`` for ``epsilons``) stops the run naming it, instead of running the default. A
  researcher's own evaluator that declares none is not checked."""
  for kind, key in (("adversarial", "epsilon"), ("split", "splits"),
                    ("reconstruction_detection", "percentil"), ("transforms", "rotation")):
    settings = {"mine": ml_collections.ConfigDict({"type": kind, key: 1})}
    with pytest.raises(UsageError, match=rf"config.evals.mine.{key} is not a setting of "
                                         rf"evaluator type '{kind}'; did you mean "):
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


def test_a_setting_left_out_or_none_is_its_declared_default():
  """``Evaluator.setting``: the config's value, else the class's declared default (also for
  None); a key the class does not declare is an error, not a silent None."""

  class Declared(evaluators.Evaluator):
    SETTINGS = {"split": "test", "limit": 1000}

  def built(cls, **settings):
    return cls("x", ml_collections.ConfigDict(settings), None, None, {}, None)

  assert built(Declared).setting("limit") == 1000
  assert built(Declared, limit=None).setting("limit") == 1000
  assert built(Declared, limit=7).setting("limit") == 7
  assert built(Declared, limit=7).count("limit", minimum=1) == 7
  with pytest.raises(UsageError, match="config.evals.x.limit"):
    built(Declared, limit=-1).count("limit")
  with pytest.raises(KeyError, match="does not declare it"):
    built(Declared).setting("seed")
  with pytest.raises(TypeError):  # The removed default argument is not taken as a minimum.
    built(Declared).count("limit", 1000)


def test_every_built_in_evaluator_declares_its_settings_beside_its_code():
  """Each registered evaluator class declares every setting it reads, as a Setting."""
  from capsjax.config.settings import Setting

  for name in evaluators.types():
    table = evaluators.EVALUATORS.get(name).SETTINGS
    assert table is not None and all(isinstance(s, Setting) for s in table.values()), name


