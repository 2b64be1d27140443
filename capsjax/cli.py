"""What every command line shares: flag errors, config files and every error a user can fix
as one clear message (exit 2, no traceback), and the restart with the host-memory tunables."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable

from absl import app, flags

from capsjax import files, hostmemory
from capsjax.errors import NonFiniteLossError, UsageError


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag value (e.g. an unknown config variant or key) as
  ``error: ...`` and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    lines = [line for line in str(e).splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):  # A config file raised: its
      lines = [lines[0].rstrip(":") + ":", lines[-1].strip()]  # message, not the stack.
    print("error: " + "\n  ".join(lines) + "\nPass --helpshort to see the flags.",
          file=sys.stderr)
    sys.exit(2)
  except (AttributeError, KeyError) as e:  # ml_collections: an override of a missing key.
    chain = [e]
    while isinstance(chain[-1].__context__, (AttributeError, KeyError)):
      chain.append(chain[-1].__context__)
    texts = [" ".join(str(c.args[0] if c.args else c).replace("\\n", " ").replace("\\'", "")
                      .split()).strip("'\"") for c in chain]
    detail = next((t for t in texts if "Did you mean" in t), texts[-1])
    print(f"error: a --config.* override names a key the config does not have: {detail}",
          file=sys.stderr)
    sys.exit(2)


def config_from_flag(holder):
  """The ConfigDict of a ``DEFINE_config_file`` flag; a missing or broken file is a
  UsageError naming it (ml_collections only reports it when the value is first used)."""
  flag = flags.FLAGS[holder.name]
  path = (flag.config_filename or "").split(":")[0]
  if path and not os.path.isfile(path):
    raise UsageError(f"--{holder.name}={flag.config_filename}: the file {path} does not exist "
                     "(e.g. --config=configs/mnist.py).")
  try:
    return holder.value
  except (OSError, ImportError, SyntaxError, AttributeError, ValueError, TypeError) as e:
    raise UsageError(f"--{holder.name}={flag.config_filename} could not be loaded: "
                     f"{type(e).__name__}: {e}") from e


def run(main: Callable[[list[str]], None], module: str) -> None:
  """``app.run(main)`` for ``python -m module``, restarted once with the malloc tunables."""
  hostmemory.restart_with_malloc_tuning(module)
  app.run(main, flags_parser=parse_flags)


@contextlib.contextmanager
def clear_errors():
  """Ends the command with one line on stderr, no traceback, for what the user can act on:
  a :class:`UsageError` or a full disk (exit 2), a non-finite loss (exit 1), a stop by a
  signal after saving (exit 128 + the signal's number, as if the signal had ended it)."""
  from capsjax.preemption import Preempted

  try:
    yield
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except NonFiniteLossError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  except Preempted as e:
    print(str(e), file=sys.stderr, flush=True)
    sys.exit(e.exit_status)
  except Exception as e:
    if not files.is_disk_full(e):
      raise
    print(f"error: {files.disk_full(e)}", file=sys.stderr)
    sys.exit(2)
