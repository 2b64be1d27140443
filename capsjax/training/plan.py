"""A run's step arithmetic: how many steps, and at which steps to log, evaluate and checkpoint."""

from __future__ import annotations

import dataclasses

import ml_collections

from capsjax.common import checks, config_keys
from capsjax.common.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Plan:
  """The steps of a run (``config.train``) over ``num_train`` training examples.

  An epoch is ``num_train // batch_size`` steps (the last partial batch is dropped, as the
  epoch permutation does). Logging, evaluation and checkpointing fall on multiples of their
  intervals and on the last step; an evaluation is always checkpointed (so a best checkpoint
  can be kept). ``eval_every_steps = 0`` evaluates at the end of each epoch.
  """
  num_train: int
  batch_size: int
  steps_per_epoch: int
  num_steps: int
  log_every: int
  eval_every: int
  checkpoint_every: int
  steps_per_dispatch: int

  @classmethod
  def from_config(cls, t: ml_collections.ConfigDict, num_train: int) -> "Plan":
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
    """The data position (and the accuracy the run watches: validation, else test) a
    checkpoint records."""
    meta = {"step": step, "epoch": step // self.steps_per_epoch,
            "position_in_epoch": step % self.steps_per_epoch, "num_train": self.num_train,
            "batch_size": self.batch_size}
    if selection_accuracy is not None:
      meta["selection_accuracy"] = selection_accuracy
    return meta


def validate_train_config(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Raises UsageError, naming the key, for ``config.train`` and ``config.eval`` settings that
  cannot run on ``num_devices`` devices."""
  t = config.train
  for key in ("batch_size", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints",
              "steps_per_dispatch"):
    checks.count(t[key], f"config.train.{key}", minimum=1)
  if t.num_steps is not None and t.num_steps < 0:
    raise UsageError(f"config.train.num_steps must be >= 0, got {t.num_steps}.")
  if t.num_steps is None and t.num_epochs < 0:
    raise UsageError(f"config.train.num_epochs must be >= 0, got {t.num_epochs}.")
  if t.eval_every_steps < 0:
    raise UsageError(f"config.train.eval_every_steps must be >= 0, got {t.eval_every_steps}.")
  for key in ("train_limit", "test_limit", "validation_size"):
    if key in (config.get("data") or {}):
      checks.count(config.data[key], f"config.data.{key}")
  checks.count(config.eval.batch_size, "config.eval.batch_size", minimum=1)
  checks.count(config_keys.optional(config.eval, "eval.num_figure_examples"),
               "config.eval.num_figure_examples")
  target = t.get("stop_at_accuracy")
  if target is not None and not 0.0 < target <= 1.0:
    raise UsageError(f"config.train.stop_at_accuracy must be in (0, 1] (a fraction, e.g. "
                     f"0.99), got {target!r}.")
  for key, value in (("config.train.batch_size", t.batch_size),
                     ("config.eval.batch_size", config.eval.batch_size)):
    if value % num_devices:
      raise UsageError(f"{key}={value} is not divisible by the {num_devices} devices of this "
                       f"job; use a multiple of {num_devices}, e.g. "
                       f"{max(num_devices, value // num_devices * num_devices)}.")
