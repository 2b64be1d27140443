"""Orbax checkpoints in ``WORKDIR/checkpoints``: save, keep latest + best, resume.

A checkpoint holds two items:
  * ``state``: the train state pytree (parameters, optimiser state, step, RNG);
  * ``meta``: JSON with the data position (epoch, position in epoch) and the
    evaluation metrics at save time.

Saving is asynchronous; a process killed mid-save leaves a temporary folder
that orbax ignores, and the previous complete checkpoint restores.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

BEST_METRIC = "accuracy"


class Checkpointer:
  """Keeps the ``keep`` latest checkpoints and the best one by ``accuracy``."""

  def __init__(self, directory: str, keep: int = 3):
    self.directory = os.path.abspath(directory)
    policy = checkpoint_managers.AnyPreservationPolicy([
        checkpoint_managers.LatestN(n=max(1, keep)),
        checkpoint_managers.BestN(get_metric_fn=lambda m: m[BEST_METRIC], n=1,
                                  keep_checkpoints_without_metrics=False),
    ])
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(preservation_policy=policy, create=True),
        item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def best_step(self) -> int | None:
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

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """Restores ``step`` into the structure and shardings of ``abstract_state``."""
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      meta=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["meta"])

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
