"""Sweeps: a 2x2 sweep on the smoke config runs, resumes, and collects."""

import csv
import json
import os
import re
import subprocess

import pytest

import mnist
from capsjax import sweep
from capsjax.common.errors import UsageError
from capsjax.config import schema
from helpers import REPO, run_in_process, sweep_command, sweep_in_process, write_idx_dataset



def write_experiment(path, body):
  path.write_text(f'BASE_CONFIG = "{REPO / "configs" / "mnist.py"}:smoke"\n\n'
                  f"def get_sweep():\n  return {body}\n")
  return path


def test_expand_grid_and_points():
  points = sweep.expand({"grid": {"model.routing.iterations": [1, 3],
                                  "loss.reconstruction_weight": [0.0, 0.0005]}, "seeds": [0, 1]})
  assert len(points) == 8 and [p.index for p in points] == list(range(8))
  assert points[0].name == "iterations=1,reconstruction_weight=0.0,seed=0"
  assert len({p.name for p in points}) == 8
  listed = sweep.expand({"points": [{"model.routing.leaky": True}], "seeds": [3]})
  assert listed[0].overrides == {"model.routing.leaky": True} and listed[0].seed == 3
  with pytest.raises(UsageError, match="exactly one"):
    sweep.expand({"seeds": [0]})
  # A misspelt key would silently run every point with seed 0.
  with pytest.raises(UsageError, match="the key 'seed', .* did you mean 'seeds'"):
    sweep.expand({"grid": {"model.routing.iterations": [1]}, "seed": [0, 1, 2]})


def test_the_ablation_file_to_copy_is_shown_as_it_is_and_can_separate_the_setups():
  """docs/sweeps.md shows experiments/iterations_ablation.py whole; its reference is one of its
  rows and it has the seed pairs the setup's verdict needs to separate at all."""
  from capsjax.stats import seed_pairs

  path = "experiments/iterations_ablation.py"
  text = (REPO / path).read_text()
  page = (REPO / "docs" / "sweeps.md").read_text()
  assert f"```python\n{text}```" in page
  experiment = sweep.load_experiment(str(REPO / path))
  points = sweep.expand(sweep.experiment_sweep(experiment, path))
  settings = {tuple(p.overrides.items()) for p in points}
  assert len(settings) == 2
  assert tuple(experiment.PAIRED_REFERENCE.items()) in settings
  seeds = {p.seed for p in points}
  assert len(seeds) >= seed_pairs.fewest_pairs() == 6
  assert re.search(r"--config\.data\.test_limit=0", page)


def test_apply_overrides_sets_values_and_rejects_unknown_keys():
  base = mnist.get_config("smoke")
  config = sweep.apply_overrides(base, {"model.routing.iterations": 5}, seed=7)
  assert config.model.routing.iterations == 5 and config.seed == 7
  assert "iterations" not in base.model.routing  # The base is not modified (left out: default).
  wrong = sweep.apply_overrides(base, {"model.routing.iteratons": 5}, seed=0)
  with pytest.raises(UsageError, match=r"config\.model\.routing\.iteratons is not a setting of "
                                       r"router 'dynamic'; did you mean "):
    schema.resolve_config(wrong)


def test_two_by_two_sweep_runs_resumes_and_collects(tmp_path, capsys, monkeypatch):
  """The command in this process (helpers.sweep_in_process); two processes on one sweep
  directory: the next test."""
  data_dir = write_idx_dataset(tmp_path / "idx", num_train=64, num_test=32)
  # 3 iterations: the smoke config's own train step, which other tests compile on 64 examples.
  experiment = write_experiment(
      tmp_path / "exp.py", '{"grid": {"model.routing.iterations": [1, 3]}, "seeds": [0, 1]}')
  workdir = tmp_path / "sweep"

  listed = sweep_in_process(capsys, experiment, workdir, "--list", data_dir=data_dir)
  assert listed.returncode == 0, listed.stderr
  assert len(listed.stdout.strip().splitlines()) == 4

  resolved = []  # The point's config is resolved once: checked before any run, then trained.
  original = schema.resolve_config
  monkeypatch.setattr(schema, "resolve_config", lambda c: resolved.append(1) or original(c))
  one = sweep_in_process(capsys, experiment, workdir, "--index=2", data_dir=data_dir)
  assert one.returncode == 0, one.stderr
  assert len(resolved) == 1
  monkeypatch.undo()
  assert os.listdir(workdir) == ["iterations=3,seed=0"]
  done_first = os.path.getmtime(workdir / "iterations=3,seed=0" / "summary.json")

  full = sweep_in_process(capsys, experiment, workdir, data_dir=data_dir)
  assert full.returncode == 0, full.stderr
  assert "iterations=3,seed=0: finished, skipped" in full.stdout
  assert os.path.getmtime(workdir / "iterations=3,seed=0" / "summary.json") == done_first

  with open(workdir / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert sorted((r["model.routing.iterations"], r["seed"]) for r in rows) == [
      ("1", "0"), ("1", "1"), ("3", "0"), ("3", "1")]
  for r in rows:  # Each row is its run's summary.
    summary = json.loads((workdir / r["run"] / "summary.json").read_text())
    assert float(r["test_accuracy"]) == summary["test_accuracy"] and r["step"] == "2"
    assert int(r["num_params"]) == summary["num_params"] > 0
    assert float(r["train_images_per_second"]) > 0 and r["chance"] == "error 90.00"
  table = (workdir / "results.md").read_text().splitlines()
  assert table[0].startswith("| model.routing.iterations | seeds | test error (%)")
  assert len(table) == 4 and all("| 2 |" in line for line in table[2:])
  assert all(" ± " in line for line in table[2:])  # Two seeds: a spread.
  assert (workdir / "test_error_vs_iterations.png").exists()

  again = sweep_in_process(capsys, experiment, workdir, data_dir=data_dir)
  assert again.returncode == 0
  assert again.stdout.count("finished, skipped") == 4


def test_bad_sweep_inputs(tmp_path, capsys):
  data_dir = write_idx_dataset(tmp_path / "idx", num_train=32, num_test=16)
  sweep_in_process = lambda experiment, *extra: run_in_process(
      capsys, "capsjax.sweep", experiment, f"--workdir={tmp_path / 'w'}",
      "--config.data.source=idx", f"--config.data.dir={data_dir}", *extra)
  experiment = write_experiment(tmp_path / "bad.py", '{"grid": {"model.nope": [1]}}')
  result = sweep_in_process(experiment)
  assert result.returncode == 2 and "config.model.nope is not a setting of model 'capsnet'" in result.stderr
  good = write_experiment(tmp_path / "good.py", '{"grid": {"seed": [1]}}')
  result = sweep_in_process(good, "--index=5")
  assert result.returncode == 2 and "out of range" in result.stderr
  result = sweep_in_process(tmp_path / "missing.py")
  assert result.returncode == 2 and "not found" in result.stderr
  assert not (tmp_path / "w").exists()
  assert "Traceback" not in result.stderr


def test_a_point_may_bring_its_own_config_file_with_the_command_line_overrides():
  points = sweep.expand({"points": [{"config": "configs/mnist_baseline.py:smoke",
                                     "train.num_steps": 3},
                                    {"train.num_steps": 3}], "seeds": [2]})
  assert points[0].name == "config=mnist_baseline_smoke,num_steps=3,seed=2"
  base = mnist.get_config("smoke")
  command_line = {"data.test_limit": 7}
  base.data.test_limit = 7  # absl applied the command line to the base config already.
  own = sweep.point_config(base, points[0], command_line)
  assert own.model.name == "baseline_cnn" and own.data.test_limit == 7
  assert own.train.num_steps == 3 and own.seed == 2
  assert sweep.point_config(base, points[1], command_line).model.name == "capsnet"
  with pytest.raises(UsageError, match="does not fit configs/mnist_baseline.py:smoke"):
    sweep.point_config(base, points[0], {"model.routing.iterations": 1})
  missing = sweep.expand({"points": [{"config": "configs/nope.py"}]})[0]
  with pytest.raises(UsageError, match="'configs/nope.py' .* not found"):
    sweep.point_config(base, missing, {})


def test_two_workers_on_one_sweep_directory_run_every_point_once(tmp_path):
  data_dir = write_idx_dataset(tmp_path / "idx", num_train=64, num_test=32)
  # Two points: both workers start at the first, one holds it, the other passes to the second.
  experiment = write_experiment(tmp_path / "exp.py", '{"points": [{}], "seeds": [0, 1]}')
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1")
  workers = [subprocess.Popen(
      sweep_command(experiment, tmp_path / "sweep", data_dir=data_dir),
      env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for _ in range(2)]
  outputs = [w.communicate(timeout=600)[0] for w in workers]
  assert [w.returncode for w in workers] == [0, 0], "\n".join(outputs)
  lines = [line.rstrip() for o in outputs for line in o.splitlines()]
  for name in (f"seed={seed}" for seed in range(2)):
    tried = sum(line.endswith(f"] {name}") for line in lines)
    held = sum(f"] {name}: held by another worker" in line for line in lines)
    done = sum(line.endswith(f"] {name}: finished, skipped.") for line in lines)
    # Finished by the other between this worker's look and its hold (the next test).
    meanwhile = sum(line.endswith(f"] {name}: finished by another worker, skipped.")
                    for line in lines)
    passed = held + done + meanwhile
    assert (tried - held - meanwhile, passed) == (1, 1), (name, outputs)  # One ran it.
    assert sweep.is_finished(str(tmp_path / "sweep" / name))
  assert not any("Resuming" in line for line in lines)  # Nobody ran a point a second time.


def test_a_point_finished_between_the_look_and_the_hold_is_not_trained_again(
    tmp_path, capsys, monkeypatch):
  """The race of two workers whose runs end together (seen once in the test above): one
  looks at a point (unfinished), the other finishes it and lets go, the first holds it. Here
  the look is made to see it unfinished; the hold then finds it finished."""
  data_dir = write_idx_dataset(tmp_path / "idx", num_train=64, num_test=32)
  experiment = write_experiment(tmp_path / "exp.py", '{"points": [{}], "seeds": [0]}')
  first = sweep_in_process(capsys, experiment, tmp_path / "sweep", data_dir=data_dir)
  assert first.returncode == 0, first.stderr
  summary = tmp_path / "sweep" / "seed=0" / "summary.json"
  written = summary.read_text()
  monkeypatch.setattr(sweep, "is_finished", lambda workdir: False)  # The look.
  again = sweep_in_process(capsys, experiment, tmp_path / "sweep", data_dir=data_dir)
  assert again.returncode == 0, again.stderr
  assert "[1/1] seed=0: finished by another worker, skipped." in again.stdout.splitlines()
  assert "Resuming" not in again.stdout and summary.read_text() == written


def test_results_table_gives_validation_and_the_chance_level_of_each_accuracy(tmp_path):
  """Collected from summaries written by hand: a two-label run and a one-label run."""
  import json

  points = sweep.expand({"points": [{"model.routing.iterations": 1},
                                    {"model.routing.iterations": 3}], "seeds": [0]})
  two_labels = {"step": 5, "num_steps": 5, "test_accuracy": 0.3, "test_error": 0.7,
                "test_loss": 0.5, "chance": {"accuracy": 1 / 45, "at_least_one": 17 / 45},
                "evaluations": {"test": {"accuracy": 0.3, "at_least_one": 0.9},
                                "validation": {"accuracy": 0.32, "at_least_one": 0.91}}}
  one_label = {"step": 5, "num_steps": 5, "test_accuracy": 0.96, "test_error": 0.04,
               "selected_on": "validation", "stopped_at_accuracy": True,
               "test_loss": 0.1, "chance": {"accuracy": 0.1},
               "evaluations": {"test": {"accuracy": 0.96}, "validation": {"accuracy": 0.95}}}
  for point, summary in zip(points, (two_labels, one_label)):
    (tmp_path / point.name).mkdir()
    (tmp_path / point.name / "summary.json").write_text(json.dumps(summary))
  sweep.collect(points, str(tmp_path))
  header, _, first, second = (tmp_path / "results.md").read_text().splitlines()
  cells = lambda line: [c.strip() for c in line.strip("|").split("|")]
  columns = cells(header)
  assert columns[:5] == ["model.routing.iterations", "seeds", "test error (%)", "chance (%)",
                         "selected on"]
  row = dict(zip(columns, cells(first)))
  assert row["chance (%)"] == "error 97.78, at least one 37.78" and row["selected on"] == "final"
  # One seed: the mean alone (a "± 0.00" would read as a measured spread).
  assert row["seeds"] == "1" and row["test error (%)"] == "70.00"
  assert row["validation accuracy (%)"] == "32.00" and row["test loss"] == "0.5000"
  assert row["test at least one (%)"].startswith("90.00")
  assert row["validation at least one (%)"].startswith("91.00")
  row = dict(zip(columns, cells(second)))
  assert row["chance (%)"] == "error 90.00" and row["validation accuracy (%)"].startswith("95.00")
  assert row["selected on"] == "validation"
  with open(tmp_path / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert rows[0]["validation_accuracy"] == "0.32" and rows[1]["chance"] == "error 90.00"


def test_results_show_the_value_each_run_used_and_mark_settings_that_do_not_apply(tmp_path):
  """A router sweep: the default dynamic point reads its 3 iterations from its config.json
  (the router's default, resolved); uniform has no iterations and reads "–"."""
  points = sweep.expand({"points": [{"model.routing.name": "dynamic"},
                                    {"model.routing.name": "uniform"},
                                    {"model.routing.name": "dynamic",
                                     "model.routing.iterations": 1}], "seeds": [0]})
  for point, error in zip(points, (0.01, 0.02, 0.03)):
    run = tmp_path / point.name
    run.mkdir()
    routing = {"name": point.overrides["model.routing.name"],
               "iterations": point.overrides.get("model.routing.iterations")}
    (run / "config.json").write_text(json.dumps({"model": {"routing": routing}}))
    (run / "summary.json").write_text(json.dumps(
        {"step": 5, "num_steps": 5, "test_accuracy": 1 - error, "test_error": error,
         "test_loss": 0.1, "chance": {"accuracy": 0.1}}))
  sweep.collect(points, str(tmp_path))
  lines = (tmp_path / "results.md").read_text().splitlines()
  cells = lambda line: [c.strip() for c in line.strip("|").split("|")]
  assert [cells(line)[:2] for line in lines[2:5]] == [["dynamic", "3"], ["uniform", "–"],
                                                      ["dynamic", "1"]]
  assert any(line.startswith("–: the setting does not apply") for line in lines[5:])
  with open(tmp_path / "results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["model.routing.iterations"] for r in rows] == ["3", "", "1"]
  for key in ("name", "iterations"):
    assert (tmp_path / f"test_error_vs_{key}.png").stat().st_size > 0
