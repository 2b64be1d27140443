"""The run's directory: checked before use, and held by one run at a time.

:func:`prepare` turns a bad ``--workdir`` (a file, inside a file, not writable) into a clear
UsageError; :func:`check_writable` refuses one that no file can be written to. :class:`Lock` is
an exclusive ``flock`` on ``WORKDIR/.capsjax.lock``: the operating system releases it when the
process ends, however it ends, so a lock left by a killed run never blocks. The file records the
holder (host, pid, start time, command) for the message a second run gets.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys

from capsjax.common import files
from capsjax.common.errors import UsageError

LOCK_NAME = ".capsjax.lock"
PROBE_NAME = ".capsjax.write_check"  # Written and removed at once by check_writable.


def prepare(workdir: str, flag: str = "--workdir") -> str:
  """``workdir`` as an absolute path of a writable directory, created if missing."""
  path = os.path.abspath(os.fspath(workdir))
  _refuse_a_file_in_the_way(path, flag)
  with files.writing(path, f"the folder {flag}", advice=f"choose a {flag} you can write to"):
    _make(path, flag)
  if not os.access(path, os.W_OK | os.X_OK):
    raise UsageError(f"{flag}={path} is not writable by this user; choose a directory you can "
                     "write to.")
  return path


def _refuse_a_file_in_the_way(path: str, flag: str) -> None:
  if os.path.exists(path) and not os.path.isdir(path):
    raise UsageError(f"{flag}={path} is a file, not a directory; choose another path.")
  parent = path
  while not os.path.exists(parent):  # The nearest existing ancestor.
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UsageError(f"{flag}={path} lies inside the file {parent}; choose another path.")


def _make(path: str, flag: str) -> None:
  """``os.makedirs(path)``; a folder the filesystem will not make for another reason than a
  read-only, unpermitted or full one (:func:`capsjax.common.files.writing` names those), such
  as one that /proc cannot hold (ENOENT), refused in one line naming where it stopped."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    if files.write_error(e, path) is not None:
      raise
    raise UsageError(f"Cannot create {flag}={path}: {e.strerror} ({e.filename or path}); "
                     f"choose a {flag} you can write to.") from None


def check_writable(folder: str, flag: str = "--workdir", advice: str = "") -> None:
  """Refuses, in one line, a ``folder`` (``flag``: its name in the message, the flag that sets it)
  that no file can be written to: a read-only filesystem, another user's folder
  (:class:`capsjax.common.files.NotWritable`, with ``advice``: default, choose a ``flag`` you can
  write to) or a full disk (:class:`~capsjax.common.files.DiskFull`). Writes and removes a small
  file there (what ``os.access`` cannot tell: a read-only mount, root on another user's network
  share); a folder that does not exist yet is created for it and removed again (:func:`prepare`
  makes it when the run starts), and one that cannot be (inside a file; where /proc holds no
  folders) is refused as :func:`prepare` refuses it. Called before a run loads data or compiles."""
  path = os.path.abspath(os.fspath(folder))
  missing, parent = [], path
  while not os.path.exists(parent):  # Created here, removed after, deepest first.
    missing.append(parent)
    parent = os.path.dirname(parent)
  _refuse_a_file_in_the_way(path, flag)
  probe = os.path.join(path, f"{PROBE_NAME}.{socket.gethostname()}.{os.getpid()}")
  advice = advice or f"choose a {flag} you can write to"
  try:
    with files.writing(path, f"a file in {flag}", advice=advice):
      _make(path, flag)
      with open(probe, "w") as f:
        f.write("capsjax checks that it can write here; this file is removed at once.\n")
  finally:
    with contextlib.suppress(OSError):
      os.remove(probe)
    for made in missing:
      with contextlib.suppress(OSError):
        os.rmdir(made)


class WorkdirBusy(UsageError):
  """Another run holds the workdir."""


class FinishedMeanwhile(Exception):
  """The workdir's run was finished by another process between a look at it and its hold (a sweep's
  worker passes it on; :func:`capsjax.train.train_and_evaluate_group`'s ``skip_finished``)."""


class Lock:
  """Exclusive hold on a workdir; a context manager, or :meth:`acquire` / :meth:`release`."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_NAME)
    self._file = None

  def acquire(self) -> "Lock":
    """Takes the lock at once or raises :class:`WorkdirBusy` naming the holder."""
    if not self.try_acquire():
      raise self.busy()
    return self

  def busy(self) -> WorkdirBusy:
    """The error a run gets when another holds the workdir."""
    return WorkdirBusy(f"{self.workdir} is in use by another run ({self.holder()}). Wait for it "
                       "to finish or stop it, or choose another --workdir. (The lock is "
                       "released when that process ends, even if it is killed.)")

  def try_acquire(self) -> bool:
    """Takes the lock if it is free; False if another process holds it."""
    handle = open(self.path, "a+")
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      handle.close()
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        return False
      if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
        print(f"Warning: the filesystem of {self.workdir} does not support file locks "
              f"({e.strerror}); this run cannot stop a second one started on the same "
              "workdir.", file=sys.stderr, flush=True)
        return True
      raise
    handle.seek(0)
    handle.truncate()
    json.dump({"host": socket.gethostname(), "pid": os.getpid(),
               "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "command": " ".join(sys.argv)}, handle)
    handle.flush()
    self._file = handle
    return True

  def holder(self) -> str:
    """``host H, pid P, started T`` as the holder recorded it."""
    try:
      with open(self.path) as f:
        info = json.load(f)
      return (f"host {info['host']}, pid {info['pid']}, started {info['started']}: "
              f"{info.get('command', '')}")
    except (OSError, ValueError, KeyError):
      return "holder unknown"

  def release(self) -> None:
    if self._file is not None:
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None

  def __enter__(self) -> "Lock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


@contextlib.contextmanager
def hold(workdir: str, tidy_failed_start: bool = False, created: bool = False):
  """Holds ``workdir`` for a run of every process of the job: process 0 takes the
  :class:`Lock`, and all of them stop with :class:`WorkdirBusy` if it is taken.

  ``tidy_failed_start``: when the run fails before it logged or saved anything, process 0
  removes what it left (:func:`remove_failed_start`; the workdir itself too if ``created``),
  so that a mistyped flag does not leave a workdir holding only a lock file.
  """
  import jax
  import numpy as np

  lock = Lock(workdir)
  taken = lock.try_acquire() if jax.process_index() == 0 else True
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    taken = bool(multihost_utils.broadcast_one_to_all(np.int32(taken)))
  if not taken:
    raise lock.busy()
  try:
    yield lock
  except BaseException:
    if tidy_failed_start and jax.process_index() == 0:
      remove_failed_start(workdir, created)  # Under the lock: no other run is in it.
    raise
  finally:
    lock.release()


# What a run writes before its first logged step: nothing else is removed.
_START_FILES = (LOCK_NAME, "config.json", "metrics.jsonl")
_START_DIRS = ("tensorboard", "checkpoints")


def remove_failed_start(workdir: str, created: bool) -> bool:
  """Removes what a run that failed before its first logged step left in ``workdir``: its lock file,
  config.json, an empty metrics.jsonl, TensorBoard event files and an empty checkpoints folder; then
  the workdir if ``created`` and it is empty. Leaves everything when the workdir holds a checkpoint,
  a summary or a logged metric (a run to resume or read). Returns whether it removed the files."""
  path = lambda name: os.path.join(workdir, name)
  metrics, checkpoints, tensorboard = map(path, ("metrics.jsonl", "checkpoints", "tensorboard"))
  if (os.path.exists(path("summary.json"))
      or (os.path.exists(metrics) and os.path.getsize(metrics) > 0)
      or (os.path.isdir(checkpoints) and os.listdir(checkpoints))
      or (os.path.isdir(tensorboard) and not all(
          n.startswith("events.out.tfevents") for n in os.listdir(tensorboard)))):
    return False
  for name in _START_DIRS:
    if os.path.isdir(path(name)):
      for n in os.listdir(path(name)):
        os.remove(os.path.join(path(name), n))
      os.rmdir(path(name))
  for name in _START_FILES:
    if os.path.exists(path(name)):
      os.remove(path(name))
  if created and not os.listdir(workdir):
    os.rmdir(workdir)
  return True
