"""workdirs: bad --workdir paths, and the lock that keeps a second run off a workdir."""

import os
import subprocess
import sys
import time

import pytest

from capsjax.common.errors import UsageError
from capsjax.runs import workdirs


def test_prepare_makes_the_directory_and_refuses_bad_paths(tmp_path):
  made = workdirs.prepare(str(tmp_path / "a" / "b"))
  assert os.path.isdir(made) and made == str(tmp_path / "a" / "b")
  (tmp_path / "file").write_text("x")
  with pytest.raises(UsageError, match="--workdir=.*file is a file, not a directory"):
    workdirs.prepare(str(tmp_path / "file"))
  with pytest.raises(UsageError, match="lies inside the file .*file"):
    workdirs.prepare(str(tmp_path / "file" / "run"))


def unwritable_path(tmp_path):
  """A path this user cannot create: inside a read-only folder or, for root (who may write
  anywhere), on sysfs, which refuses new folders."""
  if os.geteuid() != 0:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    return str(locked / "run")
  if not os.path.isdir("/sys/kernel"):
    pytest.skip("running as root without sysfs: no unwritable location")
  return "/sys/capsjax-test-run"


def test_prepare_refuses_an_unwritable_place(tmp_path):
  with pytest.raises(UsageError, match=r"Cannot create --workdir=|is not writable|Cannot write "
                                      r"the folder --workdir \(.*\): (permission denied|it is "
                                      "on a read-only)"):
    workdirs.prepare(unwritable_path(tmp_path))


HOLD = """
import sys, time
from capsjax.runs import workdirs
lock = workdirs.Lock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_lock_names_its_holder_and_dies_with_it(tmp_path):
  holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    lock = workdirs.Lock(str(tmp_path))
    assert not lock.try_acquire()
    with pytest.raises(workdirs.WorkdirBusy, match=rf"in use by another run \(host .*, pid "
                                                   rf"{holder.pid}, started "):
      lock.acquire()
  finally:
    holder.kill()  # SIGKILL: no clean-up runs, the OS drops the lock.
    holder.wait()
  deadline = time.time() + 10
  while not lock.try_acquire():  # Released at once in practice; allow a slow machine.
    assert time.time() < deadline, "the lock outlived its SIGKILLed holder"
    time.sleep(0.05)
  assert str(os.getpid()) in lock.holder()
  lock.release()
  with workdirs.Lock(str(tmp_path)):  # And again, as a context manager.
    assert not workdirs.Lock(str(tmp_path)).try_acquire()


def test_a_filesystem_without_locks_warns_and_runs_unlocked(tmp_path, monkeypatch, capsys):
  import errno

  def no_locks(handle, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(workdirs.fcntl, "flock", no_locks)
  assert workdirs.Lock(str(tmp_path)).try_acquire()
  assert f"the filesystem of {tmp_path} does not support file locks" in capsys.readouterr().err

  def broken(handle, operation):
    raise OSError(errno.EIO, "Input/output error")

  monkeypatch.setattr(workdirs.fcntl, "flock", broken)
  with pytest.raises(OSError):  # Other failures are not hidden.
    workdirs.Lock(str(tmp_path)).try_acquire()


def _failing_start(workdir):
  """A smoke run whose data folder lacks the MNIST files: it fails while loading, before its
  first step."""
  import mnist as mnist_config
  from capsjax import train

  config = mnist_config.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(workdir.parent / "no_data")
  (workdir.parent / "no_data").mkdir(exist_ok=True)
  with pytest.raises(UsageError, match="has no train-images"):
    train.train_and_evaluate(config, str(workdir))


def test_a_run_that_fails_before_its_first_step_leaves_no_workdir_behind(tmp_path):
  _failing_start(tmp_path / "new_run")
  assert not (tmp_path / "new_run").exists()  # Before: a folder holding only the lock file.
  mine = tmp_path / "existing"
  mine.mkdir()
  (mine / "notes.txt").write_text("the user's")
  _failing_start(mine)
  assert sorted(os.listdir(mine)) == ["notes.txt"]  # Only what the run made is removed.


def test_remove_failed_start_keeps_anything_worth_resuming_or_reading(tmp_path):
  def started(name, **extra):
    workdir = tmp_path / name
    (workdir / "tensorboard").mkdir(parents=True)
    (workdir / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"header")
    (workdir / "checkpoints").mkdir()
    (workdir / workdirs.LOCK_NAME).write_text("{}")
    (workdir / "config.json").write_text("{}")
    (workdir / "metrics.jsonl").write_text("")
    for path, text in extra.items():
      (workdir / path.replace("__", "/")).write_text(text)
    return workdir

  empty = started("empty")
  assert workdirs.remove_failed_start(str(empty), created=True) and not empty.exists()
  kept = started("kept_folder")
  assert workdirs.remove_failed_start(str(kept), created=False) and os.listdir(kept) == []
  for name, extra in (("logged", {"metrics.jsonl": '{"step": 2}\n'}),
                      ("saved", {"checkpoints__2": "x"}),
                      ("summarised", {"summary.json": "{}"}),
                      ("foreign_tensorboard", {"tensorboard__notes": "x"})):
    workdir = started(name, **extra)
    before = sorted(str(p) for p in workdir.rglob("*"))
    assert not workdirs.remove_failed_start(str(workdir), created=True), name
    assert sorted(str(p) for p in workdir.rglob("*")) == before, name
