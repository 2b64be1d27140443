"""What every command line shares: flag errors, config files and every error a user can fix
as one clear message (exit 2, no traceback), and the restart with the host-memory tunables.

Each command module (``capsjax.main``, ``evaluate``, ``benchmark``, ``sweep``) defines its flags
in its ``define_flags(flag_values, argv)``, called only when it runs (:func:`run`), so the
modules import side by side; :func:`invoke` runs one in this process on flags of its own (the
tests' way to check a command's errors without starting a process)."""

from __future__ import annotations

import contextlib
import difflib
import os
import pathlib
import sys
from typing import Callable

from absl import app, flags
from ml_collections import config_flags

from capsjax.common.errors import NonFiniteLossError, UsageError
from capsjax.common import files
from capsjax.runs import hostmemory
from capsjax.config import runconfig
from capsjax.runs import lost_peer
from capsjax.runs.preemption import Preempted


# The repository's configs/: capsjax/runs/cli.py -> the repository root.
CONFIGS = str(pathlib.Path(__file__).resolve().parents[2] / "configs")


def parse_flags(argv: list[str], flag_values: flags.FlagValues | None = None) -> list[str]:
  """absl's flag parsing (into ``flag_values``, by default absl's global flags), with a bad
  flag value (e.g. an unknown config variant or key) as ``error: ...`` and exit status 2."""
  spec = _config_spec(argv)
  if spec and not os.path.isfile(spec.split(":")[0]):  # Else a traceback at the first override.
    print(f"error: {missing_config_message(spec)}", file=sys.stderr)
    sys.exit(2)
  try:
    return (flag_values or flags.FLAGS)(argv)
  except flags.Error as e:
    if found := missing_override(argv):  # "Unknown command line flag 'config.x'": say which.
      _refuse_override(*found)
    lines = [line for line in str(e).splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in lines):  # A config file raised: its
      lines = [lines[0].rstrip(":") + ":", lines[-1].strip()]  # message, not the stack.
    print("error: " + "\n  ".join(lines) + "\nPass --helpshort to see the flags.", file=sys.stderr)
    sys.exit(2)
  except (AttributeError, KeyError) as e:  # ml_collections: an override of a missing key.
    found = missing_override(argv)
    if found is None:  # The config file could not be read back: ml_collections' words.
      chain = [e]
      while isinstance(chain[-1].__context__, (AttributeError, KeyError)):
        chain.append(chain[-1].__context__)
      texts = [" ".join(str(c.args[0] if c.args else c).replace("\\n", " ")
                        .replace("\\'", "").split()).strip("'\"") for c in chain]
      detail = next((t for t in texts if "Did you mean" in t), texts[-1])
      detail = detail.split("Did you mean")[0].strip().strip("'\"").rstrip(".")
      family = next((f for f in CONFIG_FLAGS if any(a.startswith(f"--{f}.") for a in argv)),
                    "config")
      found = (family, detail, "")
    _refuse_override(*found)


def _refuse_override(family: str, key: str, hint: str) -> None:
  print(f"error: a --{family}.* override names a key that --{family} does not have: "
        f"{key!r}.{hint}", file=sys.stderr)
  sys.exit(2)


def _config_spec(argv: list[str], name: str = "config") -> str | None:
  """The value of ``--config=PATH[:variant]`` (or ``--config PATH``) in ``argv``."""
  for k, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and k + 1 < len(argv):
      return argv[k + 1]
  return None


def missing_config_message(spec: str, flag: str = "--config") -> str:
  """The error for a config path that does not exist: relative to where, and where the
  configs are."""
  path = spec.split(":")[0]
  message = (f"{flag}={spec}: the file {path} does not exist; a relative path is read from "
             f"the current directory ({os.getcwd()}).")
  if os.path.isdir(CONFIGS):
    names = sorted(n for n in os.listdir(CONFIGS) if n.endswith(".py") and n != "images.py")
    close = difflib.get_close_matches(os.path.basename(path), names, n=1)
    example = os.path.join(CONFIGS, close[0] if close else "mnist.py")
    message += (f" capsjax's configs are in {CONFIGS} ({', '.join(names)}), e.g. "
                f"{flag}={example}{(':' + spec.split(':', 1)[1]) if ':' in spec else ''}.")
  return message


# The config-file flags of capsjax's commands, whose overrides are --NAME.KEY=VALUE.
CONFIG_FLAGS = ("config", "evals")


def missing_override(argv: list[str]) -> tuple[str, str, str] | None:
  """``(flag, key, hint)`` for the first ``--FLAG.KEY=...`` override of ``argv`` whose key
  the file of ``--FLAG`` lacks; ``hint`` is `` Did you mean --config.train.num_steps?`` (keys
  of any section that end the same way, else the closest spellings) or "". None when every
  key exists or a file cannot be read."""
  for family in CONFIG_FLAGS:
    prefix = f"--{family}."
    asked = [a.split("=", 1)[0][len(prefix):] for a in argv if a.startswith(prefix)]
    spec = _config_spec(argv, family)
    if not asked or not spec:
      continue
    try:
      path, _, variant = spec.partition(":")
      config = runconfig.import_config_file(path).get_config(variant or None)
      keys = sorted(runconfig.flatten(config.to_dict()))
    except Exception:  # The file itself is at fault; the caller says so.
      return None
    for key in asked:
      if key in keys or any(k.startswith(key + ".") for k in keys):
        continue
      last = key.rsplit(".", 1)[-1]
      matches = [k for k in keys if k.rsplit(".", 1)[-1] == last]
      matches = matches or difflib.get_close_matches(key, keys, n=2, cutoff=0.6)
      hint = (" Did you mean " + " or ".join(f"--{family}.{m}" for m in matches) + "?"
              if matches else "")
      return family, key, hint
  return None


def define_config_file(name: str, default: str | None, help_string: str,
                       flag_values: flags.FlagValues, argv: list[str] | None):
  """A config-file flag (``--NAME=FILE[:variant]``) whose ``--NAME.KEY=VALUE`` overrides may
  set any key, also one the file leaves out (a router's setting it keeps at its default): the
  config is resolved before anything runs, which refuses a key nobody declared, naming the
  nearest one (:func:`capsjax.config.schema.resolve_config`)."""
  return config_flags.DEFINE_config_file(name, default, help_string, lock_config=False,
                                         accept_new_attributes=True, sys_argv=argv,
                                         flag_values=flag_values)


def flag_of(holder) -> flags.Flag:
  """The flag behind an absl ``FlagHolder``, in whichever FlagValues defined it."""
  return holder._flagvalues[holder.name]  # absl keeps no public accessor for it.


def config_from_flag(holder):
  """The ConfigDict of a ``DEFINE_config_file`` flag; a missing or broken file is a
  UsageError naming it (ml_collections only reports it when the value is first used)."""
  flag = flag_of(holder)
  path = (flag.config_filename or "").split(":")[0]
  if path and not os.path.isfile(path):
    raise UsageError(missing_config_message(flag.config_filename, f"--{holder.name}"))
  try:
    return holder.value
  except (OSError, ImportError, SyntaxError, AttributeError, ValueError, TypeError) as e:
    raise UsageError(f"--{holder.name}={flag.config_filename} could not be loaded: "
                     f"{type(e).__name__}: {e}") from e


def run(main: Callable[[list[str]], None], module: str,
        define_flags: Callable[[flags.FlagValues, list[str]], object]) -> None:
  """``app.run(main)`` for ``python -m module`` with the flags of ``define_flags``, restarted
  once with the malloc tunables."""
  hostmemory.restart_with_malloc_tuning(module)
  define_flags(flags.FLAGS, sys.argv)
  app.run(main, flags_parser=parse_flags)


def invoke(command, argv: list[str]) -> int:
  """Runs ``command`` (a module with ``define_flags`` and ``main``) in this process as
  ``python -m command ARGV`` would, its flags in a FlagValues of their own; returns the exit
  status (messages go to stdout and stderr as the command prints them)."""
  argv = [command.__name__, *argv]
  flag_values = flags.FlagValues()
  try:
    command.define_flags(flag_values, argv)
    command.main(parse_flags(argv, flag_values))
  except SystemExit as e:
    return e.code if isinstance(e.code, int) else int(e.code is not None)
  except app.UsageError as e:  # What app.run prints for it, and its status.
    print(f"FATAL Flags parsing error: {e}", file=sys.stderr)
    return 1
  return 0


@contextlib.contextmanager
def clear_errors():
  """Ends the command with one line on stderr, no traceback, for what the user can act on:
  a :class:`UsageError` (exit 2: a full disk or an unwritable file among them, named where it
  was written, :func:`capsjax.common.files.writing`; one that was not, by its path), a
  non-finite loss (exit 1), a stop by a signal after saving (exit 128 + the signal's number,
  as if the signal had ended it), a process of a multi-process run lost (exit 75:
  :mod:`capsjax.runs.lost_peer`). Every other error surfaces unchanged."""
  try:
    yield
  except (UsageError, NonFiniteLossError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2 if isinstance(e, UsageError) else 1)
  except Preempted as e:
    print(str(e), file=sys.stderr, flush=True)
    sys.exit(e.exit_status)
  except Exception as e:
    lost_peer.exit_if_lost(e)  # Another process of the run is gone: one line, exit 75.
    if not files.is_file_write_error(e):  # Not surely a write (EACCES may be a read's).
      raise
    print(f"error: {files.write_error(e)}", file=sys.stderr)
    sys.exit(2)
