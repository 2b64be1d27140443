"""A multi-process run that loses one of its processes (a host preempted or crashed, a
``kill -9``): every survivor ends with one line on stderr and exit status :data:`EXIT_STATUS`,
no traceback and no abort dump; nothing saved is lost, and the same command on every host
resumes from the last checkpoint.

What the survivors see of a loss, and what turns it into the line (:func:`report`):

* A collective with the lost process fails (Gloo: ``Connection closed by peer``) and raises
  where a step's results are read; a barrier (Orbax's save, ``sync_global_devices``) or the
  coordinator's key-value store fails. The training loop, :class:`capsjax.training.run.Run`
  and :func:`capsjax.runs.cli.clear_errors` pass what they catch to :func:`exit_if_lost` before
  any clean-up that would wait for the lost process (finishing a checkpoint needs every one).
* JAX's distributed service stops hearing the process's heartbeats (after
  ``heartbeat_timeout_seconds``), or a process loses the coordinator (its error polling fails at
  once). The service's client then calls its ``missed_heartbeat_callback`` on a thread of its
  own, which by default aborts (``Terminating process because the JAX distributed service
  detected fatal errors``, ``*** Check failure stack trace ***``, exit 134). :func:`watching`
  passes :func:`_on_missed_heartbeat` instead. jaxlib 0.10.2 cannot call a Python function with
  the ``absl::Status`` it passes (no nanobind caster: ``std::bad_cast``, then ``std::terminate``),
  so a ``std::terminate`` handler (:func:`_install_terminate_handler`) reports the loss when the
  exception in flight is that ``std::bad_cast``; any other ``std::terminate`` goes to the
  handler it replaced. A jaxlib that can call the function reaches :func:`_on_missed_heartbeat`.

The line names the lost process where it is known (the other one of two; the one a heartbeat
timeout names; process 0 when the coordinator is unreachable) and the last complete checkpoint
of each run (:func:`watch_checkpoints`: a checkpoint's folder is renamed to its step only once
every process has written it). The process ends with ``os._exit``: no atexit handlers (JAX's
calls ``jax.distributed.shutdown()``, whose barrier waits for the lost process) and no waiting
for a checkpoint still being written (it needs the lost process; the previous one is intact).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import threading

# EX_TEMPFAIL (sysexits.h): a temporary failure; the same command resumes.
EXIT_STATUS = 75

_checkpoint_dirs: list[str] = []  # Of the runs in progress, in the order they started.
_watching = False  # Set by watching(): this process's distributed client reports to report().
_job = (0, 1)  # This process's index and the number of processes, once watching() set them.
_reporting = threading.Lock()  # One line, from whichever thread notices first.

# Messages of a collective, barrier or coordination-service call that failed because another
# process is gone (Gloo's collectives; the statuses of JAX's distributed service and its client).
_LOST = re.compile(r"Gloo \S+ failed|Connection (closed|reset) by peer|heartbeat|Barrier failed|"
                   r"coordination service|CoordinationService|Socket closed", re.IGNORECASE)


def watch_checkpoints(directory: str) -> None:
  """Names ``directory`` (a run's checkpoints) in the line, until :func:`forget_checkpoints`."""
  _checkpoint_dirs.append(os.path.abspath(directory))


def forget_checkpoints(directory: str) -> None:
  with contextlib.suppress(ValueError):
    _checkpoint_dirs.remove(os.path.abspath(directory))


def lost_peer_error(error: BaseException) -> BaseException | None:
  """The exception in ``error``'s chain (``__cause__``, ``__context__``) that says another
  process is gone, or None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, Exception) and _LOST.search(str(error)):
      return error
    error = error.__cause__ or error.__context__
  return None


def exit_if_lost(error: BaseException) -> None:
  """Ends the process with the line (:func:`report`) when ``error`` says another process of
  this run is gone; returns otherwise (and always outside a run set up by :func:`watching`)."""
  if not _watching:
    return
  found = lost_peer_error(error)
  if found is not None:
    report(str(found))


def report(detail: str | None) -> None:
  """Prints the line for a lost process (``detail``: what failed, if known) and ends the
  process with :data:`EXIT_STATUS`. Never returns; a second caller (another thread) waits."""
  _reporting.acquire()  # Never released: the first caller ends the process.
  try:
    line = message(detail)
  except BaseException as e:  # The line must come out whatever went wrong composing it.
    line = (f"error: lost another process of this run ({detail or 'reported by JAX'}; {e!r} "
            "while composing this message); run the same command on every host to resume "
            "from the last checkpoint.")
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  with contextlib.suppress(Exception):
    # On a terminal, process 0's progress bar leaves its line open.
    os.write(2, (("\n" if os.isatty(2) else "") + line + "\n").encode())
  os._exit(EXIT_STATUS)


def message(detail: str | None) -> str:
  """The line: which process was lost (if known), why, each run's last checkpoint, and that the
  same command on every host resumes it."""
  me, count = _job
  lost = _lost_process(detail, me, count)
  who = (f"process {lost}{' (the coordinator)' if lost == 0 else ''}" if lost is not None
         else "a process")
  why = _short(detail) if detail else "reported by JAX's distributed service"
  return f"error: lost {who} of this {count}-process run ({why}); {_checkpoints_text()}."


def _lost_process(detail: str | None, me: int, count: int) -> int | None:
  """The lost process's index, where ``detail`` or the job's size tells it."""
  text = detail or ""
  named = [int(n) for n in re.findall(r"Task (\d+) heartbeat timeout", text)]
  if m := re.search(r"stopped sending heartbeats\):\s*([\d,\s]+)", text):
    named += [int(n) for n in re.findall(r"\d+", m.group(1))]
  named = sorted(set(named) - {me})
  if len(named) == 1:
    return named[0]
  if me != 0 and re.search(r"coordination service|leader task", text, re.IGNORECASE) and (
      re.search(r"Socket closed|Failed to send RPC|UNAVAILABLE", text)):
    return 0
  if count == 2:
    return 1 - me
  return None


def _short(detail: str) -> str:
  """The first sentence of a setup error, without its status code and source locations."""
  first = next((line.strip() for line in detail.splitlines() if line.strip()), "")
  first = re.sub(r"\[[^\]]*\.(cc|h|cpp):\d+\]\s*", "", first)
  first = re.split(r"(?<=\w)\. (?=[A-Z])", first)[0]
  first = re.sub(r"^[A-Z_]+: ", "", first).rstrip(".")
  return first if len(first) <= 160 else first[:157] + "..."


def _checkpoints_text() -> str:
  resume = "run the same command on every host to resume from it"
  steps = {d: _last_step(d) for d in _checkpoint_dirs}
  if not steps:
    return "run the same command on every host to resume from the last checkpoint"
  if len(steps) == 1:
    (directory, step), = steps.items()
    if step is None:
      return (f"no checkpoint was saved yet in {directory}: run the same command on every "
              "host to start again")
    return f"the last checkpoint is step {step} in {directory}: {resume}"
  saved = sorted({s for s in steps.values() if s is not None})
  if not saved:
    return "no checkpoint was saved yet: run the same command on every host to start again"
  if len(saved) == 1 and None not in steps.values():
    return f"the last checkpoint of each of the {len(steps)} runs is step {saved[0]}: {resume}"
  return (f"the {len(steps)} runs' last checkpoints are at steps "
          f"{', '.join(map(str, saved))}: run the same command on every host to resume them")


def _last_step(directory: str) -> int | None:
  """The newest complete checkpoint in ``directory`` (one still being written is a
  ``*.orbax-checkpoint-tmp*`` folder)."""
  try:
    steps = [int(n) for n in os.listdir(directory) if n.isdigit()]
  except OSError:
    return None
  return max(steps) if steps else None


# --- The distributed client's callback ------------------------------------------------

def _on_missed_heartbeat(status=None, *args) -> None:
  """``missed_heartbeat_callback``: the service lost a process, or this one its coordinator."""
  report(str(status) if status is not None else None)


_TERMINATE_HANDLER = ctypes.CFUNCTYPE(None)
_installed: dict = {}  # The handler (kept alive) and the one it replaced.


def _exception_in_flight(libstdcxx) -> bytes | None:
  """The mangled type name of the C++ exception being handled (``St8bad_cast``), or None."""
  current = libstdcxx.__cxa_current_exception_type
  current.restype = ctypes.c_void_p
  type_info = current()
  if not type_info:
    return None
  # Itanium C++ ABI: a std::type_info is its vtable pointer, then its mangled name.
  return ctypes.c_char_p(ctypes.c_void_p.from_address(type_info + ctypes.sizeof(
      ctypes.c_void_p)).value).value


def _install_terminate_handler() -> bool:
  """Installs the ``std::terminate`` handler of the module docstring once; returns whether it
  is installed (False where the C++ setup's symbols are not found: JAX's abort then stays)."""
  if _installed:
    return True
  try:
    libstdcxx = ctypes.CDLL("libstdc++.so.6")
    set_terminate = libstdcxx._ZSt13set_terminatePFvvE  # std::set_terminate(void (*)())
    set_terminate.restype, set_terminate.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    libstdcxx.__cxa_current_exception_type  # noqa: B018 (present, or AttributeError)
  except (OSError, AttributeError):
    return False

  def on_terminate():
    try:
      if _watching and _exception_in_flight(libstdcxx) == b"St8bad_cast":
        report(None)
    except BaseException:
      pass
    previous = _installed.get("previous")
    if previous:
      _TERMINATE_HANDLER(previous)()
    os.abort()

  handler = _TERMINATE_HANDLER(on_terminate)
  _installed["handler"] = handler
  _installed["previous"] = set_terminate(ctypes.cast(handler, ctypes.c_void_p).value)
  return True


@contextlib.contextmanager
def watching():
  """For the duration (around ``jax.distributed.initialize``), the distributed client JAX makes
  reports a lost process with the line instead of aborting: its ``missed_heartbeat_callback``
  is :func:`_on_missed_heartbeat`. Without the terminate handler (or a jaxlib whose client takes
  no callback) the client is JAX's own; :func:`exit_if_lost` still reports what raises."""
  global _watching, _job
  from jax._src import distributed as jax_distributed

  jaxlib = jax_distributed._jax
  make_client = jaxlib.get_distributed_runtime_client
  takes_callback = "missed_heartbeat_callback" in (make_client.__doc__ or "")
  if takes_callback and _install_terminate_handler():
    def with_callback(*args, **kwargs):
      kwargs.setdefault("missed_heartbeat_callback", _on_missed_heartbeat)
      return make_client(*args, **kwargs)

    jaxlib.get_distributed_runtime_client = with_callback
  try:
    yield
    state = jax_distributed.global_state
    _job, _watching = (state.process_id, state.num_processes), True
  finally:
    jaxlib.get_distributed_runtime_client = make_client
