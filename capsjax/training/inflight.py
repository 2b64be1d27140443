"""A bound on the dispatches in flight: :class:`Window`.

Why: XLA:CPU's collectives between the devices of one process (``JAX_NUM_CPU_DEVICES`` > 1)
deadlock when many executions of a multi-device program are queued, and after 60 s of
waiting (``--xla_cpu_collective_call_warn_stuck_seconds`` 20 plus
``--xla_cpu_collective_call_terminate_timeout_seconds`` 40) XLA aborts the process ("Termination
timeout for `all reduce ...` exceeded ... Expected 4 threads to join the rendezvous, but only
3 of them arrived on time"). Measured here (jax 0.10.2, 2 cores; a jitted ``shard_map`` of
three ``x @ w``, ``pmean`` rounds over 2 or 4 devices, dispatched 1,000 times in a row): with
every dispatch waited for, or every 2nd, 3rd, 5th or 10th, all finished; with every 50th, or
none, the process aborted within the first few hundred; ``gdb`` then showed three devices'
threads waiting in ``InProcessCommunicator::AllReduce`` and the Python thread blocked inside
``PjRtLoadedExecutable::Execute`` launching the next program. Waiting for the dispatch before
last keeps one queued behind the one running, so an accelerator never idles for it.
"""

from __future__ import annotations

import collections

import jax


class Window:
  """Keeps at most ``depth`` dispatches in flight: :meth:`add` each one's outputs (arrays that
  are not donated to a later dispatch, e.g. its metrics); it waits for the oldest when there
  are more."""

  def __init__(self, depth: int = 2):
    if depth < 1:
      raise ValueError(f"depth must be >= 1, got {depth}.")
    self.depth = depth
    self._pending: collections.deque = collections.deque()

  def add(self, outputs) -> None:
    self._pending.append(outputs)
    while len(self._pending) > self.depth:
      jax.block_until_ready(self._pending.popleft())
