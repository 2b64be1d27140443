"""A run's step arithmetic: how many steps, and at which steps to log, evaluate and checkpoint."""

from __future__ import annotations

import dataclasses

import ml_collections

from capsjax.config import run_settings
from capsjax.common.errors import UsageError

SETTINGS = run_settings.BUDGET  # config.train's length and cadence.


@dataclasses.dataclass(frozen=True)
class Budget:
  """The steps of a run (``config.train``) over ``num_train`` training examples: an epoch is
  ``num_train // batch_size`` steps (the last partial batch is dropped, as the epoch permutation
  does). Logging, evaluation and checkpointing fall on multiples of their intervals and on the
  last step; an evaluation is always checkpointed (so a best checkpoint can be kept).
  ``eval_every_steps = 0`` evaluates at the end of each epoch."""
  num_train: int
  batch_size: int
  steps_per_epoch: int
  num_steps: int
  log_every: int
  eval_every: int
  checkpoint_every: int
  steps_per_dispatch: int

  @classmethod
  def from_config(cls, t: ml_collections.ConfigDict, num_train: int) -> "Budget":
    """``t`` is ``config.train``; ``num_steps`` (if set) wins over ``num_epochs``."""
    steps_per_epoch = num_train // t.batch_size
    if steps_per_epoch == 0:
      raise UsageError(f"config.train.batch_size={t.batch_size} is larger than the "
                       f"{num_train} training examples.")
    num_steps = t.num_steps if t.num_steps is not None else t.num_epochs * steps_per_epoch
    return cls(num_train, t.batch_size, steps_per_epoch, num_steps, t.log_every_steps,
               t.eval_every_steps or steps_per_epoch, t.checkpoint_every_steps,
               t.steps_per_dispatch)

  def next_dispatch(self, step: int) -> int:
    """Steps to run in the next dispatch: up to the next log/eval/checkpoint boundary."""
    boundary = min(self.num_steps, *((step // k + 1) * k for k in
                                     (self.log_every, self.eval_every, self.checkpoint_every)))
    return min(self.steps_per_dispatch, boundary - step)

  def log_due(self, step: int) -> bool:
    return step % self.log_every == 0 or step == self.num_steps

  def eval_due(self, step: int) -> bool:
    return step % self.eval_every == 0 or step == self.num_steps

  def checkpoint_due(self, step: int) -> bool:
    return step % self.checkpoint_every == 0 or self.eval_due(step)

  def meta(self, step: int, selection_accuracy: float | None) -> dict:
    """The data position a checkpoint records (and the accuracy watched: validation, else test)."""
    meta = {"step": step, "epoch": step // self.steps_per_epoch,
            "position_in_epoch": step % self.steps_per_epoch, "num_train": self.num_train,
            "batch_size": self.batch_size}
    if selection_accuracy is not None:
      meta["selection_accuracy"] = selection_accuracy
    return meta


def validate_train_config(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Raises UsageError, naming the key, for batch sizes that cannot be split over
  ``num_devices`` devices (each setting's own range is checked when the config is resolved:
  :func:`capsjax.config.schema.resolve_config`)."""
  t = config.train
  for key, value in (("config.train.batch_size", t.batch_size),
                     ("config.eval.batch_size", config.eval.batch_size)):
    if value % num_devices:
      raise UsageError(f"{key}={value} is not divisible by the {num_devices} devices of this "
                       f"job; use a multiple of {num_devices}, e.g. "
                       f"{max(num_devices, value // num_devices * num_devices)}.")
