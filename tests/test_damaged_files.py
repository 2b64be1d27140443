"""Files a run reads, damaged or missing: a clear error naming the file and what to do (exit 2,
no traceback), and nothing already saved is lost. (A write that fails, at each of a run's
writes: test_failed_writes.py.)"""

import json
import pathlib

import pytest

import mnist
from capsjax import train
from capsjax.runs import cli, reporting
from helpers import checkpoint_steps, main_in_process, run_in_process

REPO = pathlib.Path(__file__).resolve().parents[1]


def smoke(idx_dir, steps=4):
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.train.num_steps = steps
  return config


def exit_of(fn, capsys) -> tuple[int, str]:
  """What a command line does with ``fn``'s error: its exit status and stderr."""
  with pytest.raises(SystemExit) as stopped:
    with cli.clear_errors():
      fn()
  return stopped.value.code, capsys.readouterr().err


def test_a_damaged_config_json_is_named_on_a_rerun(idx_dir, tmp_path, capsys):
  train.train_and_evaluate(smoke(idx_dir), str(tmp_path))
  (tmp_path / "config.json").write_text('{"seed": 0, "model": {')  # Cut short.
  status, err = exit_of(lambda: train.train_and_evaluate(smoke(idx_dir, 8), str(tmp_path)),
                        capsys)
  assert status == 2 and f"{tmp_path / 'config.json'} is damaged" in err
  assert "move it away" in err and "Traceback" not in err
  assert checkpoint_steps(tmp_path) == [4]                # Nothing saved was touched.


def test_a_rerun_with_another_models_shapes_names_the_settings(idx_dir, tmp_path, capsys):
  # The command in this process (helpers.main_in_process): its exit status and message.
  first = main_in_process(capsys, tmp_path, "--config.train.num_steps=4", data_dir=idx_dir)
  assert first.returncode == 0, first.stderr
  other = main_in_process(capsys, tmp_path, "--config.model.conv1.features=8",
                          data_dir=idx_dir)
  assert other.returncode == 2, other.stderr
  assert "holds a run of another model" in other.stderr
  assert "model.conv1.features: 16 -> 8" in other.stderr and "new --workdir" in other.stderr
  assert "Traceback" not in other.stderr and "strict=False" not in other.stderr
  assert checkpoint_steps(tmp_path) == [4]                # Nothing moved aside.


def test_evaluate_on_a_config_json_that_no_longer_fits_its_checkpoints(idx_dir, tmp_path,
                                                                       capsys):
  """config.json edited after the run (a model size): one line naming an array, its shapes in
  the checkpoint and here, and what to do; nothing restored, moved or written."""
  train.train_and_evaluate(smoke(idx_dir), str(tmp_path))
  config = json.loads((tmp_path / "config.json").read_text())
  config["model"]["class_capsules"]["dim"] = 20
  (tmp_path / "config.json").write_text(json.dumps(config))
  before = sorted(str(p) for p in tmp_path.rglob("*"))
  result = run_in_process(capsys, "capsjax.evaluate", f"--workdir={tmp_path}")
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith(f"error: The checkpoints in {tmp_path / 'checkpoints'} do not fit "
                             "this config's model: params.class_capsules.weights has shape ")
  assert ", 8, " in lines[0] and ", 20, " in lines[0] and "config.json edited" in lines[0]
  assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_an_experiment_file_that_does_not_import(tmp_path, capsys):
  bad = tmp_path / "bad.py"
  bad.write_text('BASE_CONFIG = "configs/mnist.py"\n\ndef get_sweep(:\n  return {}\n')
  result = run_in_process(capsys, "capsjax.sweep", bad, f"--workdir={tmp_path / 'sweep'}")
  assert result.returncode == 2 and "bad.py could not be imported (line 3)" in result.stderr
  assert "SyntaxError" in result.stderr and "Traceback" not in result.stderr


def test_a_damaged_summary_counts_as_unfinished(tmp_path, capsys):
  (tmp_path / "summary.json").write_text('{"step": 8, "num_st')
  assert not reporting.is_finished(str(tmp_path))
  assert "cannot be read" in capsys.readouterr().out
