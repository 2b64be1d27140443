"""Training and evaluation: ``train_and_evaluate(config, workdir)``.

The loop never names a dataset, model or loss: ``config.dataset`` picks the dataset builder,
``config.model.name`` the model (which owns its loss and metrics), ``config.evals`` the
evaluations; :class:`capsjax.training.runtime.Runtime` sets them up as for every other command.

Nothing is chosen on the test set: with a validation split (``data.validation_size``) the
run keeps the best checkpoint by validation accuracy and ``train.stop_at_accuracy`` watches
validation; without one there is no best checkpoint, the test set is evaluated periodically
only to draw the curves, and a stop on its accuracy is said to be one. ``summary.json``
records how its numbers were chosen (``selected_on``).
"""

from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np

from capsjax.common.errors import UsageError
from capsjax.runs import checkpointing, files, hardware, preemption, reporting, runconfig, workdirs
from capsjax.runs.reporting import log
from capsjax.training import run_figures
from capsjax.training.plan import Plan
from capsjax.training.runtime import Runtime
from capsjax.training.train_log import TrainLog


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains, evaluates, checkpoints to ``workdir`` and resumes from it.

  Holds ``workdir`` against other runs; SIGTERM or SIGINT saves the step reached and
  raises :class:`capsjax.runs.preemption.Preempted`. Returns the summary that is also written to
  ``WORKDIR/summary.json``.
  """
  runtime = Runtime(config)  # The dataset builder, the model class, the mesh.
  created = not os.path.isdir(workdir)
  workdir = workdirs.prepare(workdir)
  with workdirs.hold(workdir, tidy_failed_start=True, created=created), \
       preemption.watch() as stop:
    plan = runtime.load().plan
    validation = len(runtime.splits.get("validation", ())) > 0
    ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                      keep=config.train.keep_checkpoints, keep_best=validation)
    state, reached = init_or_restore(runtime, ckpt, workdir)
    evals = runtime.evaluations()
    watched = "validation" if validation else "test"  # Evaluated during training.
    # Recorded beside it (e.g. novel viewpoints, for comparisons at matched familiar error);
    # never used to choose anything.
    recorded = [n for n in (config.train.get("eval_during") or ()) if n != watched]
    if unknown := [n for n in recorded if n not in evals]:
      raise UsageError(f"config.train.eval_during names {unknown}, which config.evals does "
                       f"not hold (it has {sorted(evals)}).")
    log(banner(runtime, evals, state.params))
    log(hardware.describe())
    if warning := hardware.cpu_fallback_warning(jax.default_backend()):
      log(warning)
    if config.train.get("stop_at_accuracy") is not None and not validation:
      log("Warning: config.train.stop_at_accuracy watches the test accuracy, since this run "
          "holds out no validation split: the stopping step is then chosen on the test set "
          "(summary.json says selected_on: test). Hold one out with "
          "--config.data.validation_size=10000.")

    examples, shared = runtime.on_devices(runtime.splits["train"])
    train_step = runtime.make_train_step()
    progress = TrainLog(workdir, plan, runtime.optimizer.schedule, ckpt,
                        runtime.task.monitors())
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
        results = {watched: evals[watched].run(state.variables)}
        progress.evaluation(watched, step, results[watched])
        accuracy = results[watched]["accuracy"]
        for name in recorded:
          results[name] = evals[name].run(state.variables)
          progress.evaluation(name, step, results[name])
        reached = target_reached(config, accuracy, f"{watched} accuracy at step {step}")
      if plan.checkpoint_due(step):  # Ranked for the best checkpoint on validation only.
        best = validation and accuracy is not None
        ckpt.save(step, state, plan.meta(step, accuracy),
                  {checkpointing.BEST_METRIC: accuracy} if best else None)
      progress.restart_timer(step)

    for name, evaluator in evals.items():  # Every evaluation of the final parameters.
      if name not in results:
        results[name] = evaluator.run(state.variables)
        if step > first_step:  # A rerun of a finished run has logged these already.
          progress.evaluation(name, step, results[name])
    ckpt.wait()
    summary = summarise(runtime, step, state.params, results, progress, ckpt,
                        selected_on=(watched if reached else "final"))
    if jax.process_index() == 0:  # The summary first: figures can be redrawn by evaluate.
      files.write_json(os.path.join(workdir, "summary.json"), summary)
      run_figures.draw_figures(workdir, runtime.task, state.variables, runtime.splits["test"],
                               evals, config.eval.num_figure_examples, progress.writer, step)
    progress.close()
    ckpt.close()
  log(f"Done: step {step}, test accuracy {100 * summary['test_accuracy']:.2f}% "
      f"(error {100 * summary['test_error']:.2f}%; chance, in %: "
      f"{reporting.chance_text(summary['chance'])}). Results in {workdir}.")
  return summary


# --- What the loop uses -----------------------------------------------------------------

def target_reached(config, accuracy: float | None, what: str) -> bool:
  """Whether ``accuracy`` (``what`` names it) meets ``config.train.stop_at_accuracy``; says so
  when it does."""
  target = config.train.get("stop_at_accuracy")
  reached = target is not None and accuracy is not None and accuracy >= target
  if reached:
    log(f"Reached config.train.stop_at_accuracy={target}: {what} is "
        f"{100 * accuracy:.2f}%; training stops here.")
  return reached


def banner(runtime: Runtime, evals: dict, params) -> str:
  """One line on what this run trains, on what, where, and what chance would score."""
  config, plan, splits = runtime.config, runtime.plan, runtime.splits
  num_params = sum(x.size for x in jax.tree.leaves(params))
  dataset = runtime.task.dataset.describe()
  chance = runtime.task.chance_levels()
  return (f"capsjax: {config.model.name} ({num_params:,} parameters) on "
          f"{dataset}: {plan.num_train} train, {len(splits.get('validation', ()))} validation, "
          f"{len(splits['test'])} test examples; evaluations {', '.join(evals)}; "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s) in "
          f"{jax.process_count()} process(es); {plan.num_steps} steps of batch "
          f"{plan.batch_size} ({plan.steps_per_epoch} steps per epoch); "
          f"{runtime.optimizer.settings['name']}, {runtime.optimizer.settings['schedule']}"
          f" learning-rate schedule. Chance: {reporting.chance_text(chance)}.")


def init_or_restore(runtime: Runtime, ckpt, workdir: str):
  """The newest checkpoint of ``ckpt`` that restores (damaged newer ones are reported and
  moved aside), else fresh parameters; and whether it had already reached
  ``train.stop_at_accuracy``. Records the config."""
  config, plan = runtime.config, runtime.plan
  if ckpt.all_steps():
    runconfig.check_same_model(runtime, workdir)
  restored = runtime.restore(ckpt, move_aside=jax.process_index() == 0)
  if jax.process_count() > 1:  # Process 0 may have moved damaged checkpoints aside.
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("capsjax: checkpoints restored")
    ckpt.reload()
  if restored is None:
    state, latest, reached = runtime.fresh_state(), None, False
  else:
    latest, state, meta = restored
    log(f"Resuming from the checkpoint at step {latest} (epoch {meta.get('epoch')}, "
        f"position {meta.get('position_in_epoch')}) in {ckpt.directory}.")
    if meta.get("num_train") != plan.num_train or meta.get("batch_size") != plan.batch_size:
      log(f"Warning: the checkpoint was made with {meta.get('num_train')} training examples "
          f"and batch {meta.get('batch_size')}; now {plan.num_train} and {plan.batch_size}, so "
          "the data order differs from an uninterrupted run.")
    reached = target_reached(config, meta.get("selection_accuracy"),
                             f"the accuracy watched at the checkpoint of step {latest}")
    if jax.process_index() == 0:
      _truncate_metrics(workdir, latest)
  if jax.process_index() == 0:
    runconfig.record(workdir, config, latest, log=log)
  return state, reached


def save_and_stop(stop: preemption.StopRequest, step: int, state, plan: Plan, ckpt,
                  progress: TrainLog) -> None:
  """After a stop signal: logs the pending train metrics, saves ``step`` and raises
  :class:`capsjax.runs.preemption.Preempted`."""
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
  records = reporting.read_metrics(workdir)
  with files.atomic_write(os.path.join(workdir, "metrics.jsonl")) as f:
    for r in records:
      if r["step"] <= step:
        f.write(json.dumps(r) + "\n")


def summarise(runtime: Runtime, step: int, params, results: dict, progress: TrainLog, ckpt,
              selected_on: str) -> dict:
  """What ``summary.json`` holds: the main test set at the top level, every evaluation under
  ``evaluations``, the chance levels, and how the numbers were chosen: ``selected_on`` is
  ``final`` (the parameters at the last step), ``validation`` (training stopped when the
  validation accuracy reached ``train.stop_at_accuracy``) or ``test`` (it stopped on the test
  accuracy, since no validation split was held out)."""
  config, plan = runtime.config, runtime.plan
  summary = {
      "num_params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
      "step": int(step), "num_steps": int(plan.num_steps),
      "epochs": step / plan.steps_per_epoch, "selected_on": selected_on,
      "stopped_at_accuracy": selected_on != "final",
      "test_accuracy": results["test"]["accuracy"], "test_error": results["test"]["error"],
      "test_loss": results["test"].get("loss"),
      "chance": runtime.task.chance_levels(),
      "train_images_per_second": progress.images_per_second(),
      "train_seconds": progress.seconds, "devices": jax.device_count(),
      "platform": jax.devices()[0].platform, "processes": jax.process_count(),
      "best_checkpoint_step": ckpt.best_step(),
      "optimizer": runtime.optimizer.settings,
      "evaluations": results,
      "config": json.loads(config.to_json_best_effort()),
  }
  if "validation" in results:
    summary["validation_accuracy"] = results["validation"]["accuracy"]
  return summary
