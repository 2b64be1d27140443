"""preemption: signals become a stop request; handlers come and go with watch()."""

import os
import signal

import pytest

from capsjax.runs import preemption


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_watch_is_a_request_not_a_death(signum, capsys):
  before = signal.getsignal(signum)
  with preemption.watch() as stop:
    assert not stop.due(5) and not stop.distributed
    os.kill(os.getpid(), signum)
    assert stop.due(6) and stop.signal_name == signal.Signals(signum).name
    stop.saving = True
    os.kill(os.getpid(), signum)  # A second one is reported, not obeyed.
    with preemption.watch() as inner:  # Nested (a sweep around a run): the same request.
      assert inner is stop
  assert signal.getsignal(signum) is before
  err = capsys.readouterr().err
  assert "received: finishing the current step" in err and "again: still saving" in err


def test_exit_status_is_128_plus_the_signal():
  assert preemption.Preempted("x", "SIGTERM").exit_status == 143
  assert preemption.Preempted("x", "SIGINT").exit_status == 130
