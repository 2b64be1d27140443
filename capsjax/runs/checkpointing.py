"""Orbax checkpoints in ``WORKDIR/checkpoints``: save, keep latest + best, resume.

A checkpoint holds two items:
  * ``state``: the train state pytree (parameters, optimiser state, step, RNG);
  * ``meta``: JSON with the data position (epoch, position in epoch) and the
    evaluation metrics at save time.

Saving is asynchronous; a process killed mid-save leaves a temporary folder
that orbax ignores, and the previous complete checkpoint restores. A
checkpoint damaged after it was written (truncated files after a crash or a
full disk) is found when it fails to restore: :meth:`Checkpointer.restore_newest`
then says which and why, and falls back to the newest one that restores.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import logging
import os
import re
import sys
import time
from typing import Any, Callable, Sequence

import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from capsjax.common.errors import UsageError

BEST_METRIC = "accuracy"
DAMAGED_DIR = "damaged_checkpoints"  # Beside checkpoints/, in the workdir.


# What TensorStore's orphaned read completions print (see _tensorstore_noise_dropped).
_NOISE = re.compile(r"Traceback \(most recent call last\):|File \"[^\"]*asyncio/base_events\.py\", "
                    r"line \d+, in \w+|self\._check_closed\(\)|raise RuntimeError\('Event loop is "
                    r"closed'\)|RuntimeError|Event loop is closed|[:\s]")


@contextlib.contextmanager
def _tensorstore_noise_dropped(settle_seconds: float = 0.5):
  """Keeps stderr clean when a damaged checkpoint fails to restore.

  Orbax reads the arrays concurrently; when one read fails, its event loop closes while the
  other TensorStore reads are in flight, and each of their completions then prints a
  traceback ("RuntimeError: Event loop is closed") from a TensorStore thread. Those say
  nothing the warning does not. Every other line written to stderr meanwhile is passed on.
  """
  captured, real = io.StringIO(), sys.stderr
  sys.stderr = captured
  try:
    yield
  except BaseException:
    time.sleep(settle_seconds)  # Let the in-flight reads finish and print.
    raise
  finally:
    sys.stderr = real
    kept = [line for line in captured.getvalue().splitlines(keepends=True)
            if _NOISE.sub("", line)]
    real.write("".join(kept))


class _OrphanedReadFailures(logging.Filter):
  """Drops asyncio's "Task exception was never retrieved" for Orbax's array reads.

  When a damaged checkpoint fails to restore, the reads that failed after the first one are
  never awaited; asyncio logs each with a traceback when it is garbage collected, which may
  be long after the restore (even at exit). They repeat the warning already given.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.startswith("Task exception was never retrieved")
                and "async_deserialize" in message)


_ORPHANED_READ_FILTER = _OrphanedReadFailures()


class Checkpointer:
  """Keeps the ``keep`` latest checkpoints and, with ``keep_best``, the best one by the
  ``accuracy`` its save was given (the validation accuracy: runs without a validation split
  keep no best checkpoint, so that none is chosen on the test set)."""

  def __init__(self, directory: str, keep: int = 3, keep_best: bool = True):
    self.directory = os.path.abspath(directory)
    policies = [checkpoint_managers.LatestN(n=max(1, keep))]
    if keep_best:
      policies.append(checkpoint_managers.BestN(get_metric_fn=lambda m: m[BEST_METRIC], n=1,
                                                keep_checkpoints_without_metrics=False))
    policy = checkpoint_managers.AnyPreservationPolicy(policies)
    # best_fn makes Orbax write the metrics and rank by them (best_step); the policy decides
    # what is kept (with best_fn alone, max_to_keep could delete the newest checkpoint).
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            preservation_policy=policy, create=True, best_mode="max",
            best_fn=(lambda m: m[BEST_METRIC]) if keep_best else None),
        item_names=("state", "meta"))
    self.keep_best = keep_best

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """The step of the best checkpoint by validation accuracy; None without ``keep_best`` or
    before any checkpoint was saved with one."""
    if not self.keep_best:
      return None
    return self._manager.best_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: dict, metrics: dict | None = None) -> None:
    """Saves asynchronously; ``metrics[BEST_METRIC]`` ranks it for the best one."""
    self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                meta=ocp.args.JsonSave(meta)),
        metrics=metrics or None, force=True)

  def restore(self, step: int, abstract_state: Any,
              older_forms: Sequence[tuple[Any, Callable]] = ()) -> tuple[Any, dict]:
    """Restores ``step`` into the structure and shardings of ``abstract_state``.

    ``older_forms``: ``[(abstract, upgrade)]``, earlier layouts of the state (e.g. before a
    field was added); a checkpoint whose tree does not match ``abstract_state`` is restored into
    the first that matches and passed through its ``upgrade``."""
    try:
      return self._restore(step, abstract_state)
    except ValueError as e:
      if "tree structures do not match" not in str(e):
        raise
      for abstract, upgrade in older_forms:
        try:
          state, meta = self._restore(step, abstract)
        except ValueError:
          continue
        return upgrade(state), meta
      raise

  def _restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      meta=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["meta"])

  def candidates(self, which: str) -> list[int]:
    """The checkpoints to try for ``which`` (``best``, ``latest`` or a step), in order: the one
    asked for, then (for best and latest) the others, newest first."""
    steps = sorted(self.all_steps(), reverse=True)
    if not steps:
      raise UsageError(f"No checkpoint in {self.directory}.")
    if which == "best":
      first = self.best_step()
      if first is None:
        raise UsageError(f"--checkpoint=best: no checkpoint in {self.directory} was ranked on "
                         "a validation split. Use --checkpoint=latest or a step number.")
      return [first] + [s for s in steps if s != first]
    if which == "latest":
      return steps
    if which.isdigit() and int(which) in steps:
      return [int(which)]
    raise UsageError(f"--checkpoint={which!r}: use 'best', 'latest' or one of the saved "
                     f"steps {sorted(steps)}.")

  def restore_newest(self, abstract_state: Any, log: Callable[[str], None] = print,
                     move_aside: bool = True, steps: list[int] | None = None,
                     older_forms: Sequence[tuple[Any, Callable]] = ()):
    """``(step, state, meta)`` of the newest checkpoint that restores (or the first of
    ``steps``, in their order), or None if there is none.

    Each newer one that fails is reported with the reason and, with ``move_aside``, moved
    to ``WORKDIR/damaged_checkpoints/`` (kept, never deleted) so that later runs and the
    keep-latest policy skip it. If checkpoints exist but none restores, nothing is moved
    and a UsageError names the directory and what to do.
    """
    steps = sorted(self.all_steps(), reverse=True) if steps is None else list(steps)
    failures = []
    for step in steps:
      try:
        with _tensorstore_noise_dropped():
          state, meta = self.restore(step, abstract_state, older_forms)
      except Exception as e:  # Orbax and TensorStore raise many types for damaged files.
        logging.getLogger("asyncio").addFilter(_ORPHANED_READ_FILTER)  # Idempotent.
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        failures.append((step, reason))
        log(f"Warning: the checkpoint at step {step} in {self.directory} cannot be restored "
            f"({reason}).")
        continue
      for bad_step, _ in failures:
        if move_aside:
          log(f"Moved the damaged checkpoint of step {bad_step} to "
              f"{self.move_aside(bad_step)}; resuming from step {step} instead.")
        else:
          log(f"Using the checkpoint at step {step} instead.")
      return step, state, meta
    if failures:
      listed = "; ".join(f"step {s}: {r}" for s, r in failures)
      raise UsageError(f"None of the checkpoints in {self.directory} can be restored ({listed}). "
                       "They are left as they are. To start this run over, move that folder "
                       "away (or use a new --workdir); to recover, restore it from a backup.")
    return None

  def move_aside(self, step: int) -> str:
    """Moves checkpoint ``step`` out of the manager's sight; returns where it went."""
    aside = os.path.join(os.path.dirname(self.directory), DAMAGED_DIR)
    os.makedirs(aside, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = os.path.join(aside, f"{step}-{stamp}")
    os.replace(os.path.join(self.directory, str(step)), target)
    self._manager.reload()
    return target

  def reload(self) -> None:
    """Re-reads the directory (after another process moved a checkpoint aside)."""
    self._manager.reload()

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
