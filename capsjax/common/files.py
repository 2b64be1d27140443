"""Reading and writing a run's small files so that damage is reported and nothing is lost.

Every file a run rewrites (``config.json``, ``summary.json``, figures, tables) is written to
a temporary file beside it and moved into place, so a crash or a full disk mid-write leaves
the earlier version whole. A JSON file that cannot be read is a :class:`UsageError` naming it
and what to do, never a traceback. A failed write is named for what it is, where it is written
(:func:`writing`, :func:`atomic_write`): a full disk (:func:`is_disk_full`) becomes
:class:`DiskFull` (the path, the free space on its filesystem, what to free), a read-only or
forbidden folder (:func:`is_not_writable`) :class:`NotWritable`; the command lines print either
as one line (exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil

from capsjax.common.errors import UsageError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)

# How the layers under Orbax word a failed file write. TensorStore passes on the operating
# system's words and its errno (``[os_error_code='28']``), and reports a failed file write as
# RESOURCE_EXHAUSTED (``Error writing ... at local file "PATH"``, ``Failed writing: "PATH"``,
# ``Failed to write N bytes to file``): the disk, never memory (:func:`is_disk_full`).
_DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded")
_READ_ONLY_WORDS = ("Read-only file system",)
_NOT_PERMITTED_WORDS = ("Permission denied", "Operation not permitted")
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_WRITE_WORDS = re.compile(r"Error writing|Failed writing|Failed to write")
_WRITTEN_PATH = re.compile(r'(?:local file|Failed writing:)\s*"(/[^"]+)"')


class DiskFull(UsageError):
  """The disk (or quota) filled up while writing; what was saved before is intact."""


class NotWritable(UsageError):
  """A file could not be written: a read-only filesystem or no permission."""


def chain(error: BaseException | None):
  """``error`` and the errors it was raised from or during, each once."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def _errnos(error: BaseException) -> set[int]:
  """The errnos of ``error``'s chain: its OSErrors', and those TensorStore's words quote."""
  found = set()
  for e in chain(error):
    if isinstance(e, OSError) and e.errno:
      found.add(e.errno)
    found.update(int(code) for code in _OS_ERROR_CODE.findall(str(e)))
  return found


def _says(error: BaseException, words) -> bool:
  return any(w in str(e) for e in chain(error) for w in words)


def written_path(error: BaseException) -> str | None:
  """The file ``error`` failed to write, where it says: an ``OSError``'s filename, or the
  path TensorStore's message quotes (``... at local file "PATH"``)."""
  for e in chain(error):
    if isinstance(e, OSError) and e.filename:
      return os.fspath(e.filename)
    if found := _WRITTEN_PATH.search(str(e)):
      return found.group(1)
  return None


def is_disk_full(error: BaseException) -> bool:
  """Whether ``error`` (or an error it was raised from) is a full disk or quota: errno
  ENOSPC or EDQUOT (of an OSError, or quoted by TensorStore), their words (Orbax and
  TensorStore re-raise them as their own errors), or TensorStore's ``RESOURCE_EXHAUSTED`` on
  writing a local file. Never XLA's ``RESOURCE_EXHAUSTED: Out of memory``: no file."""
  if _errnos(error) & set(DISK_FULL_ERRNOS) or _says(error, _DISK_FULL_WORDS):
    return True
  return any("RESOURCE_EXHAUSTED" in str(e) and _WRITE_WORDS.search(str(e))
             and _WRITTEN_PATH.search(str(e)) for e in chain(error))


def is_not_writable(error: BaseException, permission: bool = True) -> bool:
  """Whether ``error`` (or an error it was raised from) is a write the filesystem refused:
  read-only (EROFS) or, with ``permission``, not permitted (EACCES, EPERM: also a read's
  error, so only where a write is known to have failed)."""
  codes = NOT_WRITABLE_ERRNOS if permission else (errno.EROFS,)
  words = _READ_ONLY_WORDS + (_NOT_PERMITTED_WORDS if permission else ())
  return bool(_errnos(error) & set(codes)) or _says(error, words)


def is_file_write_error(error: BaseException) -> bool:
  """Whether ``error`` is surely a failed file write: a full disk (:func:`is_disk_full`) or
  a read-only filesystem (what memory and other failures never are)."""
  return is_disk_full(error) or is_not_writable(error, permission=False)


def format_size(num_bytes: float) -> str:
  """``1.4 MB``, ``512 B``: decimal units, as ``df -H`` gives them."""
  for unit in ("B", "kB", "MB", "GB"):
    if abs(num_bytes) < 1000:
      return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
    num_bytes /= 1000
  return f"{num_bytes:.1f} TB"


def existing_folder(path: str) -> str:
  """The nearest folder of ``path`` (itself, or an ancestor) that exists."""
  folder = os.path.abspath(path)
  while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
    folder = os.path.dirname(folder)
  return folder


def mount_point(path: str) -> str:
  """The mount point of the filesystem that holds ``path``."""
  folder = os.path.realpath(existing_folder(path))
  while not os.path.ismount(folder):
    folder = os.path.dirname(folder)
  return folder


def free_space(path: str) -> str:
  """``12.3 kB free of 62.9 MB on /mnt/small``: the filesystem of ``path``
  (``shutil.disk_usage``), or ``free space unknown``."""
  try:
    usage = shutil.disk_usage(existing_folder(path))
  except OSError:
    return "free space unknown"
  return (f"{format_size(usage.free)} free of {format_size(usage.total)} on "
          f"{mount_point(path)}")


def _named(what: str, path: str | None) -> str:
  """``the run's summary (/run/summary.json)``: what was written, and where."""
  return f"{what} ({path})" if what and path else what or path or "a file"


def disk_full(error: BaseException, path: str | None = None, what: str = "",
              then: str = "") -> DiskFull:
  """The :class:`DiskFull` to raise for ``error`` while writing ``what`` at ``path`` (default: the
  path the error names): the path, the free space on its filesystem, what to free; ``then``: what
  the rerun does (default: a training run resumes from its last complete checkpoint)."""
  path = path or written_path(error)
  where = f"; {free_space(path)}" if path else ""
  then = then or ("what was written before is intact, and a training run resumes from its "
                  "last complete checkpoint")
  return DiskFull(f"The disk is full: writing {_named(what, path)} failed{where}. Free space "
                  "there (old runs' workdirs or checkpoints, damaged_checkpoints/ folders) or "
                  f"choose a --workdir on another disk, then rerun the same command: {then}.")


def not_writable(error: BaseException, path: str | None = None, what: str = "",
                 advice: str = "") -> NotWritable:
  """The :class:`NotWritable` to raise for ``error`` while writing ``what`` at ``path``:
  why (a read-only filesystem, or no permission) and ``advice`` (default: choose a --workdir
  you can write to)."""
  path = path or written_path(error)
  why = ("it is on a read-only filesystem" if is_not_writable(error, permission=False)
         else "permission denied")
  advice = advice or "choose a --workdir you can write to"
  return NotWritable(f"Cannot write {_named(what, path)}: {why}; {advice}.")


def write_error(error: BaseException, path: str | None = None, what: str = "",
                then: str = "", advice: str = "") -> UsageError | None:
  """The one-line error for ``error`` raised while writing ``what`` at ``path``:
  :class:`DiskFull` or :class:`NotWritable` (``error`` itself when it is one already), or None
  for any other error (a bug, or memory: it surfaces unchanged)."""
  if isinstance(error, (DiskFull, NotWritable)):
    return error
  if is_disk_full(error):
    return disk_full(error, path, what, then)
  if is_not_writable(error):
    return not_writable(error, path, what, advice)
  return None


@contextlib.contextmanager
def writing(path: str, what: str = "", then: str = "", advice: str = ""):
  """Turns a full disk or an unwritable file raised inside into its one-line error naming ``what``
  (e.g. "the run's summary") and ``path`` (:func:`write_error`); other errors pass unchanged."""
  try:
    yield
  except Exception as e:
    named = write_error(e, path, what, then, advice)
    if named is None or named is e:
      raise
    raise named from e


class Writes:
  """The writes to one file kept open (a log, an event file): :meth:`__call__` names a
  failed one (:func:`writing`) and remembers it; :meth:`closing` then does not raise it a
  second time (closing flushes the same buffered bytes, and fails on them again)."""

  def __init__(self, path: str, what: str):
    self.path, self.what, self.failed = path, what, False

  @contextlib.contextmanager
  def __call__(self):
    try:
      with writing(self.path, self.what):
        yield
    except (DiskFull, NotWritable):
      self.failed = True
      raise

  @contextlib.contextmanager
  def closing(self):
    """Around closing the file: a failed write named, unless one was raised before."""
    failed = self.failed
    try:
      with self():
        yield
    except (DiskFull, NotWritable):
      if not failed:
        raise


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", what: str = "", **open_args):
  """Opens a temporary file beside ``path``; on success moves it onto ``path``. On any error
  ``path`` is left as it was; a full disk or an unwritable folder raises :class:`DiskFull`
  or :class:`NotWritable` naming ``what`` (e.g. "the run's summary") and ``path``."""
  temporary = f"{path}.{os.getpid()}.tmp"
  try:
    with writing(path, what):
      with open(temporary, mode, **open_args) as f:
        yield f
      os.replace(temporary, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(temporary)
    raise


def write_json(path: str, data, indent: int = 2, what: str = "") -> None:
  """``data`` as JSON at ``path``, atomically (``what``: its name in a failed write's error)."""
  with atomic_write(path, what=what) as f:
    json.dump(data, f, indent=indent)


def read_json(path: str, advice: str):
  """The JSON object in ``path``; a damaged file is a UsageError naming it, with ``advice``
  (what the user can do)."""
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise UsageError(f"{path} is damaged (not valid JSON: {e.msg} at line {e.lineno}, column "
                     f"{e.colno}). {advice}") from e
  except UnicodeDecodeError as e:
    raise UsageError(f"{path} is damaged (not text). {advice}") from e
