"""Files a run reads or writes, damaged, missing or on a full disk: a clear error naming the file
and what to do (exit 2, no traceback), and nothing already saved is lost."""

import errno
import json
import os
import pathlib

import pytest

import mnist
from capsjax import train
from capsjax.common import files
from capsjax.runs import checkpointing, cli, reporting
from helpers import checkpoint_steps, main_in_process, read_summary, run_in_process

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


def enospc(*args, **kwargs):
  raise OSError(errno.ENOSPC, "No space left on device")


def test_a_damaged_config_json_is_named_on_a_rerun(idx_dir, tmp_path, capsys):
  train.train_and_evaluate(smoke(idx_dir), str(tmp_path))
  (tmp_path / "config.json").write_text('{"seed": 0, "model": {')  # Cut short.
  status, err = exit_of(lambda: train.train_and_evaluate(smoke(idx_dir, 8), str(tmp_path)),
                        capsys)
  assert status == 2 and f"{tmp_path / 'config.json'} is damaged" in err
  assert "move it away" in err and "Traceback" not in err
  assert checkpoint_steps(tmp_path) == [4]                # Nothing saved was touched.


@pytest.mark.figures
def test_a_full_disk_while_drawing_figures_keeps_the_summary(idx_dir, tmp_path, capsys,
                                                             monkeypatch):
  import matplotlib.figure

  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", enospc)
  status, err = exit_of(lambda: train.train_and_evaluate(smoke(idx_dir), str(tmp_path)), capsys)
  assert status == 2 and "The disk is full while writing" in err and ".png" in err
  assert "free some space" in err and "Traceback" not in err
  assert read_summary(tmp_path)["step"] == 4               # Written before the figures.
  assert not list(tmp_path.glob("*.tmp"))                 # No half-written files left.


def test_a_full_disk_while_checkpointing_keeps_the_earlier_checkpoint(idx_dir, tmp_path, capsys,
                                                                      monkeypatch):
  save = checkpointing.Checkpointer.save

  def fill_at_8(self, step, *args, **kwargs):
    if step == 8:
      enospc()
    return save(self, step, *args, **kwargs)

  monkeypatch.setattr(checkpointing.Checkpointer, "save", fill_at_8)
  status, err = exit_of(lambda: train.train_and_evaluate(smoke(idx_dir, 8), str(tmp_path)),
                        capsys)
  assert status == 2 and "The disk is full" in err and "rerun the same command" in err
  monkeypatch.undo()
  summary = train.train_and_evaluate(smoke(idx_dir, 8), str(tmp_path))  # Space again.
  assert "Resuming from the checkpoint at step 4" in capsys.readouterr().out
  assert summary["step"] == 8


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


def test_atomic_writes_leave_the_earlier_file_whole(tmp_path):
  path = str(tmp_path / "summary.json")
  files.write_json(path, {"a": 1})
  with pytest.raises(files.DiskFull, match="while writing .*summary.json"):
    with files.atomic_write(path) as f:
      f.write('{"a": ')
      enospc()
  assert json.loads(open(path).read()) == {"a": 1} and os.listdir(tmp_path) == ["summary.json"]
  with pytest.raises(ValueError):
    with files.atomic_write(path) as f:
      f.write("half")
      raise ValueError("a crash mid-write")
  assert json.loads(open(path).read()) == {"a": 1}
  assert files.is_disk_full(RuntimeError("wrapped")) is False
  try:
    try:
      enospc()
    except OSError as e:
      raise RuntimeError("Orbax: save failed") from e
  except RuntimeError as e:
    assert files.is_disk_full(e)
