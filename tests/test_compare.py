"""``python -m capsjax.compare``: sides as runs, sweep points and sweep directories, paired by
seed, on hand-built prediction files; what it prints and writes; its errors."""

import json
import os
import re

import numpy as np
import pytest

from capsjax import compare
from capsjax.runs import cli, predictions
from capsjax.stats import sides

from test_paired import made


def write_run(workdir, seed: int, wrong: set, n: int = 40, ids=None, config=None,
              summary=None, source_size=None) -> str:
  """A finished run's config.json (``config`` with its seed), summary.json and test
  predictions on the examples ``ids`` (default ``range(n)``), wrong on ``wrong``."""
  os.makedirs(workdir, exist_ok=True)
  ids = np.arange(n) if ids is None else np.asarray(ids)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({**(config or {}), "seed": seed}, f)
  if summary is not None:
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f)
  predictions.write(os.path.join(workdir, predictions.RUN_FILE),
                    {"test": made([i not in wrong for i in ids], ids,
                                  source_size=source_size or len(ids))}, step=10,
                    selected_on="final", source="idx")
  return str(workdir)


@pytest.fixture
def sweeps(tmp_path):
  """Two sweeps of two settings x two seeds; capsnet's iterations=1 gets 2 more digits wrong
  per seed than iterations=3, which gets the same ones wrong as the cnn sweep."""
  for seed in (0, 1):
    write_run(tmp_path / "caps" / f"iterations=1,seed={seed}", seed, {0, 1, 2, 30 + seed})
    write_run(tmp_path / "caps" / f"iterations=3,seed={seed}", seed, {0, 30 + seed})
    write_run(tmp_path / "cnn" / f"seed={seed}", seed, {0, 30 + seed})
  write_run(tmp_path / "cnn" / "seed=2", 2, {5})
  return tmp_path


def test_sides_resolve_to_runs_by_seed(sweeps):
  caps = str(sweeps / "caps")
  assert [s for s, _ in compare.runs_of(f"{caps}:iterations=1")] == [0, 1]
  assert compare.runs_of(str(sweeps / "caps" / "iterations=3,seed=1")) == [
      (1, str(sweeps / "caps" / "iterations=3,seed=1"))]
  assert [s for s, _ in compare.runs_of(str(sweeps / "cnn"))] == [0, 1, 2]


def test_two_sweep_points_compared_paired_by_seed(sweeps, capsys):
  caps = str(sweeps / "caps")
  out = str(sweeps / "out")
  data = compare.compare_sides(f"{caps}:iterations=1", f"{caps}:iterations=3", output=out)
  assert data["seeds"] == [0, 1]
  assert [(p["only_a"], p["only_b"], p["both"]) for p in data["pairs"]] == [(2, 0, 2), (2, 0, 2)]
  assert data["pairs"][0]["p"] == pytest.approx(0.5)          # 2 of 2 discordant: 2 x 1/4.
  models = data["these_trained_models"]
  assert models["combined_p"] == pytest.approx(0.5)           # Digits 1, 2: d = 2 each.
  assert models["verdict"] == "not separated (p = 0.5)"
  setup = data["the_setup"]  # Each pair: A 4 of 40 wrong, B 2: 5 points.
  assert setup["differences"] == [0.05, 0.05] and setup["p"] == 0.5
  assert setup["verdict"].startswith("not separated (p = 0.5; 2 seed pairs cannot go below")
  assert setup["seed_pairs_needed"] == 6
  # The halves (source 40: ids < 20 and >= 20) add up per pair.
  for k in range(2):
    first, second = data["halves"]["first"][k], data["halves"]["second"][k]
    assert first["only_a"] + second["only_a"] == data["pairs"][k]["only_a"]
  assert data["halves"]["second"][0]["both"] == 1              # Digit 30 (seed 0).
  text = capsys.readouterr().out
  assert "McNemar" in text and f"Written to {out}" in text
  assert open(os.path.join(out, "comparison.md")).read() in text
  with open(os.path.join(out, "disagreements.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_seeds_of_one_side_only_are_left_out_and_said(sweeps, capsys):
  data = compare.compare_sides(str(sweeps / "caps") + ":iterations=3", str(sweeps / "cnn"))
  assert data["seeds"] == [0, 1] and data["unpaired_seeds"] == [2]
  assert data["these_trained_models"]["combined_p"] == 1.0
  assert all(p["only_a"] == p["only_b"] == 0 for p in data["pairs"])
  assert "Left out (a seed of one side only): [2]" in capsys.readouterr().out
  assert os.path.isdir(sweeps / "compare_caps_iterations=3_vs_cnn")  # The default output.


@pytest.mark.parametrize("args,message", [
    (["{caps}"], "Give two sides"),
    (["{caps}", "{cnn}"], "name one setting of the sweep \\(2 do\\).*{caps}:iterations=1;"),
    (["{caps}:iterations=2", "{cnn}"], "none does"),
    (["{caps}:iterations=1", "{tmp}/nowhere"], "is not a directory"),
    (["{caps}:iterations=1", "{cnn}", "--evaluation=validation"], "not 'validation'"),
    (["{caps}:iterations=1", "{cnn}/seed=2"], "share no seed: A has \\[0, 1\\], B \\[2\\]"),
])
def test_bad_sides_are_usage_errors(sweeps, capsys, args, message):
  paths = dict(caps=str(sweeps / "caps"), cnn=str(sweeps / "cnn"), tmp=str(sweeps))
  status = cli.invoke(compare, [a.format(**paths) for a in args])
  err = capsys.readouterr().err
  assert status == 2, err
  assert re.search(message.format(**{k: re.escape(v) for k, v in paths.items()}), err), err
  assert "Traceback" not in err


def test_a_run_without_predictions_names_what_to_run(sweeps, capsys):
  os.remove(sweeps / "cnn" / "seed=0" / predictions.RUN_FILE)
  assert cli.invoke(compare, [str(sweeps / "caps") + ":iterations=3", str(sweeps / "cnn")]) == 2
  assert "capsjax.evaluate --workdir=" in capsys.readouterr().err


def test_runs_on_other_digits_are_refused(sweeps, capsys):
  other = sweeps / "other"
  write_run(other, 0, set())
  path = str(other / predictions.RUN_FILE)
  found, meta = predictions.read(path)
  found["test"].digest = np.roll(found["test"].digest, 1)  # Another order of the same files.
  predictions.write(path, found, **{k: v for k, v in meta.items()
                                    if k not in ("format", "evaluations")})
  assert cli.invoke(compare, [str(other), str(sweeps / "cnn" / "seed=0")]) == 2
  assert "do not hold the same examples" in capsys.readouterr().err


def test_two_runs_named_directly_are_compared_whatever_their_seeds(sweeps, capsys):
  data = compare.compare_sides(str(sweeps / "caps" / "iterations=1,seed=0"),
                               str(sweeps / "cnn" / "seed=1"))
  assert data["seeds"] == ["0/1"]  # A's seed 0 against B's seed 1.
  assert [(p["only_a"], p["only_b"], p["both"]) for p in data["pairs"]] == [(3, 1, 1)]
  assert "| 0/1 | 40 | 4 | 2 | 3 | 1 | 1 |" in capsys.readouterr().out


def test_unequal_samples_are_compared_on_the_shared_examples_and_said(tmp_path, capsys):
  """A scored ids 0-39, B ids 20-79 of an 80-example test set: 20 shared, 10 in each half."""
  a = write_run(tmp_path / "a", 0, {0, 25, 26, 50}, ids=range(40), source_size=80)
  b = write_run(tmp_path / "b", 0, {25, 60}, ids=range(20, 80), source_size=80)
  data = compare.compare_sides(a, b)
  assert data["examples"] == [20] and data["own_examples"] == [[40, 60]]
  assert [(p["only_a"], p["only_b"], p["both"]) for p in data["pairs"]] == [(1, 0, 1)]
  assert [h[0]["examples"] for h in data["halves"].values()] == [20, 0]  # ids < 40; none >= 40.
  text = capsys.readouterr().out
  assert ("Examples compared: 20 per seed pair, those both runs evaluated (A's own 40, B's own "
          "60).") in text
  assert ("Warning: seed pair 0 is compared on the 20 examples both runs evaluated, of A's 40 "
          "and B's 60 (the whole test set on both sides: --config.data.test_limit=0).") in text
  assert "| ids >= 40 (0) | no shared example | no shared example |" in text
  assert "| 0 | 20 | 2 | 1 | 1 | 0 | 1 | 1 | 1 | - |" in text


def test_a_sample_against_the_whole_test_set_is_narrowed_and_said(tmp_path):
  """The smoke variant's 128 random digits against all of them: compared on the 128, warned."""
  ids = np.sort(np.random.default_rng(0).choice(1000, 128, replace=False))
  a = write_run(tmp_path / "a", 0, set(ids[:9].tolist()), ids=ids, source_size=1000)
  b = write_run(tmp_path / "b", 0, {5}, n=1000)
  data = compare.compare_sides(a, b)
  assert data["examples"] == [128] and data["own_examples"] == [[128, 1000]]
  assert data["warnings"] == ["seed pair 0 is compared on the 128 examples both runs evaluated, "
                              "of A's 128 and B's 1,000 (the whole test set on both sides: "
                              "--config.data.test_limit=0)."]
  assert [(p["only_a"], p["only_b"]) for p in data["pairs"]] == [(9, int(5 in ids))]


def test_runs_that_share_no_example_are_refused_in_one_line(tmp_path, capsys):
  a = write_run(tmp_path / "a", 0, set(), ids=range(0, 128), source_size=10_000)
  b = write_run(tmp_path / "b", 1, set(), ids=range(5000, 5256), source_size=10_000)
  assert cli.invoke(compare, [a, b]) == 2
  err = capsys.readouterr().err
  assert "the runs of seed pair 0/1 (A's 128 examples, B's 256) evaluated no example in common" \
      in err
  assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_sides_that_differ_in_model_and_sample_are_warned(tmp_path, capsys):
  """CapsNet for 300 steps on 40 digits against the CNN for 20 steps on 60, neither far from
  chance: each side as it is, the settings that differ, and three warnings."""
  def run(name, model, steps, ids, wrong):
    return write_run(tmp_path / name, 0, wrong, ids=ids, source_size=100,
                     config={"dataset": "mnist", "model": {"name": model},
                             "train": {"num_steps": steps},
                             "data": {"source": "idx", "test_limit": len(ids)}},
                     summary={"num_params": 1000 if model == "capsnet" else 5000, "step": steps,
                              "epochs": steps / 100, "chance": {"accuracy": 0.1}})
  a = run("caps", "capsnet", 300, range(40), set(range(35)))      # 5 of 40 right: 12.5%.
  b = run("cnn", "baseline_cnn", 20, range(20, 80), set(range(20, 30)))
  data = compare.compare_sides(a, b)
  differing = data["settings_differing"]
  assert {"data.test_limit: 40 -> 60", "model.name: 'capsnet' -> 'baseline_cnn'",
          "train.num_steps: 300 -> 20"} <= set(differing)
  # The rest: each model's own settings (the CapsNet's loss and capsules, the CNN's padding),
  # which the other has not.
  assert all("'(unset)'" in line for line in differing if not line.startswith(
      ("data.test_limit", "model.name", "train.num_steps"))), differing
  warned = data["warnings"]
  assert len(warned) == 3, warned
  assert warned[0].startswith("the sides differ in more than the setting compared: "
                              "data.test_limit: 40 -> 60; ")
  assert "model.name: 'capsnet' -> 'baseline_cnn'" in warned[0]
  assert warned[1].startswith("seed pair 0 is compared on the 20 examples both runs evaluated, "
                              "of A's 40 and B's 60")
  assert warned[2].startswith("A's accuracy 12.50% is within 5 points of chance (10.00%)")
  text = capsys.readouterr().out
  assert "| model | capsnet, 1,000 parameters | baseline_cnn, 5,000 parameters |" in text
  assert "| budget | 300 steps, 3 epochs | 20 steps, 0.2 epochs |" in text
  assert "| test examples evaluated, per run | 40 | 60 |" in text
  assert "| test accuracy (%) on them, mean ± std over runs | 12.50 (chance 10.00) | " \
         "83.33 (chance 10.00) |" in text


def test_one_setting_compared_is_not_warned_of(sweeps, capsys):
  for name, iterations in (("iterations=1,seed=0", 1), ("iterations=3,seed=0", 3)):
    with open(sweeps / "caps" / name / "config.json", "w") as f:
      json.dump({"seed": 0, "model": {"name": "capsnet", "routing": {"iterations": iterations}}},
                f)
  data = compare.compare_sides(str(sweeps / "caps" / "iterations=1,seed=0"),
                               str(sweeps / "caps" / "iterations=3,seed=0"))
  assert data["settings_differing"] == ["model.routing.iterations: 1 -> 3"]
  assert data["warnings"] == []
  # Two runs of no sweep (no setting named): any one setting may differ, two are warned of.
  side = sides.Side("run", [0], "capsnet", "mnist", [5], [1.0], [40], [0.9], 0.1)
  one = ["model.routing.iterations: 1 -> 3"]
  two = one + ["model.routing.leaky: False -> True"]
  assert sides.warnings(side, side, one, None, [(40, 40)], [40], [0]) == []
  assert sides.warnings(side, side, two, None, [(40, 40)], [40], [0]) == [
      "the sides differ in more than the setting compared: model.routing.iterations: 1 -> 3; "
      "model.routing.leaky: False -> True. A difference between them is not the effect of any "
      "one setting."]


def test_a_sweeps_paired_table_gives_both_verdicts_in_the_words_of_compare(tmp_path):
  """Two settings x two seeds written by hand, then the sweep's results.md: each row (A) against
  the reference (B), every column headed, the verdicts worded as capsjax.compare words them."""
  from capsjax import sweep

  points = sweep.expand({"grid": {"model.routing.iterations": [1, 3]}, "seeds": [0, 1]})
  wrong = {1: set(range(10)), 3: {0, 1}}  # Per seed, A 10 of 40 wrong, B 2: 20 points.
  for p in points:
    iterations = p.overrides["model.routing.iterations"]
    write_run(tmp_path / p.name, p.seed, wrong[iterations] | {30 + p.seed},
              config={"model": {"name": "capsnet", "routing": {"iterations": iterations}}},
              summary={"step": 5, "num_steps": 5, "test_error": 0.1, "test_accuracy": 0.9,
                       "chance": {"accuracy": 0.1}})
  sweep.collect(points, str(tmp_path), paired_reference={"model.routing.iterations": 3})
  table = (tmp_path / "results.md").read_text().split("Paired against")[1]
  header, rule, row = [line for line in table.splitlines() if line.startswith("|")]
  cells = lambda line: [c.strip() for c in line.strip("|").split("|")]
  assert all(cells(header)) and len(cells(header)) == len(cells(row)) == rule.count("---")
  found = dict(zip(cells(header), cells(row)))
  data = compare.compare_sides(f"{tmp_path}:iterations=1", f"{tmp_path}:iterations=3")
  assert found["these trained models: sign-flip over digits"] == (
      data["these_trained_models"]["verdict"]) == "B lower (p = 0.008)"  # 8 digits, d = 2: 2/256.
  assert found["the setup: sign-flip over seed pairs"] == data["the_setup"]["verdict"]
  assert found["the setup: sign-flip over seed pairs"].startswith("not separated (p = 0.5; 2 seed")
  assert found["A - B error (points) [95% interval]"].startswith("+20.00 [")
  assert found["seed pairs needed"] == ("about 6 (every seed pair gave the same difference; from "
                                        "2 seed pairs' spread, a rough estimate)")
  assert found["examples shared per seed pair (A's own, B's own)"] == "40 (40, 40)"
  assert found["warnings"] == "none" and data["warnings"] == []


def test_many_settings_that_differ_are_listed_one_per_line():
  """A CapsNet against the CNN differs in dozens of settings: one per line, sorted; a few stay
  on one line."""
  from capsjax.stats import sides

  few = ["model.routing.iterations: 3 -> 1", "loss.reconstruction_weight: 0.0005 -> 0.0"]
  assert sides.settings_text(few) == [
      "Settings that differ (A -> B; seeds and settings declared neutral left out): "
      "model.routing.iterations: 3 -> 1; loss.reconstruction_weight: 0.0005 -> 0.0."]
  many = [f"model.key{k}: {k} -> {k + 1}" for k in range(9, -1, -1)]
  text = sides.settings_text(many)
  assert text[0] == ("Settings that differ (A -> B; seeds and settings declared neutral left "
                     "out), 10:")
  assert text[2:-1] == [f"- {line}" for line in sorted(many)]


def test_a_disagreements_panel_says_why_it_shows_fewer_than_it_counts():
  """A run keeps the images of its first 256 misclassified digits: a panel whose digits were
  not among them says so, not "none" (which it says only where there are none)."""
  heading = compare.disagreement_heading
  assert heading("only A wrong", 0, 0) == "only A wrong: none"
  assert heading("only A wrong", 4, 0) == (
      "only A wrong (4; id: label: A's and B's predictions): their images were not kept (a run "
      "keeps the images of its first 256 misclassified examples)")
  assert heading("only B wrong", 10, 3).endswith(
      "; 3 shown, the others' images not kept (a run keeps the images of its first 256 "
      "misclassified examples)")
  assert heading("only B wrong", 30, compare.FIGURE_EXAMPLES).endswith("; the first 24 shown")
  assert heading("only B wrong", 5, 5) == "only B wrong (5; id: label: A's and B's predictions)"
