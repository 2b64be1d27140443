"""``python -m capsjax.compare``: sides as runs, sweep points and sweep directories, paired by
seed, on hand-built prediction files; what it prints and writes; its errors."""

import json
import os
import re

import numpy as np
import pytest

from capsjax import compare
from capsjax.runs import cli, predictions

from test_paired import made


def write_run(workdir, seed: int, wrong: set, n: int = 40) -> str:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"seed": seed}, f)
  predictions.write(os.path.join(workdir, predictions.RUN_FILE),
                    {"test": made([i not in wrong for i in range(n)])}, step=10,
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
  assert data["combined_p"] == pytest.approx(0.5)             # Digits 1, 2: d = 2 each.
  assert data["verdict"].startswith("not separated")
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
  assert data["combined_p"] == 1.0 and all(p["only_a"] == p["only_b"] == 0 for p in data["pairs"])
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
