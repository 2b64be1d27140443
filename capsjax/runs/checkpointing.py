"""Orbax checkpoints in ``WORKDIR/checkpoints``: save, keep latest + best, resume.

A checkpoint holds two items:
  * ``state``: the train state pytree (parameters, optimiser state, step, RNG);
  * ``meta``: JSON with the data position (epoch, position in epoch) and the evaluation metrics
    at save time.

Saving is asynchronous; a process killed mid-save leaves a temporary folder that orbax ignores,
and the previous complete checkpoint restores. A save that fails to write (a full disk, a
read-only folder) fails in Orbax's background threads: it is raised at the next save or wait
(:meth:`Checkpointer.wait`), the tracebacks Orbax logs for it dropped, and its temporary folder
removed when the run resumes (``tidy``). A checkpoint damaged after it was written (truncated
files after a crash or a full disk) is found when it fails to restore
(:meth:`Checkpointer.restore_newest`).
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

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from capsjax.common import files
from capsjax.common.errors import UsageError

BEST_METRIC = "accuracy"
DAMAGED_DIR = "damaged_checkpoints"  # Beside checkpoints/, in the workdir.


# What TensorStore's orphaned read completions print (see _tensorstore_noise_dropped).
_NOISE = re.compile(r"Traceback \(most recent call last\):|File \"[^\"]*asyncio/base_events\.py\", "
                    r"line \d+, in \w+|self\._check_closed\(\)|raise RuntimeError\('Event loop is "
                    r"closed'\)|RuntimeError|Event loop is closed|[:\s]")


@contextlib.contextmanager
def _tensorstore_noise_dropped(settle_seconds: float = 0.5):
  """Keeps stderr clean when a damaged checkpoint fails to restore, or a save to write.

  Orbax reads (and writes) the arrays concurrently; when one fails, its event loop closes while
  the other TensorStore operations are in flight, and each of their completions then prints a
  traceback ("RuntimeError: Event loop is closed") from a TensorStore thread. Those say nothing
  the one-line error does not. Every other line written to stderr meanwhile is passed on.
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


def _no_orphaned_read_failures(record: logging.LogRecord) -> bool:
  """A logging filter that drops asyncio's "Task exception was never retrieved" for Orbax's
  array reads.

  When a damaged checkpoint fails to restore, the reads that failed after the first one are never
  awaited; asyncio logs each with a traceback when it is garbage collected, which may be long
  after the restore (even at exit). They repeat the warning already given.
  """
  message = record.getMessage()
  return not (message.startswith("Task exception was never retrieved")
              and "async_deserialize" in message)


def _no_failed_writes(record: logging.LogRecord) -> bool:
  """A logging filter that drops what Orbax logs when a checkpoint's files cannot be written (a
  full disk, a read-only filesystem): each of its background threads logs the error with a
  traceback (four for one save), and the save's wait raises it, which :meth:`Checkpointer.wait`
  names in one line. Every other record passes."""
  error = record.exc_info[1] if record.exc_info else None
  return not ((error is not None and files.is_file_write_error(error))
              or files.is_file_write_error(RuntimeError(record.getMessage())))


def _no_replica_parallel_saves_on_the_cpu() -> ocp.handlers.CheckpointHandlerRegistry:
  """The handlers of a checkpoint's two items; on the CPU, each replicated array of the state
  is saved whole from its first replica.

  Orbax's default on the CPU (and TPU) is replica-parallel saving: every replica of a replicated
  array (the parameters, on each of the data-parallel devices) copies and writes a slice of it,
  which takes one small program per array and replica. The CPU's devices share one host memory, so
  there is nothing to split. What it saves: ``save`` then ``wait`` of the smoke model's fresh train
  state (1.5 MB in 39 arrays) on 4 CPU devices, thirty saves after two, the 2-core CPU shared with
  other work (2026-12-07, three runs of each, interleaved): at least 0.07-0.09 s whole (medians
  0.09-0.18 s), 0.10-0.14 s replica-parallel (medians 0.13-0.20 s), and the first save 0.1-0.2 s
  whole against 1.4-1.9 s replica-parallel, which compiles its slicing programs then; 0.10 s against
  0.22 s when first measured (2026-12-06). Orbax itself turns it off on GPUs; TPUs keep its default.

  Only Orbax's public API: the state is saved by a ``PyTreeCheckpointHandler`` given a type
  handler registry of its own, Orbax's standard handlers with an
  ``ArrayHandler(use_replica_parallel=False)`` for ``jax.Array`` (Orbax's global registry is
  left as it is, so nothing else changes and Orbax logs no warning of a replaced handler). It
  is restored by Orbax's ``StandardCheckpointHandler``: both handlers read and write the same
  files, so old checkpoints restore (tests/test_migrations.py). Only who writes changes, not
  what is written, but for the arrays' ``array_metadatas`` files, which that registry's
  ``ArrayHandler`` keeps none of (their one use, a typed PRNG key's implementation, does not
  arise: the state's keys are uint32 arrays)."""
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  if jax.default_backend() == "cpu":
    types = ocp.type_handlers
    whole = types.ArrayHandler(use_replica_parallel=False)
    saving = ocp.PyTreeCheckpointHandler(type_handler_registry=types.create_type_handler_registry(
        *[(t, whole if t is jax.Array else types.get_type_handler(t))
          for t in types.supported_types()]))
  else:
    saving = ocp.PyTreeCheckpointHandler()  # Orbax's global registry.
  registry.add("state", ocp.args.PyTreeSave, saving)
  registry.add("state", ocp.args.StandardRestore, ocp.StandardCheckpointHandler())
  json = ocp.JsonCheckpointHandler()
  registry.add("meta", ocp.args.JsonSave, json)
  registry.add("meta", ocp.args.JsonRestore, json)
  return registry


def _path(path) -> str:
  """A tree path as dotted names: ``params.class_capsules.weights`` (dict keys, attributes and
  indices alike, so that a checkpoint's metadata and the train state name an array the same)."""
  return ".".join(str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))
                  for key in path)


class Checkpointer:
  """Keeps the ``keep`` latest checkpoints and, with ``keep_best``, the best one by the
  ``accuracy`` its save was given (the validation accuracy: runs without a validation split
  keep no best checkpoint, so that none is chosen on the test set). ``tidy``: remove the
  temporary folders of saves that failed or were killed (a training run's, which holds the
  workdir: no save of another process is in flight)."""

  def __init__(self, directory: str, keep: int = 3, keep_best: bool = True,
               tidy: bool = False):
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
            cleanup_tmp_directories=tidy,
            best_fn=(lambda m: m[BEST_METRIC]) if keep_best else None),
        handler_registry=_no_replica_parallel_saves_on_the_cpu())
    self.keep_best = keep_best
    self._pending: int | None = None  # The step of a save that may still be writing.
    self._failed: BaseException | None = None  # Orbax raises it again at every later wait.
    logging.getLogger("absl").addFilter(_no_failed_writes)  # Orbax logs through absl.

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """The step of the best checkpoint by validation accuracy; None without ``keep_best`` or
    before any checkpoint was saved with one."""
    return self._manager.best_step() if self.keep_best else None

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: dict, metrics: dict | None = None) -> None:
    """Saves asynchronously; ``metrics[BEST_METRIC]`` ranks it for the best one. The save
    before, if still writing, is waited for first (Orbax would): a failed write of either is
    raised naming its step (:meth:`wait`)."""
    self.wait()
    with files.writing(self.path(step), f"the step-{step} checkpoint"):
      self._manager.save(
          step,
          args=ocp.args.Composite(state=ocp.args.PyTreeSave(state),
                                  meta=ocp.args.JsonSave(meta)),
          metrics=metrics or None, force=True)
    self._pending = step

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

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

    Each newer one that fails is reported with the reason and, with ``move_aside``, moved to
    ``WORKDIR/damaged_checkpoints/`` (kept, never deleted) so that later runs and the keep-latest
    policy skip it. If checkpoints exist but none restores, nothing is moved and a UsageError
    names the directory and what to do.
    """
    steps = sorted(self.all_steps(), reverse=True) if steps is None else list(steps)
    if steps:
      self._check_shapes(steps[0], abstract_state)
    failures = []
    for step in steps:
      try:
        with _tensorstore_noise_dropped():
          state, meta = self.restore(step, abstract_state, older_forms)
      except Exception as e:  # Orbax and TensorStore raise many types for damaged files.
        logging.getLogger("asyncio").addFilter(_no_orphaned_read_failures)  # Idempotent.
        reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
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

  def _check_shapes(self, step: int, abstract_state: Any) -> None:
    """UsageError naming an array whose shape in checkpoint ``step`` (read from its metadata,
    nothing restored) differs from ``abstract_state``'s: the config the state was built from
    is not the one the run trained with (config.json edited after the run, a size changed on
    the command line). A checkpoint whose metadata cannot be read is left to the restore,
    which reports it as damaged."""
    try:
      stored = self._manager.item_metadata(step)["state"]
    except (OSError, ValueError, KeyError, TypeError):
      return
    shapes = lambda tree: {_path(path): tuple(leaf.shape)
                           for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
                           if getattr(leaf, "shape", None) is not None}
    stored, wanted = shapes(stored), shapes(abstract_state)
    differ = [(path, stored[path], shape) for path, shape in wanted.items()
              if path in stored and stored[path] != shape]
    if differ:
      path, old, new = differ[0]
      more = f" (and {len(differ) - 1} more arrays)" if len(differ) > 1 else ""
      raise UsageError(
          f"The checkpoints in {self.directory} do not fit this config's model: {path} has "
          f"shape {old} in the step-{step} checkpoint but {new} here{more}. The settings "
          "changed since the run saved them (its config.json edited, or a size given on the "
          "command line): use the settings the run trained with, or a new --workdir.")

  def move_aside(self, step: int) -> str:
    """Moves checkpoint ``step`` out of the manager's sight; returns where it went."""
    aside = os.path.join(os.path.dirname(self.directory), DAMAGED_DIR)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = os.path.join(aside, f"{step}-{stamp}")
    with files.writing(target, f"the damaged checkpoint of step {step}, moved aside,"):
      os.makedirs(aside, exist_ok=True)
      os.replace(self.path(step), target)
    self._manager.reload()
    return target

  def reload(self) -> None:
    """Re-reads the directory (after another process moved a checkpoint aside)."""
    self._manager.reload()

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are on disk. A save that could not be written raises
    :class:`capsjax.common.files.DiskFull` or :class:`~capsjax.common.files.NotWritable` naming its
    step, once; the checkpoints before it are intact. Any other error surfaces unchanged."""
    step = self._pending
    try:
      with _tensorstore_noise_dropped():  # The failed save's other writes, completing late.
        self._manager.wait_until_finished()
    except Exception as e:
      if e is self._failed:
        return  # Raised at an earlier wait: Orbax keeps the failed save and raises it again.
      self._failed = e
      if step is None or files.write_error(e) is None:
        raise
      raise files.write_error(e, self.path(step), f"the step-{step} checkpoint",
                              then=self._rerun_text(step)) from e
    self._pending = None

  def _rerun_text(self, failed: int) -> str:
    """What a rerun does after the save of step ``failed`` failed."""
    steps = [s for s in self.all_steps() if s != failed]
    since = (f"the checkpoint of step {max(steps)}, the last complete one" if steps
             else "the start: no checkpoint was complete")
    return (f"the run resumes from {since}, and removes the failed save's partial files "
            f"({self.path(failed)}.orbax-checkpoint-tmp)")

  def close(self) -> None:
    """Waits for a save still writing (:meth:`wait`) and closes the manager."""
    self.wait()
    try:
      self._manager.close()
    except Exception as e:
      if e is not self._failed:  # Raised by an earlier wait already.
        raise
