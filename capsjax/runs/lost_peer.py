"""A multi-process run that loses one of its processes (a host preempted or crashed, a
``kill -9``): every survivor ends with one line on stderr and exit status :data:`EXIT_STATUS`,
no traceback and no abort dump; nothing saved is lost, and the same command on every host
resumes from the last checkpoint (docs/training.md, "Several GPUs or hosts").

What the survivors see of a loss, and what turns it into the line:

* A collective with the lost process fails (Gloo: ``Connection closed by peer``) and raises
  where a step's results are read; a barrier (Orbax's save, ``sync_global_devices``) or the
  coordinator's key-value store fails. The training loop, :class:`capsjax.training.run.Run`
  and :func:`capsjax.runs.cli.clear_errors` pass what they catch to :func:`exit_if_lost` before
  any clean-up that would wait for the lost process (finishing a checkpoint needs every one).
* JAX's distributed service stops hearing the process's heartbeats (after
  ``heartbeat_timeout_seconds``), or a process loses the coordinator (its error polling fails at
  once). JAX's client then aborts the process from a thread of its own: ``Terminating process
  because the JAX distributed service detected fatal errors ... absl::Status: ...``, ``***
  Check failure stack trace ***``, SIGABRT (exit 134 in a shell). ``jax.distributed.initialize``
  takes nothing that changes this, so the command is supervised, as torchrun's agent supervises
  its workers: :func:`supervise` (called by :func:`capsjax.runs.distributed.initialize` before
  JAX is imported) runs the same command line (``sys.orig_argv``) again as a child process and
  ends as it ended. The child's stdout is the parent's; its stderr passes through the parent,
  which holds back JAX's abort dump only (:class:`_AbortDump`). When the child aborts after that
  dump, the parent prints the line (the lost process read from the dump's status) and exits with
  :data:`EXIT_STATUS`; every other ending passes through unchanged (the exit status, or the
  same signal). SIGTERM and SIGINT sent to the parent are passed on to the child (a stop saves
  a checkpoint: :mod:`capsjax.runs.preemption`; a Ctrl-C that reaches both is one stop). A
  parent killed outright takes the child with it: the child reads the end of their socket, and
  kills itself with SIGKILL, so the other processes see this one lost.

Over that socket the child tells the parent its place in the job (:func:`joined`), each run's
checkpoint folder (:func:`watch_checkpoints`) and a loss that :func:`exit_if_lost` found (the
parent then prints the line). On a terminal the child's stderr is a pseudo-terminal, so process
0's progress bar is redrawn in place as without a parent.

The line names the lost process where it is known (:func:`_lost_process`) and the last complete
checkpoint of each run (a checkpoint's folder is renamed to its step only once every process has
written it). The child ends with ``os._exit``: no atexit handlers (JAX's calls
``jax.distributed.shutdown()``, whose barrier waits for the lost process) and no waiting for a
checkpoint still being written (it needs the lost process; the previous one is intact).
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import tty

from capsjax.common import files

# EX_TEMPFAIL (sysexits.h): a temporary failure; the same command resumes.
EXIT_STATUS = 75

# Set in the child's environment: the file descriptor of its end of the socket to the parent.
CHILD_ENV = "CAPSJAX_SUPERVISOR_FD"

_checkpoint_dirs: list[str] = []  # Of the runs in progress, in the order they started.
_watching = False  # Set by joined(): exit_if_lost reports to report().
_job: tuple[int | None, int | None] = (0, 1)  # This process's index and the job's size.
_reporting = threading.Lock()  # One line, from whichever thread notices first.
_parent: socket.socket | None = None  # In a supervised child: the socket to the parent.

# Messages of a collective, barrier or coordination-service call that failed because another
# process is gone (Gloo's collectives; the statuses of JAX's distributed service and its client).
_LOST = re.compile(r"Gloo \S+ failed|Connection (closed|reset) by peer|heartbeat|Barrier failed|"
                   r"coordination service|CoordinationService|Socket closed", re.IGNORECASE)


def watch_checkpoints(directory: str) -> None:
  """Names ``directory`` (a run's checkpoints) in the line, until :func:`forget_checkpoints`."""
  _checkpoint_dirs.append(os.path.abspath(directory))
  _tell(watch=os.path.abspath(directory))


def forget_checkpoints(directory: str) -> None:
  with contextlib.suppress(ValueError):
    _checkpoint_dirs.remove(os.path.abspath(directory))
  _tell(forget=os.path.abspath(directory))


def joined(process_id: int, num_processes: int) -> None:
  """After ``jax.distributed.initialize``: this process's place in the job; from now on
  :func:`exit_if_lost` ends the process on a lost one."""
  global _watching, _job
  _job, _watching = (process_id, num_processes), True
  _tell(job=[process_id, num_processes])


def lost_peer_error(error: BaseException) -> BaseException | None:
  """The exception in ``error``'s chain (:func:`capsjax.common.files.chain`) that says another
  process is gone, or None."""
  return next((e for e in files.chain(error) if isinstance(e, Exception) and _LOST.search(str(e))),
              None)


def exit_if_lost(error: BaseException) -> None:
  """Ends the process with the line (:func:`report`) when ``error`` says another process of
  this run is gone; returns otherwise (and always before :func:`joined`)."""
  if _watching and (found := lost_peer_error(error)) is not None:
    report(str(found))


def report(detail: str | None) -> None:
  """Ends the process with :data:`EXIT_STATUS` after the line for a lost process (``detail``:
  what failed, if known): printed here, or by the parent of a supervised child. Never returns;
  a second caller (another thread) waits."""
  _reporting.acquire()  # Never released: the first caller ends the process.
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  if _parent is not None and _tell(lost=detail):
    os._exit(EXIT_STATUS)  # The parent prints the line.
  with contextlib.suppress(Exception):  # Process 0's progress bar may leave a terminal line open.
    os.write(2, (("\n" if os.isatty(2) else "") + _line(detail) + "\n").encode())
  os._exit(EXIT_STATUS)


def _line(detail: str | None, status: str | None = None) -> str:
  try:
    return message(detail, status)
  except BaseException as e:  # The line must come out whatever went wrong composing it.
    return (f"error: lost another process of this run ({detail or 'reported by JAX'}; {e!r} "
            "while composing this message); run the same command on every host to resume "
            "from the last checkpoint.")


def message(detail: str | None, status: str | None = None) -> str:
  """The line: which process was lost (if known), why, each run's last checkpoint, and that the
  same command on every host resumes it. ``status``: what JAX's distributed service said (from
  its abort dump), read only for the lost process."""
  me, count = _job
  lost = _lost_process("\n".join(t for t in (detail, status) if t) or None, me, count)
  who = (f"process {lost}{' (the coordinator)' if lost == 0 else ''}" if lost is not None
         else "a process")
  why = _short(detail) if detail else "reported by JAX's distributed service"
  run = f"this {count}-process run" if count else "this run"
  return f"error: lost {who} of {run} ({why}); {_checkpoints_text()}."


def _lost_process(detail: str | None, me: int | None, count: int | None) -> int | None:
  """The lost process's index, where ``detail`` or the job's size tells it: the one a heartbeat
  timeout names, process 0 when the coordinator is unreachable, the other one of two."""
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
  if count == 2 and me is not None:
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
  saved = sorted({s for s in steps.values() if s is not None})
  if not saved:
    where = f" in {next(iter(steps))}" if len(steps) == 1 else ""
    return f"no checkpoint was saved yet{where}: run the same command on every host to start again"
  if len(steps) == 1:
    return f"the last checkpoint is step {saved[0]} in {next(iter(steps))}: {resume}"
  if len(saved) == 1 and None not in steps.values():
    return f"the last checkpoint of each of the {len(steps)} runs is step {saved[0]}: {resume}"
  return (f"the {len(steps)} runs' last checkpoints are at steps "
          f"{', '.join(map(str, saved))}: run the same command on every host to resume them")


def _last_step(directory: str) -> int | None:
  """The newest complete checkpoint in ``directory`` (one still being written is a
  ``*.orbax-checkpoint-tmp*`` folder)."""
  try:
    names = os.listdir(directory)
  except OSError:
    return None
  return max((int(n) for n in names if n.isdigit()), default=None)


# --- The supervising parent and its child ----------------------------------------------

def supervise(process_id: int | None = None, num_processes: int | None = None) -> None:
  """In the command's own process: runs its command line again as a child process (the module
  docstring), and ends as the child ended; never returns. In that child: connects to the parent
  and returns. ``process_id``, ``num_processes``: the job, where the command line gives it (else
  the child tells it)."""
  global _parent
  if _parent is not None:
    return  # Connected already.
  fd = os.environ.pop(CHILD_ENV, None)
  if fd is not None:
    _parent = socket.socket(fileno=int(fd))
    threading.Thread(target=_die_with_the_parent, name="capsjax-parent", daemon=True).start()
    return
  if sys.executable:  # Else no interpreter to run the child: unsupervised, as JAX leaves it.
    _end_as(_Supervisor((process_id, num_processes)).run())


def _tell(**note) -> bool:
  """Sends ``note`` to the parent (in a supervised child); whether it was sent."""
  if _parent is None:
    return False
  try:
    _parent.sendall((json.dumps(note) + "\n").encode())
  except OSError:
    return False
  return True


def _die_with_the_parent() -> None:
  """The child's watch on its parent: the parent never writes, so the socket reads nothing
  until the parent is gone (killed: its end closed). Then this process is killed as it was."""
  with contextlib.suppress(OSError):
    while _parent.recv(4096):
      pass
  os.kill(os.getpid(), signal.SIGKILL)


# JAX's abort on a fatal error of its distributed service (jaxlib's client.h), after absl's
# prefix (F, the date and time, the thread, the source line).
_ABORT = b"Terminating process because the JAX distributed service detected fatal errors"
_ABSL_FATAL = re.compile(rb"F\d{4} [^\n\r\]]*\] ")
_ABORT_LINE = re.compile(rb"(?:" + _ABSL_FATAL.pattern + rb")?" + re.escape(_ABORT))
_STATUS = re.compile(rb"absl::Status: (.*?)(?:\n\*\*\* Check failure|\Z)", re.DOTALL)


def _may_begin_abort(text: bytes) -> bool:
  """Whether ``text``, the end of what was read, may be the start of JAX's abort line."""
  if re.fullmatch(rb"F\d{0,4}(?: [^\n\r\]]*)?", text):
    return True
  prefix = _ABSL_FATAL.match(text)
  return _ABORT.startswith(text[prefix.end():] if prefix else text)


class _AbortDump:
  """The child's stderr, as read: what to pass on, and JAX's abort dump held back (from its
  line to the end: the stack trace, and whatever the child's other threads print meanwhile)."""

  def __init__(self):
    self.pending = b""  # The end of what was read that may begin the abort line.
    self.held: bytes | None = None  # From the abort line on, once it came.

  def feed(self, data: bytes) -> bytes:
    """What of ``data`` to pass on now."""
    if self.held is not None:
      self.held += data
      return b""
    text, self.pending = self.pending + data, b""
    if found := _ABORT_LINE.search(text):
      self.held = text[found.start():]
      return text[:found.start()]
    line_start = max(text.rfind(b"\n"), text.rfind(b"\r")) + 1
    # The abort line's start, its prefix and text, is shorter than 400 bytes.
    for k in range(max(line_start, len(text) - 400), len(text)):
      if text[k] in b"FT" and _may_begin_abort(text[k:]):
        self.pending = text[k:]
        return text[:k]
    return text

  def status(self) -> str | None:
    """The status JAX's abort gave, once the dump came."""
    found = _STATUS.search(self.held or b"")
    return found.group(1).decode(errors="replace").strip() if found else None


class _Supervisor:
  """Runs the child and follows it (:func:`supervise`)."""

  def __init__(self, job: tuple[int | None, int | None]):
    self.job = job
    self.notes = b""  # A partial line of the child's notes.
    self.lost: list[str | None] = []  # Details of a loss the child reported.
    self.last_byte = b"\n"  # Of what this process wrote to its stderr.

  def run(self) -> int:
    """The child's exit status (negative: the signal that ended it), or :data:`EXIT_STATUS`
    after the line."""
    global _job
    _job = self.job
    mine, theirs = socket.socketpair()
    if os.isatty(2):  # A terminal's stderr: a pseudo-terminal, passing bytes as they are.
      errors, child_errors = pty.openpty()
      tty.setraw(child_errors)
    else:
      errors, child_errors = os.pipe()
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
    child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], stderr=child_errors,
                             env={**os.environ, CHILD_ENV: str(theirs.fileno())},
                             pass_fds=(theirs.fileno(),))
    os.close(child_errors)
    theirs.close()
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, lambda signum, frame: child.send_signal(signum))
    dump = _AbortDump()
    with selectors.DefaultSelector() as selector:
      selector.register(errors, selectors.EVENT_READ)
      selector.register(mine, selectors.EVENT_READ)
      while True:
        ready = selector.select(timeout=1.0)
        if not ready and child.poll() is not None:
          break  # Ended; a process it started may still hold its stderr.
        if any(key.fileobj is mine for key, _ in ready) and not self._read_notes(mine):
          selector.unregister(mine)
        if any(key.fileobj == errors for key, _ in ready):
          data = b""
          with contextlib.suppress(OSError):  # At its end, a pseudo-terminal says EIO.
            data = os.read(errors, 65536)
          if not data:
            break
          self._write(dump.feed(data))
    os.close(errors)
    status = child.wait()
    mine.setblocking(False)
    while self._read_notes(mine):
      pass
    mine.close()
    if (self.lost and status == EXIT_STATUS) or (
        dump.held is not None and status in (-signal.SIGABRT, 128 + signal.SIGABRT)):
      self._write(b"" if self.last_byte == b"\n" else b"\n")
      self._write(_line(self.lost[0] if self.lost else None, dump.status()).encode() + b"\n")
      return EXIT_STATUS
    self._write(dump.pending + (dump.held or b""))
    return status

  def _read_notes(self, connection: socket.socket) -> bool:
    """Takes in the child's notes that arrived; False at their end."""
    global _job
    try:
      data = connection.recv(65536)
    except BlockingIOError:
      return False
    except OSError:
      data = b""
    self.notes += data
    *lines, self.notes = self.notes.split(b"\n")
    for line in lines:
      try:
        note = json.loads(line)
      except ValueError:
        continue
      if "watch" in note:
        watch_checkpoints(note["watch"])
      elif "forget" in note:
        forget_checkpoints(note["forget"])
      elif "job" in note:
        _job = tuple(note["job"])
      elif "lost" in note:
        self.lost.append(note["lost"])
    return bool(data)

  def _write(self, data: bytes) -> None:
    while data:
      try:
        written = os.write(2, data)
      except InterruptedError:
        continue
      except OSError:
        return  # No stderr left to write to.
      self.last_byte = data[written - 1:written]
      data = data[written:]


def _end_as(status: int) -> None:
  """Ends this process with the child's exit status, or by the signal that ended it."""
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  if status < 0:
    with contextlib.suppress(Exception):  # The child dumped its core, where it was to.
      resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with contextlib.suppress(Exception):
      signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
    status = 128 - status  # A signal that does not end a process, ignored here.
  sys.exit(status)
