"""One migration chain for every earlier form of config.json (capsjax/config/migrations.py):
real files written by earlier versions (tests/data/config_forms/DATE_COMMIT.json, each the
config.json of a 2-step smoke run of configs/mnist.py:smoke by that commit; em/DATE_COMMIT.json
of configs/em_mnist.py:smoke) load, resume and are rewritten in this version's form."""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

import em_mnist
import mnist
from capsjax import train
from capsjax.common import registry
from capsjax.common.errors import UsageError
from capsjax.runs import checkpointing
from capsjax.config import migrations, runconfig
from capsjax.config import history
from capsjax.training.setup import Setup
from helpers import em_smoke_run, write_idx_dataset

FORMS = sorted((pathlib.Path(__file__).parent / "data" / "config_forms").glob("*.json"))
EM_FORMS = sorted((pathlib.Path(__file__).parent / "data" / "config_forms" / "em").glob("*.json"))


def smoke(idx_dir, num_steps):
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.train.num_steps = num_steps
  return config


@pytest.fixture(scope="module")
def two_steps(idx_dir, tmp_path_factory):
  """A smoke run of 2 steps, its checkpoint at step 2, by this version."""
  workdir = tmp_path_factory.mktemp("two_steps") / "run"
  train.train_and_evaluate(smoke(idx_dir, 2), str(workdir))
  return workdir


def test_the_forms_span_the_versions_and_none_records_a_version():
  assert [f.name[:10] for f in FORMS] == ["2026-11-21", "2026-11-23", "2026-11-24",
                                          "2026-11-25", "2026-11-27"]
  for form in FORMS:
    assert migrations.VERSION_KEY not in json.loads(form.read_text())


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.stem)
def test_each_earlier_form_loads_and_resumes_as_the_same_run(form, idx_dir, two_steps,
                                                             tmp_path, capsys):
  """The run's config.json replaced by one an earlier version wrote for the same command:
  it loads in this version's form, a resume with today's command finds no setting changed
  (so the migrations reproduce that run's settings), continues from step 2, and rewrites the
  file with this version's ``schema_version``."""
  old = json.loads(form.read_text())
  old["data"]["dir"] = str(idx_dir)
  workdir = tmp_path / "run"
  shutil.copytree(two_steps, workdir)
  (workdir / "config.json").write_text(json.dumps(old))
  loaded = runconfig.load(str(workdir))
  assert loaded.model.name == "capsnet" and loaded.model.routing.name == "dynamic"
  assert "gradient" not in loaded.model.routing                # Migrations 2 and 3.
  now = json.loads(Setup(smoke(idx_dir, 3)).config.to_json_best_effort())  # Resolved.
  assert history.config_changes(old, now) == []
  capsys.readouterr()
  summary = train.train_and_evaluate(smoke(idx_dir, 3), str(workdir))
  out = capsys.readouterr().out
  assert "Resuming from the checkpoint at step 2" in out and "differ" not in out
  assert summary["step"] == 3
  written = json.loads((workdir / "config.json").read_text())
  assert written[migrations.VERSION_KEY] == migrations.SCHEMA_VERSION
  assert migrations.migrate(written) == {k: v for k, v in written.items()
                                         if k != migrations.VERSION_KEY}


def test_an_em_run_that_recorded_its_gradient_setting_resumes_as_the_same_run(
    idx_dir, tmp_path_factory, tmp_path, capsys):
  """EM's ``model.routing.gradient`` (removed in version 3; tests/data/config_forms/em/, a
  run that recorded ``"analytic"``, what ``"auto"`` ran on a CPU): the file loads without the
  key, today's command finds no setting changed, resumes from the last checkpoint of the
  session's EM smoke run (a copy; its length, train.num_steps, is neutral) and rewrites the
  file."""
  [form] = EM_FORMS
  old = json.loads(form.read_text())
  assert old[migrations.VERSION_KEY] == 2 and old["model"]["routing"]["gradient"] == "analytic"
  old["data"]["dir"] = str(idx_dir)

  def command(num_steps):
    config = em_mnist.get_config("smoke")
    config.data.source, config.data.dir = "idx", str(idx_dir)
    config.train.num_steps = num_steps
    return config

  workdir = tmp_path / "run"
  shutil.copytree(em_smoke_run(idx_dir, tmp_path_factory), workdir)  # Checkpoints 4 and 8.
  (workdir / "config.json").write_text(json.dumps(old))
  loaded = runconfig.load(str(workdir))
  assert loaded.model.routing.name == "em" and "gradient" not in loaded.model.routing
  now = json.loads(Setup(command(9)).config.to_json_best_effort())
  assert history.config_changes(old, now) == []
  capsys.readouterr()
  summary = train.train_and_evaluate(command(9), str(workdir))
  out = capsys.readouterr().out
  assert "Resuming from the checkpoint at step 8" in out and "differ" not in out
  assert summary["step"] == 9
  written = json.loads((workdir / "config.json").read_text())
  assert written[migrations.VERSION_KEY] == migrations.SCHEMA_VERSION
  assert "gradient" not in written["model"]["routing"]


def test_migrations_run_in_order_from_the_files_version():
  """Version 1's added keys are not applied to a file of version 1 (it has them or means
  their absence); version 2's unsetting and version 3's removal are; a file of this version
  round-trips; a newer one is refused, naming the version."""
  assert [m.version for m in migrations.MIGRATIONS] == list(
      range(1, migrations.SCHEMA_VERSION + 1))
  raw = {"model": {"name": "capsnet", "routing": {"name": "dynamic", "gradient": "analytic"},
                   "class_capsules": {}}, "data": {}}
  v1 = migrations.migrate({**raw, migrations.VERSION_KEY: 1})
  assert "gradient" not in v1["model"]["routing"]
  assert "dataset" not in v1 and "use_bias" not in v1["model"]["class_capsules"]
  v0 = migrations.migrate(raw)
  assert v0["dataset"] == "mnist" and v0["model"]["class_capsules"]["use_bias"] is False
  current = json.loads(mnist.get_config("smoke").to_json_best_effort())
  assert migrations.migrate(migrations.versioned(current)) == current
  # Version 3: EM's gradient, whatever it was, and every other router's unset one, go; a
  # router by import path keeps a gradient setting of its own.
  for name, gradient, kept in (("em", "autodiff", False), ("em", "auto", False),
                               ("variational_bayes", None, False), (None, None, False),
                               ("my_package.routers:ROUTER", "exact", True)):
    section = {"name": name, "gradient": gradient, "iterations": 3}
    v2 = migrations.migrate({"model": {"routing": section}, migrations.VERSION_KEY: 2})
    assert v2["model"]["routing"] == (section if kept else
                                      {"name": name, "iterations": 3}), (name, gradient)
  # Version 4: a model that never read the margin loss's section loses it.
  v3 = migrations.migrate({"model": {"name": "baseline_cnn"}, "loss": {"m_plus": 0.9},
                           migrations.VERSION_KEY: 3})
  assert "loss" not in v3 and migrations.migrate(
      {"model": {"name": "capsnet"}, "loss": {}, migrations.VERSION_KEY: 3})["loss"] == {}
  with pytest.raises(UsageError, match="schema_version=99, newer than this capsjax's 4"):
    migrations.migrate({migrations.VERSION_KEY: 99})


PRE_INJECTION = pathlib.Path(__file__).parent / "data" / "pre_injection_run"


def _flat(state) -> dict:
  leaves = jax.tree_util.tree_flatten_with_path(
      {"params": state.params, "model_state": state.model_state})[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
          for path, v in leaves}


def test_a_checkpoint_from_before_the_learning_rate_was_state_resumes_as_uninterrupted(
    tmp_path, capsys):
  """tests/data/pre_injection_run (written by 0aa21b6, whose optimiser state has no injected
  peak; a model with BatchNorm state): this code resumes its step-2 checkpoint to step 3 and
  ends with the parameters and model state that 0aa21b6 reached from the same checkpoint
  (``uninterrupted_step3.npz``; its ``written_by.py`` says how)."""
  written_by = registry.import_module(str(PRE_INJECTION / "written_by.py"), "written_by")
  workdir = tmp_path / "run"
  shutil.copytree(PRE_INJECTION, workdir, ignore=shutil.ignore_patterns("*.py", "*.npz"))
  config = written_by.tiny(write_idx_dataset(tmp_path / "idx", 128, 64), 3)
  summary = train.train_and_evaluate(config, str(workdir))
  assert "Resuming from the checkpoint at step 2" in capsys.readouterr().out
  assert summary["step"] == 3 and not list(workdir.glob("config.before_step_*.json"))

  setup = Setup(config)
  ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"))
  (_, at_3, _), (_, at_2, _) = (setup.restore(ckpt, steps=[s]) for s in (3, 2))
  written, _ = ckpt.restore(3, setup.abstract_state())  # Today's layout, as it was saved.
  ckpt.close()
  assert written.opt_state.hyperparams["learning_rate"] == np.float32(
      config.optimizer.learning_rate)
  expected = dict(np.load(PRE_INJECTION / "uninterrupted_step3.npz"))
  got, before = _flat(at_3), _flat(at_2)
  assert sorted(got) == sorted(expected) and any(k.startswith("model_state") for k in got)
  for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=1e-6, atol=1e-7, err_msg=key)
  # The step moved the parameters by far more than the tolerance: the check can fail.
  assert max(np.max(np.abs(expected[k] - before[k])) for k in expected) > 1e-5
