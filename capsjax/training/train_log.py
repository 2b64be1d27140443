"""The train loop's log: per-step metrics fetched at log points, timing, the progress line,
metrics.jsonl and TensorBoard (written by process 0), the stop on a non-finite loss and the
model's watches (e.g. the saturation warning)."""

from __future__ import annotations

import time

import jax
import numpy as np

from capsjax.common.errors import NonFiniteLossError
from capsjax.runs import reporting
from capsjax.training.budget import Budget


class TrainLog:
  """One run's train log (the module docstring)."""

  def __init__(self, workdir: str, budget: Budget, schedule, ckpt, watches=(),
               label: str | None = None):
    """``watches``: objects with ``update(steps, metrics) -> warning or None`` (the model's
    ``monitors``, e.g. :class:`capsjax.models.saturation_watch.SaturationWatch`); ``label``: the
    run's name on its progress lines (runs trained together)."""
    self.budget, self.schedule, self.ckpt, self.watches = budget, schedule, ckpt, list(watches)
    is_main = jax.process_index() == 0
    self.writer = reporting.MetricWriter(workdir) if is_main else None
    self.bar = reporting.ProgressBar(budget.num_steps, label=label) if is_main else None
    self.pending: list[tuple[int, dict]] = []   # (first step, stacked metrics) not yet fetched.
    # Fetched at a checkpoint that was not a log point: logged with the next log point's, so a
    # logged mean is over every step since the last log, however often the run checkpoints.
    self.unwritten: list[dict] = []
    self.seconds, self.steps_timed = 0.0, 0
    self.timer_start, self.timer_step = None, 0

  def add(self, step: int, metrics: dict, state) -> None:
    """Metrics of the dispatch that started at ``step`` (the first compiles: time from its end)."""
    self.pending.append((step, metrics))
    if self.timer_start is None:
      jax.block_until_ready(state)
      self.timer_start = time.perf_counter()
      self.timer_step = step + len(np.asarray(metrics["loss"]))

  def images_per_second(self) -> float | None:
    return self.steps_timed * self.budget.batch_size / self.seconds if self.seconds > 0 else None

  def flush(self, step: int, write: bool) -> None:
    """Fetches the pending metrics, stops on a non-finite loss, and (``write``) logs their mean."""
    if not self.pending:
      return
    steps_, host = _host_metrics(self.pending)
    self.pending = []
    self.unwritten.append(host)
    bad = np.flatnonzero(~np.isfinite(host["loss"]))  # The rows whose loss is not finite.
    if bad.size:
      self.ckpt.wait()
      good = self.ckpt.latest_step()
      raise NonFiniteLossError(
          f"The training loss became non-finite at step {steps_[bad[0]]}. Nothing after step "
          f"{good if good is not None else 0} was saved; the last good checkpoint is "
          f"{'step ' + str(good) if good is not None else 'none'} in {self.ckpt.directory}. "
          "Lower config.optimizer.learning_rate or check the data, then rerun to resume.")
    if step > self.timer_step:
      self.seconds += time.perf_counter() - self.timer_start
      self.steps_timed += step - self.timer_step
      self.timer_start, self.timer_step = time.perf_counter(), step
    for watch in self.watches:
      warning = watch.update(steps_, host)
      if warning and self.bar is not None:
        self.bar.message(warning)
    rate = self.images_per_second() or float("nan")
    if not write:
      return
    means = {k: np.mean(np.concatenate([part[k] for part in self.unwritten]), axis=0).tolist()
             for k in self.unwritten[0]}
    self.unwritten = []
    if self.writer is not None:
      # No rate until a step after the compiling one is timed (e.g. the first log of a resumed
      # run): the key is left out rather than logged as NaN.
      timing = {"images_per_second": rate} if rate == rate else {}
      self.writer.write("train", step, {**means, **timing,
                                        "learning_rate": float(self.schedule(step))})
      self.bar.update(step, means["loss"], means.get("accuracy", float("nan")), rate,
                      self.budget.batch_size / rate if rate == rate and rate > 0 else float("nan"))
      self.writer.flush()

  def evaluation(self, name: str, step: int, metrics: dict) -> None:
    if self.writer is not None:
      self.writer.write(name, step, metrics)
      self.bar.message(f"step {step}: {name} accuracy {100 * metrics['accuracy']:.2f}%"
                       + (f", loss {metrics['loss']:.4f}" if "loss" in metrics else "")
                       + (f" (on {metrics['examples']:,} of its examples)"
                          if "examples" in metrics else ""))
      self.writer.flush()

  def restart_timer(self, step: int) -> None:
    """Evaluation and checkpointing since the last flush do not count as training time."""
    self.timer_start, self.timer_step = time.perf_counter(), step

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.writer.close()


def _host_metrics(pending: list[tuple[int, dict]]) -> tuple[np.ndarray, dict]:
  """The steps (1-based: step n's metrics are of the parameters before update n) and the pending
  train metrics on the host, one row per step."""
  steps_ = np.concatenate([start + 1 + np.arange(len(np.asarray(m["loss"])))
                           for start, m in pending])
  host = {k: np.concatenate([np.asarray(m[k]) for _, m in pending]) for k in pending[0][1]}
  return steps_, host
