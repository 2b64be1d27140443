"""Reading and writing a run's small files so that damage is reported and nothing is lost.

Every file a run rewrites (``config.json``, ``summary.json``, figures, tables) is written to
a temporary file beside it and moved into place, so a crash or a full disk mid-write leaves
the earlier version whole. A JSON file that cannot be read is a :class:`UsageError` naming it
and what to do, never a traceback. A full disk (``ENOSPC``, ``EDQUOT``) anywhere in a command
becomes :class:`DiskFull`, which the command lines print as one message.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os

from capsjax.common.errors import UsageError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(UsageError):
  """The disk (or quota) filled up while writing; what was saved before is intact."""


def is_disk_full(error: BaseException) -> bool:
  """Whether ``error`` (or an error it was raised from) is a full disk or quota."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
      return True
    if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
      return True  # Orbax and TensorStore re-raise it as their own errors.
    error = error.__cause__ or error.__context__
  return False


def disk_full(error: BaseException, path: str | None = None, what: str = "") -> DiskFull:
  """The :class:`DiskFull` to raise for ``error`` while writing ``path``."""
  path = path or getattr(error, "filename", None)
  where = f" while writing {path}" if path else ""
  return DiskFull(f"The disk is full{where}{' (' + what + ')' if what else ''}. Files written "
                  "before are intact; free some space (or use a --workdir on another disk), "
                  "then rerun the same command: a training run resumes from its last "
                  "checkpoint.")


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", **open_args):
  """Opens a temporary file beside ``path``; on success moves it onto ``path``. On any error
  ``path`` is left as it was (a full disk raises :class:`DiskFull`)."""
  temporary = f"{path}.{os.getpid()}.tmp"
  try:
    with open(temporary, mode, **open_args) as f:
      yield f
    os.replace(temporary, path)
  except OSError as e:
    with contextlib.suppress(OSError):
      os.remove(temporary)
    if e.errno in DISK_FULL_ERRNOS:
      raise disk_full(e, path) from e
    raise
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(temporary)
    raise


def write_json(path: str, data, indent: int = 2) -> None:
  """``data`` as JSON at ``path``, atomically."""
  with atomic_write(path) as f:
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
