"""The one restore path's vocabulary (capsjax/training/restoring.py): how the evaluated
parameters were chosen, the same word in summary.json, evaluation.json and ensemble.json."""

import json

import pytest

from capsjax.common.errors import UsageError
from capsjax.training import restoring


def test_selected_on_names_how_the_step_was_chosen(tmp_path):
  assert restoring.selected_on(str(tmp_path), "best", 40, 100) == "validation"
  assert restoring.selected_on(str(tmp_path), "latest", 100, 100) == "final"
  assert restoring.selected_on(str(tmp_path), "60", 60, 100) == "step 60"
  assert restoring.selected_on(str(tmp_path), "latest", 60, 100) == "step 60"  # Not finished.
  # A run that stopped on an accuracy: its summary's word, at that step only.
  (tmp_path / "summary.json").write_text(json.dumps(
      {"step": 60, "selected_on": "test", "stopped_at_accuracy": True}))
  assert restoring.selected_on(str(tmp_path), "latest", 60, 100) == "test"
  assert restoring.selected_on(str(tmp_path), "40", 40, 100) == "step 40"
  # Without a budget (an unloaded setup), the summary's num_steps.
  (tmp_path / "summary.json").write_text(json.dumps(
      {"step": 100, "num_steps": 100, "selected_on": "final", "stopped_at_accuracy": False}))
  assert restoring.selected_on(str(tmp_path), "latest", 100, None) == "final"
  assert restoring.selected_on(str(tmp_path), "latest", 60, None) == "step 60"
  (tmp_path / "summary.json").write_text(json.dumps(
      {"step": 60, "selected_on": "test", "stopped_at_accuracy": True}))
  words = {restoring.selected_on(str(tmp_path), c, s, 100)
           for c, s in (("best", 1), ("latest", 100), ("latest", 60), ("7", 7))}
  assert {w if not w.startswith("step ") else "step N" for w in words} == set(
      restoring.SELECTED_ON)


def test_best_without_a_validation_split_is_refused_before_anything_loads(tmp_path):
  from configs import mnist

  config = mnist.get_config("smoke")
  config.data.validation_size = 0
  (tmp_path / "config.json").write_text(config.to_json_best_effort())
  with pytest.raises(UsageError, match="chosen on the test set"):
    restoring.load_config(str(tmp_path), "best")
  assert restoring.load_config(str(tmp_path), "latest", data_dir="/data/x").data.dir == "/data/x"
