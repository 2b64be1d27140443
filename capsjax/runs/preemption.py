"""SIGTERM and SIGINT as a request to stop cleanly at a step every process agrees on.

Schedulers (SLURM time limits, preemptible TPU VMs, Kubernetes) send SIGTERM and allow a grace
period; Ctrl-C sends SIGINT. Inside :func:`watch`, either signal no longer kills the process: the
train loop asks :meth:`StopRequest.due` after every dispatch, finishes the step it is in, saves a
checkpoint of it and raises :class:`Preempted`, which the command lines turn into exit status
128 + the signal's number (143 for SIGTERM, 130 for SIGINT), as if the signal had ended the
process, so a scheduler's requeue rules apply (docs/training.md: "Preemption and Ctrl-C").

One process: Python handlers record the signal; a second signal while saving is reported and
ignored, so the save completes. Several processes (``jax.distributed``): JAX's preemption service
owns SIGTERM and agrees on the step with
:func:`jax.experimental.multihost_utils.reached_preemption_sync_point`, so every process saves
the same step; SIGINT is passed on to it as SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

EXIT_STATUS = {"SIGTERM": 128 + signal.SIGTERM, "SIGINT": 128 + signal.SIGINT}


class Preempted(Exception):
  """The run stopped on a signal after saving; ``exit_status`` is what to exit with."""

  def __init__(self, message: str, signal_name: str):
    super().__init__(message)
    self.signal_name = signal_name
    self.exit_status = EXIT_STATUS[signal_name]


def _preemption_service_active() -> bool:
  """Whether jax.distributed started JAX's preemption service (it then owns SIGTERM):
  ``jax.distributed.initialize`` starts it unless ``jax_enable_preemption_service`` is off."""
  import jax

  return bool(jax.distributed.is_initialized() and jax.config.jax_enable_preemption_service)


class StopRequest:
  """Records SIGTERM/SIGINT while installed; see the module docstring."""

  def __init__(self):
    self.signal_name: str | None = None
    self.saving = False
    self.distributed = _preemption_service_active()
    self._previous: dict[int, object] = {}

  def install(self) -> None:
    for signum in [signal.SIGINT] if self.distributed else [signal.SIGTERM, signal.SIGINT]:
      self._previous[signum] = signal.signal(signum, self._handle)

  def uninstall(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    name = signal.Signals(signum).name
    if self.distributed:  # Let JAX's preemption service agree on the step with the others.
      self.signal_name = self.signal_name or name
      os.kill(os.getpid(), signal.SIGTERM)
      return
    if self.signal_name is None:
      self.signal_name = name
      print(f"\n{name} received: finishing the current step, then saving a checkpoint "
            "(send it again to be told where things stand).", file=sys.stderr, flush=True)
    else:
      what = "saving the checkpoint" if self.saving else "finishing the current step"
      print(f"{name} again: still {what}; it will exit when the checkpoint is complete "
            "(kill -9 abandons it, and the previous checkpoint stays intact).",
            file=sys.stderr, flush=True)

  def due(self, step: int) -> bool:
    """Called by every process after every dispatch, with the step reached: whether to
    save and stop now."""
    if self.distributed:
      from jax.experimental import multihost_utils

      if multihost_utils.reached_preemption_sync_point(step):
        self.signal_name = self.signal_name or "SIGTERM"
        return True
      return False
    return self.signal_name is not None


_current: StopRequest | None = None
_lock = threading.Lock()


@contextlib.contextmanager
def watch():
  """Installs the handlers for the duration (nested uses share the outer request)."""
  global _current
  with _lock:
    outer = _current
    if outer is None and threading.current_thread() is threading.main_thread():
      _current = StopRequest()
      _current.install()
    request = _current or StopRequest()  # Off the main thread: signals cannot be caught.
  try:
    yield request
  finally:
    if outer is None and _current is request:
      with _lock:
        request.uninstall()
        _current = None
