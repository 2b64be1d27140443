"""Training and evaluation: ``train_and_evaluate(config, workdir)``.

The loop never names a dataset, model or loss: ``config.dataset`` picks the
dataset builder, ``config.model.name`` the model (which owns its loss and
metrics), ``config.evals`` the evaluations (see :mod:`capsjax.tasks`,
:mod:`capsjax.steps`, :mod:`capsjax.evaluators`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax import (checkpointing, evaluators, hardware, monitors, preemption, reporting,
                     run_figures, runconfig, steps, tasks, workdirs)
from capsjax.errors import NonFiniteLossError, UsageError


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains, evaluates, checkpoints to ``workdir`` and resumes from it.

  Holds ``workdir`` against other runs; SIGTERM or SIGINT saves the step reached and
  raises :class:`capsjax.preemption.Preempted`. Returns the summary that is also written to
  ``WORKDIR/summary.json``.
  """
  validate_config(config, jax.device_count())
  task = tasks.Task.from_config(config)  # The dataset builder and the model class.
  workdir = workdirs.prepare(workdir)
  with workdirs.hold(workdir), preemption.watch() as stop:
    splits = task.dataset.load()
    plan = Plan.from_config(config.train, len(splits["train"]))
    mesh = steps.make_mesh()
    replicated = NamedSharding(mesh, P())
    tx = steps.make_optimizer(config.optimizer)
    ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                      keep=config.train.keep_checkpoints)
    state, reached = init_or_restore(task, ckpt, plan, workdir, replicated)
    runner = evaluators.Runner(task.graphdef(), mesh, config.eval.batch_size)
    evals = evaluators.build_all(config, task.dataset, splits, runner, log=log)
    select = "validation" if "validation" in evals else "test"  # Best checkpoint, early stop.
    log(banner(config, plan, splits, evals, state.params, task.chance_levels()))
    log(hardware.describe())
    if warning := hardware.cpu_fallback_warning(jax.default_backend()):
      log(warning)

    examples, shared = evaluators.put_on_devices(splits["train"], replicated)
    train_step = steps.make_train_step(task, tx, plan.num_train, mesh)
    progress = TrainLog(workdir, plan, steps.make_schedule(config.optimizer), ckpt,
                        saturation_watch(task))
    step = first_step = int(state.step)
    results = {}
    while step < plan.num_steps and not reached:
      n = plan.next_dispatch(step)
      state, metrics = train_step(state, examples, shared, n)
      progress.add(step, metrics, state)
      step += n
      if stop.due(step):
        save_and_stop(stop, step, state, plan, ckpt, progress)
      if not plan.log_due(step) and not plan.checkpoint_due(step):
        continue
      progress.flush(step, write=plan.log_due(step))
      accuracy = None
      if plan.eval_due(step):
        results = {select: evals[select].run(state.params)}
        progress.evaluation(select, step, results[select])
        accuracy = results[select]["accuracy"]
        reached = target_reached(config, accuracy, f"{select} accuracy at step {step}")
      if plan.checkpoint_due(step):
        ckpt.save(step, state, plan.meta(step, accuracy),
                  None if accuracy is None else {checkpointing.BEST_METRIC: accuracy})
      progress.restart_timer(step)

    for name, evaluator in evals.items():  # Every evaluation of the final parameters.
      if name not in results:
        results[name] = evaluator.run(state.params)
        if step > first_step:  # A rerun of a finished run has logged these already.
          progress.evaluation(name, step, results[name])
    ckpt.wait()
    summary = summarise(config, plan, step, state.params, results, progress, ckpt, reached,
                        task.chance_levels())
    if jax.process_index() == 0:
      run_figures.draw_figures(workdir, task.graphdef(), state.params, task.dataset,
                               splits["test"], evals, config.eval.num_figure_examples,
                               progress.writer, step)
      with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    progress.close()
    ckpt.close()
  log(f"Done: step {step}, test accuracy {100 * summary['test_accuracy']:.2f}% "
      f"(error {100 * summary['test_error']:.2f}%; chance accuracy "
      f"{100 * summary['chance']['accuracy']:.2f}%). Results in {workdir}.")
  return summary


# --- What the loop uses -----------------------------------------------------------------

def log(text: str) -> None:
  """Prints on process 0 only (every process runs the same loop)."""
  if jax.process_index() == 0:
    print(text, flush=True)


def validate_config(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Raises UsageError, naming the key, for train settings that cannot run."""
  t = config.train
  for key in ("batch_size", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints",
              "steps_per_dispatch"):
    if not isinstance(t[key], int) or t[key] < 1:
      raise UsageError(f"config.train.{key} must be an integer >= 1, got {t[key]!r}.")
  if t.num_steps is not None and t.num_steps < 0:
    raise UsageError(f"config.train.num_steps must be >= 0, got {t.num_steps}.")
  if t.num_steps is None and t.num_epochs < 0:
    raise UsageError(f"config.train.num_epochs must be >= 0, got {t.num_epochs}.")
  if t.eval_every_steps < 0:
    raise UsageError(f"config.train.eval_every_steps must be >= 0, got {t.eval_every_steps}.")
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


def target_reached(config, accuracy: float | None, what: str) -> bool:
  """Whether ``accuracy`` (of the selection set; ``what`` names it) meets
  ``config.train.stop_at_accuracy``; says so when it does."""
  target = config.train.get("stop_at_accuracy")
  reached = target is not None and accuracy is not None and accuracy >= target
  if reached:
    log(f"Reached config.train.stop_at_accuracy={target}: {what} is "
        f"{100 * accuracy:.2f}%; training stops here.")
  return reached


def saturation_watch(task) -> monitors.SaturationWatch:
  """The run's :class:`capsjax.monitors.SaturationWatch` (``config.train.saturation_warning``;
  configs written before it existed get the defaults)."""
  settings = task.config.train.get("saturation_warning") or {}
  return monitors.SaturationWatch(
      fraction=settings.get("fraction", 0.9), steps=settings.get("steps", 100),
      settings=getattr(task.model_class, "saturation_settings", ()),
      chance=task.chance_levels()["accuracy"])


def banner(config, plan: "Plan", splits: dict, evals: dict, params, chance: dict) -> str:
  """One line on what this run trains, on what, where."""
  num_params = sum(x.size for x in jax.tree.leaves(params))
  dataset = config.get("dataset", "mnist")
  if config.data.get("pad"):
    dataset += f" (padded by {config.data.pad} px)"
  return (f"capsjax: {config.model.get('name', 'capsnet')} ({num_params:,} parameters) on "
          f"{dataset}: {plan.num_train} train, {len(splits['validation'])} validation, "
          f"{len(splits['test'])} test examples; evaluations {', '.join(evals)}; "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s) in "
          f"{jax.process_count()} process(es); {plan.num_steps} steps of batch "
          f"{plan.batch_size} ({plan.steps_per_epoch} steps per epoch). Chance: "
          + ", ".join(f"{100 * v:.2f}% {k}" for k, v in chance.items()) + ".")


@dataclasses.dataclass(frozen=True)
class Plan:
  """How many steps, and at which steps to log, evaluate and checkpoint."""
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
    """The data position (and the selection set's accuracy) a checkpoint records."""
    meta = {"step": step, "epoch": step // self.steps_per_epoch,
            "position_in_epoch": step % self.steps_per_epoch, "num_train": self.num_train,
            "batch_size": self.batch_size}
    if selection_accuracy is not None:
      meta["selection_accuracy"] = selection_accuracy
    return meta


def init_or_restore(task, ckpt, plan: Plan, workdir: str,
                    sharding) -> tuple[steps.TrainState, bool]:
  """The newest checkpoint of ``ckpt`` that restores (damaged newer ones are reported and
  moved aside), else fresh parameters; and whether it had already reached
  ``train.stop_at_accuracy``. Records the config."""
  config = task.config
  restored = ckpt.restore_newest(steps.abstract_state(task, sharding), log=log,
                                 move_aside=jax.process_index() == 0)
  if jax.process_count() > 1:  # Process 0 may have moved damaged checkpoints aside.
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("capsjax: checkpoints restored")
    ckpt.reload()
  if restored is None:
    tx = steps.make_optimizer(config.optimizer)
    state = jax.jit(lambda: steps.init_state(task, tx), out_shardings=sharding)()
    latest, reached = None, False
  else:
    latest, state, meta = restored
    log(f"Resuming from the checkpoint at step {latest} (epoch {meta.get('epoch')}, "
        f"position {meta.get('position_in_epoch')}) in {ckpt.directory}.")
    if meta.get("num_train") != plan.num_train or meta.get("batch_size") != plan.batch_size:
      log(f"Warning: the checkpoint was made with {meta.get('num_train')} training examples "
          f"and batch {meta.get('batch_size')}; now {plan.num_train} and {plan.batch_size}, so "
          "the data order differs from an uninterrupted run.")
    reached = target_reached(config, meta.get("selection_accuracy"),
                             f"the selection accuracy of the checkpoint at step {latest}")
    if jax.process_index() == 0:
      _truncate_metrics(workdir, latest)
  if jax.process_index() == 0:
    runconfig.record(workdir, config, latest, log=log)
  return state, reached


def save_and_stop(stop: preemption.StopRequest, step: int, state, plan: Plan, ckpt,
                  progress: "TrainLog") -> None:
  """After a stop signal: logs the pending train metrics, saves ``step`` and raises
  :class:`capsjax.preemption.Preempted`."""
  stop.saving = True
  progress.flush(step, write=True)
  if step not in ckpt.all_steps():
    ckpt.save(step, state, plan.meta(step, None))
  ckpt.wait()
  progress.close()
  ckpt.close()
  raise preemption.Preempted(
      f"Stopped by {stop.signal_name} at step {step}; checkpoint saved in {ckpt.directory}; "
      "rerun the same command to resume.", stop.signal_name)


def _truncate_metrics(workdir: str, step: int) -> None:
  """After a resume, drop records newer than the restored step (they will be redone)."""
  path = os.path.join(workdir, "metrics.jsonl")
  records = reporting.read_metrics(workdir)
  with open(path + ".tmp", "w") as f:
    for r in records:
      if r["step"] <= step:
        f.write(json.dumps(r) + "\n")
  os.replace(path + ".tmp", path)


class TrainLog:
  """Train metrics (fetched from the devices only at log points), timing, progress line,
  metrics.jsonl and TensorBoard (process 0 writes)."""

  def __init__(self, workdir: str, plan: Plan, schedule, ckpt,
               watch: monitors.SaturationWatch | None = None):
    self.plan, self.schedule, self.ckpt, self.watch = plan, schedule, ckpt, watch
    is_main = jax.process_index() == 0
    self.writer = reporting.MetricWriter(workdir) if is_main else None
    self.bar = reporting.ProgressBar(plan.num_steps) if is_main else None
    self.pending: list[tuple[int, dict]] = []   # (first step, stacked metrics) not yet fetched.
    self.seconds, self.steps_timed = 0.0, 0
    self.timer_start, self.timer_step = None, 0

  def add(self, step: int, metrics: dict, state) -> None:
    """Metrics of the dispatch that started at ``step``; the first one compiles, so time
    from its end."""
    self.pending.append((step, metrics))
    if self.timer_start is None:
      jax.block_until_ready(state)
      self.timer_start = time.perf_counter()
      self.timer_step = step + len(np.asarray(metrics["loss"]))

  def images_per_second(self) -> float | None:
    return self.steps_timed * self.plan.batch_size / self.seconds if self.seconds > 0 else None

  def flush(self, step: int, write: bool) -> None:
    """Fetches the pending metrics, stops the run on a non-finite loss, and (``write``)
    logs their mean."""
    if not self.pending:
      return
    steps_, host = _host_metrics(self.pending)
    self.pending = []
    means, bad_step = _first_nonfinite(steps_, host)
    if bad_step is not None:
      self.ckpt.wait()
      good = self.ckpt.latest_step()
      raise NonFiniteLossError(
          f"The training loss became non-finite at step {bad_step}. Nothing after step "
          f"{good if good is not None else 0} was saved; the last good checkpoint is "
          f"{'step ' + str(good) if good is not None else 'none'} in {self.ckpt.directory}. "
          "Lower config.optimizer.learning_rate or check the data, then rerun to resume.")
    if step > self.timer_step:
      self.seconds += time.perf_counter() - self.timer_start
      self.steps_timed += step - self.timer_step
      self.timer_start, self.timer_step = time.perf_counter(), step
    warning = self.watch.update(steps_, host) if self.watch is not None else None
    if warning and self.bar is not None:
      self.bar.message(warning)
    rate = self.images_per_second() or float("nan")
    if self.writer is not None and write:
      self.writer.write("train", step, {**means, "images_per_second": rate,
                                        "learning_rate": float(self.schedule(step))})
      self.bar.update(step, means["loss"], means.get("accuracy", float("nan")), rate,
                      self.plan.batch_size / rate if rate == rate and rate > 0 else float("nan"))
      self.writer.flush()

  def evaluation(self, name: str, step: int, metrics: dict) -> None:
    if self.writer is not None:
      self.writer.write(name, step, metrics)
      self.bar.message(f"step {step}: {name} accuracy {100 * metrics['accuracy']:.2f}%"
                       + (f", loss {metrics['loss']:.4f}" if "loss" in metrics else ""))
      self.writer.flush()

  def restart_timer(self, step: int) -> None:
    """Evaluation and checkpointing since the last flush do not count as training time."""
    self.timer_start, self.timer_step = time.perf_counter(), step

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.writer.close()


def _host_metrics(pending: list[tuple[int, dict]]) -> tuple[np.ndarray, dict]:
  """The steps (1-based: step n's metrics are of the parameters before update n) and the
  pending train metrics on the host, one row per step."""
  steps_ = np.concatenate([start + 1 + np.arange(len(np.asarray(m["loss"]))) for start, m in pending])
  host = {k: np.concatenate([np.asarray(m[k]) for _, m in pending]) for k in pending[0][1]}
  return steps_, host


def _first_nonfinite(steps_: np.ndarray, host: dict) -> tuple[dict, int | None]:
  """Mean of the train metrics, and the first step whose loss is not finite."""
  bad = np.flatnonzero(~np.isfinite(host["loss"]))
  means = {k: np.mean(v, axis=0).tolist() for k, v in host.items()}
  return means, (int(steps_[bad[0]]) if bad.size else None)


def summarise(config, plan: Plan, step: int, params, results: dict, progress: TrainLog, ckpt,
              reached: bool, chance: dict) -> dict:
  """What ``summary.json`` holds: the main test set at the top level, every evaluation under
  ``evaluations``."""
  summary = {
      "num_params": int(sum(x.size for x in jax.tree.leaves(params))), "step": int(step), "num_steps": int(plan.num_steps),
      "epochs": step / plan.steps_per_epoch, "finished": True,
      "stopped_at_accuracy": bool(reached),
      "test_accuracy": results["test"]["accuracy"], "test_error": results["test"]["error"],
      "test_loss": results["test"].get("loss"),
      "chance": chance,
      "train_images_per_second": progress.images_per_second(),
      "train_seconds": progress.seconds, "devices": jax.device_count(),
      "platform": jax.devices()[0].platform, "processes": jax.process_count(),
      "best_checkpoint_step": ckpt.best_step(),
      "evaluations": results,
      "config": json.loads(config.to_json_best_effort()),
  }
  if "validation" in results:
    summary["validation_accuracy"] = results["validation"]["accuracy"]
  return summary
