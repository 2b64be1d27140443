"""Every write of a run failed by a full disk (ENOSPC) or a read-only filesystem (EROFS),
injected where that file is written: the command ends in one line naming what it was writing
and where (exit 2, no traceback), and the same command afterwards resumes without training
again what was saved. A workdir no file can be written to is refused before anything is
loaded or compiled; ``capsjax.evaluate`` of one writes into ``--output`` or refuses naming it.

Each case resumes a copy of one smoke run saved at step 4 (``saved_run``) to step 12: the
periodic checkpoint of step 8, the final one of step 12, a signal's at step 6, then the metrics
log, TensorBoard events and the config history during training, and the predictions, summary
and figures at the end. (A full disk on a real small filesystem, by hand: the note of issue 79.)
"""

import builtins
import errno
import json
import logging
import os
import pathlib
import re
import shutil
import threading
import time

import pytest

import mnist
from capsjax import train
from capsjax.common import files
from capsjax.runs import preemption, reporting
from helpers import main_in_process, run_in_process

STEPS = 12  # Resumed from SAVED; checkpoints every 4 steps, logs every 2.
SAVED = 4


def smoke(idx_dir, steps):
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.train.num_steps = steps
  config.eval.figures = False
  return config


@pytest.fixture(scope="module")
def saved_run(idx_dir, tmp_path_factory):
  """A smoke run saved at step 4 (checkpoint, config, metrics, summary); tests copy it."""
  workdir = tmp_path_factory.mktemp("saved") / "run"
  train.train_and_evaluate(smoke(idx_dir, SAVED), str(workdir))
  return workdir


def os_error(code: int, path: str) -> OSError:
  return OSError(code, os.strerror(code), path)


# --- Where each write is failed -------------------------------------------------------

def fail_file(monkeypatch, module, name: str, code: int) -> None:
  """``open`` of ``module`` (files: every atomic write) raises ``code`` for a file whose name
  holds ``name``, opened to write."""
  real = builtins.open

  def opened(path, mode="r", *args, **kwargs):
    if name in os.path.basename(os.fspath(path)) and any(m in mode for m in "wax"):
      raise os_error(code, os.fspath(path))
    return real(path, mode, *args, **kwargs)

  monkeypatch.setattr(module, "open", opened, raising=False)


class _FullAt:
  """A file whose write of a line holding ``words`` fails (the disk filled up then)."""

  def __init__(self, f, words: str, code: int):
    self._f, self._words, self._code = f, words, code

  def write(self, text):
    if self._words in text:
      raise os_error(self._code, self._f.name)
    return self._f.write(text)

  def __getattr__(self, name):
    return getattr(self._f, name)


def fail_metrics_log(monkeypatch, code: int, step: int = 8) -> None:
  """metrics.jsonl's record of ``step`` fails to write."""
  real = builtins.open

  def opened(path, mode="r", *args, **kwargs):
    f = real(path, mode, *args, **kwargs)
    return _FullAt(f, f'"step": {step},', code) if "a" in mode else f

  monkeypatch.setattr(reporting, "open", opened, raising=False)


def fail_tensorboard(monkeypatch, code: int, step: int = 8) -> None:
  """TensorBoard's first event of ``step`` fails to write."""
  from tensorboardX import event_file_writer

  real = event_file_writer.EventsWriter.write_event

  def write_event(self, event):
    if event.step == step:
      raise os_error(code, self._file_name)
    return real(self, event)

  monkeypatch.setattr(event_file_writer.EventsWriter, "write_event", write_event)


def fail_checkpoint(monkeypatch, code: int, step: int) -> None:
  """Checkpoint ``step`` fails in Orbax's background writer (its JSON item), as a full disk
  fails it: raised at the next save or wait."""
  from orbax.checkpoint._src.handlers import json_checkpoint_handler as handler

  real = handler.JsonCheckpointHandler._save_fn

  async def save_fn(self, x, directory):
    if f"/{step}.orbax-checkpoint-tmp" in str(directory):
      raise os_error(code, str(directory / "metadata"))
    return await real(self, x, directory)

  monkeypatch.setattr(handler.JsonCheckpointHandler, "_save_fn", save_fn)


def signal_at(monkeypatch, step: int) -> None:
  """A SIGTERM arrives once the run reaches ``step``."""
  real = preemption.StopRequest.due

  def due(self, reached):
    if reached >= step and self.signal_name is None:
      self.signal_name = "SIGTERM"
    return real(self, reached)

  monkeypatch.setattr(preemption.StopRequest, "due", due)


def fail_signal_checkpoint(monkeypatch, code: int) -> None:
  signal_at(monkeypatch, 6)
  fail_checkpoint(monkeypatch, code, 6)


# name: (inject(monkeypatch, errno), what the message names, the file or folder it names,
#        the step the rerun resumes from)
WRITES = {
    "periodic checkpoint": (lambda m, c: fail_checkpoint(m, c, 8), "the step-8 checkpoint",
                            "checkpoints/8", SAVED),
    "final checkpoint": (lambda m, c: fail_checkpoint(m, c, STEPS),
                         f"the step-{STEPS} checkpoint", f"checkpoints/{STEPS}", 8),
    "checkpoint at a signal": (fail_signal_checkpoint, "the step-6 checkpoint",
                               "checkpoints/6", SAVED),
    "metrics log": (fail_metrics_log, "the metrics log", "metrics.jsonl", SAVED),
    "TensorBoard events": (fail_tensorboard, "TensorBoard events", "tensorboard", SAVED),
    "config history": (lambda m, c: fail_file(m, files, "config.json", c),
                       "the config history (the run's config)", "config.json", SAVED),
    "predictions": (lambda m, c: fail_file(m, files, "predictions.npz", c),
                    "the run's predictions", "predictions.npz", STEPS),
    "summary": (lambda m, c: fail_file(m, files, "summary.json", c), "the run's summary",
                "summary.json", STEPS),
    "figures": (lambda m, c: fail_file(m, files, "training_curves.png", c),
                "figure training_curves.png", "training_curves.png", STEPS),
}


def one_line_error(result) -> str:
  """The command's error: its one line (no traceback, nothing logged after it)."""
  assert result.returncode == 2, result.stderr
  assert "Traceback" not in result.stderr and "ERROR:absl" not in result.stderr
  lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and result.stderr.rstrip().endswith(lines[0]), result.stderr
  return lines[0]


def resume(capsys, saved_run, idx_dir, tmp_path, write: str, code: int):
  """The saved run resumed to STEPS with ``write`` failed by ``code``: ``(workdir, its
  error line)``."""
  workdir = tmp_path / "run"
  shutil.copytree(saved_run, workdir)
  before = set(threading.enumerate())
  with pytest.MonkeyPatch.context() as patch:
    WRITES[write][0](patch, code)
    result = main_in_process(capsys, workdir, f"--config.train.num_steps={STEPS}",
                             f"--config.eval.figures={write == 'figures'}", data_dir=idx_dir)
    settle(before)
  return workdir, one_line_error(result)


def settle(before: set, timeout: float = 30) -> None:
  """Waits for the threads started since ``before`` (Orbax's writers of a failed save's
  other items, which go on after the first failed): a process's end ends them, but a rerun
  in this process would otherwise clear their folder while they write into it."""
  deadline = time.monotonic() + timeout
  for thread in set(threading.enumerate()) - before:
    thread.join(max(0.0, deadline - time.monotonic()))


CASES = [pytest.param(w, marks=pytest.mark.figures) if w == "figures" else w for w in WRITES]


@pytest.mark.parametrize("write", CASES)
def test_a_full_disk_is_named_and_the_rerun_resumes(write, saved_run, idx_dir, tmp_path,
                                                    capsys, caplog):
  workdir, line = resume(capsys, saved_run, idx_dir, tmp_path, write, errno.ENOSPC)
  # Orbax logs a failed save's error with a traceback from each of its threads: dropped.
  assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
  _, what, where, resumed = WRITES[write]
  assert f"The disk is full: writing {what} ({workdir / where}" in line, line
  assert " free of " in line and "Free space there" in line and "rerun the same command" in line
  assert not list(workdir.rglob("*.tmp"))  # No atomic write left its temporary file.
  rerun = main_in_process(capsys, workdir, f"--config.train.num_steps={STEPS}",
                          data_dir=idx_dir)
  assert rerun.returncode == 0, rerun.stderr
  assert f"Resuming from the checkpoint at step {resumed} " in rerun.stdout
  steps = [r["step"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text()
                                  .splitlines()) if r["kind"] == "train"]
  assert steps == list(range(2, STEPS + 1, 2))  # Each step logged once: none trained twice.
  assert json.loads((workdir / "summary.json").read_text())["step"] == STEPS
  assert not list(workdir.rglob("*orbax-checkpoint-tmp*"))  # A failed save's, removed.
  if resumed == STEPS:  # Only its end written again: no step trained.
    assert not re.search(rf"step \d+/{STEPS}", rerun.stderr), rerun.stderr


@pytest.mark.parametrize("write", CASES)
def test_a_read_only_file_is_named(write, saved_run, idx_dir, tmp_path, capsys):
  workdir, line = resume(capsys, saved_run, idx_dir, tmp_path, write, errno.EROFS)
  _, what, where, _ = WRITES[write]
  assert line.startswith(f"error: Cannot write {what} ({workdir / where}"), line
  assert line.endswith("it is on a read-only filesystem; choose a --workdir you can write "
                       "to.")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_sweeps_results_are_named(code, saved_run, tmp_path, capsys):
  """The results of a sweep whose one point is the saved run, collected (``--collect``)."""
  from capsjax.runs import cli
  from capsjax.sweep import Point
  from capsjax.training import sweep_results

  shutil.copytree(saved_run, tmp_path / "p0")
  point = Point(0, {"optimizer.learning_rate": 0.001}, 0, "p0")
  with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as stopped:
    fail_file(patch, files, "results.csv", code)
    with cli.clear_errors():
      sweep_results.collect([point], str(tmp_path))
  line = capsys.readouterr().err.strip()
  assert stopped.value.code == 2 and "\n" not in line
  assert (f"writing the sweep's results ({tmp_path / 'results.csv'})" in line
          if code == errno.ENOSPC else
          line.startswith(f"error: Cannot write the sweep's results ({tmp_path / 'results.csv'})"))
  sweep_results.collect([point], str(tmp_path))  # Space again: written.
  assert "p0" in (tmp_path / "results.csv").read_text()


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "The disk is full: writing /x/out.md "
                                          "failed; "),
                                         (errno.EROFS, "Cannot write /x/out.md: it is on a "
                                          "read-only filesystem; ")])
def test_a_write_not_named_where_it_failed_is_still_one_line(code, words, capsys):
  """The command lines' net for a write no caller named (its path from the error); a
  permission error is not taken for a write there (a read's may be one)."""
  from capsjax.runs import cli

  with pytest.raises(SystemExit) as stopped, cli.clear_errors():
    raise RuntimeError("a library's own error") from os_error(code, "/x/out.md")
  assert stopped.value.code == 2 and capsys.readouterr().err.startswith(f"error: {words}")
  with pytest.raises(RuntimeError), cli.clear_errors():
    raise RuntimeError("a library's own error") from os_error(errno.EACCES, "/x/in.md")


# --- A workdir that cannot be written to ------------------------------------------------

def read_only(patch, folder) -> None:
  """Writing, creating, renaming or removing anything under ``folder`` fails as on a
  read-only mount (EROFS); reading works."""
  real_open, real_mkdir, real_replace, real_remove = (builtins.open, os.mkdir, os.replace,
                                                      os.remove)
  inside = lambda path: os.path.abspath(os.fspath(path)).startswith(str(folder) + os.sep) or (
      os.path.abspath(os.fspath(path)) == str(folder))

  def opened(path, mode="r", *args, **kwargs):
    if isinstance(path, (str, os.PathLike)) and inside(path) and any(m in mode for m in "wax+"):
      raise os_error(errno.EROFS, os.fspath(path))
    return real_open(path, mode, *args, **kwargs)

  def refused(real):
    def call(path, *args, **kwargs):
      if inside(path):
        raise os_error(errno.EROFS, os.fspath(path))
      return real(path, *args, **kwargs)
    return call

  patch.setattr(builtins, "open", opened)
  patch.setattr(os, "mkdir", refused(real_mkdir))
  patch.setattr(os, "replace", refused(real_replace))
  patch.setattr(os, "remove", refused(real_remove))


def never_set_up(patch) -> None:
  """Loading data or compiling fails the test: a refusal must come before."""
  from capsjax.training import setup

  def refused(*args, **kwargs):
    raise AssertionError("the run was set up (data loaded, programs built) before refusing")

  patch.setattr(setup.Setup, "__init__", refused)


def listing(folder) -> dict:
  return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_training_refuses_a_read_only_workdir_before_loading_anything(idx_dir, tmp_path,
                                                                      capsys):
  workdir = tmp_path / "mount" / "run"
  workdir.mkdir(parents=True)
  with pytest.MonkeyPatch.context() as patch:
    read_only(patch, tmp_path / "mount")
    never_set_up(patch)
    result = main_in_process(capsys, workdir, data_dir=idx_dir)
  assert one_line_error(result) == (
      f"error: Cannot write a file in --workdir ({workdir}): it is on a read-only filesystem; "
      "choose a --workdir you can write to.")
  assert os.listdir(workdir) == []


@pytest.mark.parametrize("where", ["inside_a_file", "proc"])
def test_a_workdir_that_cannot_be_created_is_refused_in_one_line(where, idx_dir, tmp_path,
                                                                 capsys):
  """A folder the filesystem will not make is refused in one line before anything loads: one
  inside a file, or one procfs will not hold (it answers ENOENT), named where it stopped."""
  (tmp_path / "a_file").write_text("")
  if where == "proc" and not os.path.isdir("/proc/self"):
    pytest.skip("no procfs here")
  workdir = (tmp_path / "a_file" / "sub" / "run" if where == "inside_a_file"
             else pathlib.Path("/proc/capsjax-test-probe/run"))
  with pytest.MonkeyPatch.context() as patch:
    never_set_up(patch)
    result = main_in_process(capsys, workdir, data_dir=idx_dir)
  assert one_line_error(result) == {
      "inside_a_file": f"error: --workdir={workdir} lies inside the file {tmp_path / 'a_file'}; "
                       "choose another path.",
      "proc": f"error: Cannot create --workdir={workdir}: No such file or directory "
              "(/proc/capsjax-test-probe); choose a --workdir you can write to."}[where]
  assert (tmp_path / "a_file").read_text() == ""


def test_evaluate_writes_a_read_only_run_into_output_or_refuses(saved_run, tmp_path, capsys):
  workdir = tmp_path / "mount" / "run"
  shutil.copytree(saved_run, workdir)
  before = listing(workdir)
  with pytest.MonkeyPatch.context() as patch:
    read_only(patch, tmp_path / "mount")
    never_set_up(patch)
    refused = run_in_process(capsys, "capsjax.evaluate", f"--workdir={workdir}")
  assert one_line_error(refused) == (
      f"error: Cannot write a file in --workdir ({workdir}): it is on a read-only filesystem; "
      "give --output=DIR, a folder for the evaluation's files (the run's own are then only "
      "read).")
  output = tmp_path / "evaluated"
  with pytest.MonkeyPatch.context() as patch:
    read_only(patch, tmp_path / "mount")
    result = run_in_process(capsys, "capsjax.evaluate", f"--workdir={workdir}",
                            f"--output={output}")
  assert result.returncode == 0, result.stderr
  assert f"evaluation.json and figures in {output}." in result.stdout
  assert json.loads((output / "evaluation.json").read_text())["checkpoint_step"] == SAVED
  assert (output / "evaluation_predictions.npz").is_file()
  assert listing(workdir) == before  # Only read.
