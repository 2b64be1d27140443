"""runconfig: what a resume changed, the kept config, loading old workdirs' configs."""

import json
import pathlib

import pytest

import mnist
from capsjax import evaluators
from capsjax.common.errors import UsageError
from capsjax.config import migrations, runconfig
from capsjax.training import optimizers, tasks
from capsjax.config import history, schema

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def test_config_changes_name_what_a_resume_changes_and_skip_run_length():
  before = json.loads(mnist.get_config("text").to_json_best_effort())
  after = mnist.get_config("text")
  after.train.num_epochs, after.train.eval_every_steps, after.data.dir = 2, 117, "/elsewhere"
  after.eval.batch_size = 100
  after.model.conv_impl = "native"   # How convolutions are computed: the same function.
  assert history.config_changes(before, json.loads(after.to_json_best_effort())) == []
  after.model.routing.iterations, after.optimizer.learning_rate = 1, 2e-3
  after.model.decoder.hidden = (16, 32)
  assert history.config_changes(before, json.loads(after.to_json_best_effort())) == [
      "model.decoder.hidden: [512, 1024] -> [16, 32]",
      "model.routing.iterations: 3 -> 1",
      "optimizer.learning_rate: 0.001 -> 0.002"]
  broken = json.loads(json.dumps(before))  # A config this version cannot resolve: as written.
  del broken["model"]["conv1"]["bias_init"]
  assert "model.conv1.bias_init: '(unset)' -> 0.0" in history.config_changes(
      broken, json.loads(after.to_json_best_effort()))
  # An unset router setting is its default: the same setting.
  before["model"]["routing"]["leaky"] = False
  assert not [c for c in history.config_changes(before, json.loads(
      after.to_json_best_effort())) if "leaky" in c]
  # A key added since, at the value that reproduces the earlier run, is no change ...
  before["model"]["primary"].pop("output_scale", None)
  changes = history.config_changes(before, json.loads(after.to_json_best_effort()))
  assert not [c for c in changes if "output_scale" in c]
  after.model.primary.output_scale = 1 / 32  # ... at another value it is, from the value
  assert "model.primary.output_scale: 1.0 -> 0.03125" in history.config_changes(
      before, json.loads(after.to_json_best_effort()))  # that reproduces the earlier run.
  # A run written before config.matmul_precision computed at JAX's default.
  before.pop("matmul_precision", None)
  assert not [c for c in history.config_changes(
      before, json.loads(after.to_json_best_effort())) if "matmul_precision" in c]
  after.matmul_precision = "float32"
  assert "matmul_precision: 'default' -> 'float32'" in history.config_changes(
      before, json.loads(after.to_json_best_effort()))


@pytest.mark.parametrize("validation_size", [0, 1000])
def test_resume_with_new_seed_warns_of_validation_overlap(tmp_path, capsys, validation_size):
  config = mnist.get_config()
  config.data.validation_size = validation_size
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  config.seed = 3
  history.record(str(tmp_path), config, resumed_step=10)
  out = capsys.readouterr().out
  assert "seed: 0 -> 3" in out
  assert ("validation examples overlap" in out) == bool(validation_size)
  assert json.loads((tmp_path / "config.before_step_10.json").read_text())["seed"] == 0




def test_load_fills_keys_of_later_versions_and_restores_tuples(tmp_path):
  """A config.json written before datasets, models and evaluations were registries."""
  old = json.loads(mnist.get_config("smoke").to_json_best_effort())
  del old["dataset"], old["model"]["name"], old["evals"]
  del old["optimizer"]
  old["model"]["image_shape"], old["model"]["num_classes"] = [28, 28, 1], 10  # Written then.
  old["optimizer"] = {"learning_rate": 0.001, "decay_rate": 0.96, "decay_steps": 2000,
                      "staircase": False, "b1": 0.9, "b2": 0.999, "eps": 1e-8}
  (tmp_path / "config.json").write_text(json.dumps(old))
  loaded = runconfig.load(str(tmp_path))
  assert (loaded.dataset, loaded.model.name, loaded.data.pad) == ("mnist", "capsnet", 0)
  assert loaded.train.stop_at_accuracy is None
  assert loaded.model.image_shape == (28, 28, 1) and loaded.model.decoder.hidden == (32, 64)
  assert list(evaluators.eval_settings(loaded)) == ["test"]
  task = tasks.Task.from_config(loaded)
  assert task.model_class.__name__ == "CapsNet" and task.dataset.name == "mnist"
  assert optimizers.resolve(loaded.optimizer) == optimizers.resolve(
      mnist.get_config("smoke").optimizer)  # The same Adam, only written out.


def test_the_removed_gradient_setting_is_dropped_on_load(tmp_path):
  """Runs written before 2026-11-28 recorded dynamic routing's ``model.routing.gradient``
  (``"autodiff"``, resolved from ``"auto"``, or ``"analytic"``, the written-out backward pass
  now in experiments/), before 2026-11-29 EM's: they load without it and resolve."""
  from capsjax import routing

  for name, gradient in ((None, "analytic"), ("dynamic", "autodiff")):
    old = json.loads(mnist.get_config("smoke").to_json_best_effort())
    old["model"]["routing"]["gradient"] = gradient
    if name is None:
      del old["model"]["routing"]["name"]          # Before routers had names.
    (tmp_path / "config.json").write_text(json.dumps(old))
    loaded = runconfig.load(str(tmp_path))
    assert "gradient" not in loaded.model.routing
    router, settings = routing.resolve(loaded.model.routing)
    assert router.name == "dynamic" and "gradient" not in settings
    assert history.config_changes(old, json.loads(
        mnist.get_config("smoke").to_json_best_effort())) == []
  em = json.loads(mnist.get_config("smoke").to_json_best_effort())
  em["model"]["routing"].update(name="em", gradient="analytic")
  assert "gradient" not in migrations.migrate(em)["model"]["routing"]


def test_load_and_import_name_missing_files(tmp_path):
  with pytest.raises(UsageError, match="config.json not found"):
    runconfig.load(str(tmp_path))
  with pytest.raises(UsageError, match="nope.py not found"):
    runconfig.import_config_file(tmp_path / "nope.py")


@pytest.mark.parametrize("name,variant", [
    (p.stem, variant) for p in sorted(CONFIGS.glob("*.py")) if p.stem != "images"
    for variant in ("", "smoke")])
def test_every_config_files_resolved_config_round_trips_through_config_json(name, variant):
  """What a run writes (its resolved config: router settings, shapes, placeholders left None)
  comes back from config.json with the same keys, values and types (tuples at every depth)."""
  config = schema.resolve_config(
      runconfig.import_config_file(CONFIGS / f"{name}.py").get_config(variant))
  back = runconfig.from_raw(json.loads(config.to_json_best_effort()))
  written, read = runconfig.flatten(config.to_dict()), runconfig.flatten(back.to_dict())
  assert written == read
  assert {k: type(v) for k, v in written.items()} == {k: type(v) for k, v in read.items()}
