"""Run output: metrics.jsonl and TensorBoard hold only finite values, progress lines read
line by line in a log file, and a short run's training curves show their points."""

import io
import json

import numpy as np
import pytest

from capsjax.common import figures
from capsjax.runs import reporting


def test_a_nonfinite_metric_is_left_out_of_tensorboard_and_null_in_the_log(tmp_path, capfd):
  """A resumed run's first log has no timed step yet (images/s unknown): before, tensorboardX
  printed 'NaN or Inf found in input tensor' for it."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  writer = reporting.MetricWriter(str(tmp_path))
  writer.write("train", 3, {"loss": 0.5, "images_per_second": float("nan"),
                            "learning_rate": 1e-3})
  writer.close()
  out = capfd.readouterr()
  assert "NaN" not in out.out + out.err
  record = json.loads((tmp_path / "metrics.jsonl").read_text())
  assert record["loss"] == 0.5 and record["images_per_second"] is None
  events = EventAccumulator(str(tmp_path / "tensorboard"))
  events.Reload()
  assert sorted(events.Tags()["scalars"]) == ["train/learning_rate", "train/loss"]


def test_progress_is_one_line_per_update_in_a_log_file():
  log = io.StringIO()  # Not a terminal.
  for n in (1, 2, 3):
    reporting.count_progress("shifted_test: shift", n, 3, stream=log)
  assert log.getvalue().splitlines() == [f"shifted_test: shift {n}/3" for n in (1, 2, 3)]
  bar = reporting.ProgressBar(10, stream=log)
  bar.update(2, 0.5, 0.25, float("nan"), float("nan"))
  assert log.getvalue().splitlines()[-1] == (
      "step 2/10 [####----------------]  20% | loss 0.5000 | acc 25.0% | ? img/s | ETA ?")


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_redraws_in_place_on_a_terminal():
  term = _Terminal()
  for n in (1, 2):
    reporting.count_progress("shift", n, 2, stream=term)
  assert term.getvalue() == "\rshift 1/2\rshift 2/2\n"


@pytest.mark.parametrize("num_train", [1, 60])
def test_training_curves_show_a_short_runs_train_points(num_train):
  records = [{"kind": "train", "step": s, "loss": 1.0 / s, "accuracy": 0.5}
             for s in range(1, num_train + 1)]
  records.append({"kind": "test", "step": num_train, "loss": 0.4, "accuracy": 0.6})
  fig = figures.training_curves(records)
  for ax in fig.axes:
    train, test = ax.get_lines()
    assert train.get_label() == "train" and len(train.get_xdata()) == num_train
    # A one-point line is invisible without a marker; a long one is clearer without.
    assert (train.get_marker() not in ("None", None, "")) == (num_train < 50)
    assert test.get_marker() == "s"
  np.testing.assert_allclose(fig.axes[1].get_lines()[0].get_ydata(), 50.0)


def test_the_writer_does_not_import_torch_and_leaves_it_importable(tmp_path):
  """tensorboardX imports PyTorch where it is installed (2 s of every run's start); the writer
  keeps it out and leaves ``import torch`` working. In a fresh interpreter, as a run starts."""
  import subprocess
  import sys

  code = f"""
import importlib.util, json, sys
from capsjax.runs import reporting
writer = reporting.MetricWriter({str(tmp_path)!r})
writer.write("train", 1, {{"loss": 0.5}})
imported = "torch" in sys.modules
print(json.dumps([imported, importlib.util.find_spec("torch") is not None]))
"""
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr
  imported, installed = json.loads(result.stdout.strip().splitlines()[-1])
  assert not imported
  assert (tmp_path / "tensorboard").is_dir()
  assert json.loads((tmp_path / "metrics.jsonl").read_text())["loss"] == 0.5
  if installed:  # Still importable after the writer: nothing was left blocked.
    check = subprocess.run([sys.executable, "-c", code.replace(
        "print(json.dumps", "import torch\nprint(json.dumps")], capture_output=True, text=True,
        timeout=120)
    assert check.returncode == 0, check.stderr
