"""One run's bookkeeping around its train steps: restore or start, log, evaluate, checkpoint, stop,
summarise.

The one loop (:mod:`capsjax.train`) advances every :class:`Run`, alone or with others; either way a
run's workdir ends the same: ``config.json``, ``metrics.jsonl``, TensorBoard events, checkpoints,
``summary.json`` and figures.

Nothing is chosen on the test set: with a validation split (``data.validation_size``) the run keeps
the best checkpoint by validation accuracy and ``train.stop_at_accuracy`` watches validation;
without one there is no best checkpoint, the test set is evaluated periodically only to draw the
curves, and a stop on its accuracy is said to be one. ``summary.json`` records how its numbers were
chosen (``selected_on``).
"""

from __future__ import annotations

import json
import os
from typing import Callable

import jax
import numpy as np

from capsjax.config import run_settings
from capsjax.common import checks, files
from capsjax.common.errors import UsageError
from capsjax.runs import (checkpointing, hardware, lost_peer, predictions, preemption,
                          reporting)
from capsjax.runs.reporting import log
from capsjax.stats import chosen
from capsjax.training import run_figures
from capsjax.config import history
from capsjax.training.setup import Setup, check_same_model
from capsjax.training.train_log import TrainLog


SETTINGS = run_settings.RECORDS  # config.train's records and how a run stops.
# Called as fn(workdir, step, measured) after each evaluation during training and its
# checkpoint, ``measured`` being {evaluation name: metrics}: a search's pruner reads the
# validation curve here (capsjax/training/trials.py) and may raise to stop the run.
EVALUATION_LISTENERS: list[Callable] = []


class Run:
  """A :class:`Setup` training into ``workdir`` (held by the caller), complete when built: the
  newest checkpoint that restores (or fresh parameters), the evaluations and the train log.

  Attributes:
    setup, workdir, budget, label (its name on progress lines, when trained with others),
    created (whether the workdir was made for it: a failed start removes it);
    step: the step reached; reached: whether ``train.stop_at_accuracy`` was met;
    results: the latest evaluations, by name.
  """

  def __init__(self, setup: Setup, workdir: str, *, label: str | None = None,
               created: bool = False, announce: bool = True):
    """``announce``: log the banner (what it trains, on what, where)."""
    self.setup, self.workdir, self.budget = setup, workdir, setup.budget
    self.label, self.created = label, created
    config = setup.config
    self.validation = len(setup.splits.get("validation", ())) > 0
    self.ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                           keep=config.train.keep_checkpoints,
                                           keep_best=self.validation, tidy=True)
    lost_peer.watch_checkpoints(self.ckpt.directory)  # Named if a process is lost.
    self.watched = "validation" if self.validation else "test"  # Evaluated during training.
    self.results: dict = {}
    self.predictions: dict = {}  # Of the evaluations in results, where they keep them.
    self.progress: TrainLog | None = None
    self.closed = False
    self.config_recorded = False
    try:
      self._state, self.reached, self.resumed_step = init_or_restore(setup, self.ckpt, workdir)
      self.step = self.first_step = int(self._state.step)
      self.evals = setup.evaluations()
      # Recorded beside it (e.g. novel viewpoints, for comparisons at matched familiar error);
      # never used to choose anything.
      self.recorded = [n for n in checks.names(config.train.eval_during) if n != self.watched]
      if unknown := [n for n in self.recorded if n not in self.evals]:
        raise UsageError(f"config.train.eval_during names {unknown}, which config.evals "
                         f"does not hold (it has {sorted(self.evals)}).")
      # What runs during training: each on at most config.eval.during_limit examples.
      self.during = {name: self.evals[name].sampled(config.eval.during_limit)
                     for name in (self.watched, *self.recorded)}
      if announce:
        log(banner(setup, self.evals, self._state.params))
        log(hardware.describe())
        if warning := hardware.cpu_fallback_warning(jax.default_backend()):
          log(warning)
      if config.train.stop_at_accuracy is not None and not self.validation:
        log("Warning: config.train.stop_at_accuracy watches the test accuracy, since this "
            "run holds out no validation split: the stopping step is then chosen on the test "
            "set (summary.json says selected_on: test). Hold one out with "
            "--config.data.validation_size=10000.")
      self.progress = TrainLog(workdir, self.budget, setup.optimizer.schedule, self.ckpt,
                               setup.task.monitors(), label=label)
    except BaseException as e:
      lost_peer.exit_if_lost(e)  # Before close(), which would wait for the lost process.
      self.close()
      raise

  @property
  def initial_state(self):
    """The train state it started from (restored or fresh, replicated), until the loop has
    advanced it (:meth:`release_initial_state`); a group that does not fit in memory is split
    and starts again from it."""
    if self._state is None:
      raise RuntimeError(f"The run in {self.workdir} has trained on from its initial state.")
    return self._state

  def release_initial_state(self) -> None:
    """Drops the initial state once the loop has advanced it (its copy is the state now)."""
    self._state = None

  @property
  def training(self) -> bool:
    return self.step < self.budget.num_steps and not self.reached

  def dispatched(self, num_steps: int, metrics: dict, state) -> None:
    """Records a dispatch of ``num_steps`` steps from :attr:`step`; ``state`` is what it made
    (one run's, or a vectorised group's: it is only waited on to time the first dispatch)."""
    self.progress.add(self.step, metrics, state)  # The first dispatch is waited for here.
    self.step += num_steps
    self.record_config()

  def record_config(self) -> None:
    """``config.json`` (and the earlier one kept) once a step has run with these settings:
    a run that fails at its first step (out of memory, say) leaves the record as it was."""
    if not self.config_recorded and jax.process_index() == 0:
      history.record(self.workdir, self.setup.config, self.resumed_step, log=log, announce=False)
    self.config_recorded = True

  def log(self) -> bool:
    """Fetches and logs the train metrics when a log or checkpoint is due at :attr:`step`;
    returns whether one is. Raises NonFiniteLossError when the loss became non-finite."""
    budget, step = self.budget, self.step
    if not budget.log_due(step) and not budget.checkpoint_due(step):
      return False
    self.progress.flush(step, write=budget.log_due(step))
    return True

  def evaluate_and_checkpoint(self, state: Callable | object) -> None:
    """Evaluates and checkpoints where due at :attr:`step` (after :meth:`log`). ``state`` is
    the run's state or a function giving it (a group takes it out of the stacked state only
    when it is needed)."""
    budget, step = self.budget, self.step
    get = state if callable(state) else (lambda: state)
    accuracy = None
    if budget.eval_due(step):
      variables = get().variables
      self.results, self.predictions = {}, {}
      measured = {name: self.evaluate_during(name, variables)
                  for name in (self.watched, *self.recorded)}
      accuracy = measured[self.watched]["accuracy"]
      self.reached = target_reached(self.setup.config, accuracy,
                                    f"{self.watched} accuracy at step {step}")
    if budget.checkpoint_due(step):  # Ranked for the best checkpoint on validation only.
      best = self.validation and accuracy is not None
      self.ckpt.save(step, get(), budget.meta(step, accuracy),
                     {checkpointing.BEST_METRIC: accuracy} if best else None)
    self.progress.restart_timer(step)
    if accuracy is not None:
      for listener in EVALUATION_LISTENERS:
        listener(self.workdir, step, measured)

  def evaluate_during(self, name: str, variables) -> dict:
    """Evaluation ``name`` during training, logged: on all its examples (then also the
    result, :meth:`evaluate`), or on its sample (``config.eval.during_limit``), whose metrics
    say how many examples (``examples``) and are never the result."""
    evaluator = self.during[name]
    if evaluator is self.evals[name]:
      self.evaluate(name, variables)
      metrics = self.results[name]
    else:
      metrics = {**evaluator.run(variables), "examples": evaluator.examples}
    self.progress.evaluation(name, self.step, metrics)
    return metrics

  def evaluate(self, name: str, variables) -> None:
    """Runs evaluation ``name`` into :attr:`results` (and :attr:`predictions`, where it keeps
    them)."""
    self.results[name], found = self.evals[name].run_and_predict(variables)
    if found is not None:
      self.predictions[name] = found

  def save_for_stop(self, state) -> None:
    """After a stop signal: logs the pending train metrics and saves :attr:`step`."""
    self.progress.flush(self.step, write=True)
    if self.step not in self.ckpt.all_steps():
      self.ckpt.save(self.step, state, self.budget.meta(self.step, None))
    self.close()

  def finish(self, state, runs_in_program: int = 1) -> dict:
    """Every evaluation of the final parameters, ``summary.json`` (``runs_in_program``: how
    many runs its program trained at the end) and the figures; returns the summary."""
    setup, step = self.setup, self.step
    for name in self.evals:
      if name not in self.results:
        self.evaluate(name, state.variables)
        if step > self.first_step:  # A rerun of a finished run has logged these already.
          self.progress.evaluation(name, step, self.results[name])
    self.record_config()  # A finished run rerun: its evaluations ran with these settings.
    self.ckpt.wait()
    summary = summarise(setup, step, state.params, self.results, self.progress, self.ckpt,
                        selected_on=(self.watched if self.reached else "final"))
    summary["runs_in_program"] = runs_in_program
    if jax.process_index() == 0:  # Predictions and the summary first: figures can be redrawn.
      write_predictions(os.path.join(self.workdir, predictions.RUN_FILE), setup,
                        self.predictions, step=step, selected_on=summary["selected_on"])
      # Chosen on test or validation during training: never the result (stats/chosen.py).
      summary["comparison_only"] = chosen.comparison_errors(
          reporting.read_metrics(self.workdir))
      files.write_json(os.path.join(self.workdir, "summary.json"), summary,
                       what="the run's summary")
    if jax.process_index() == 0 and setup.config.eval.figures:
      run_figures.draw_figures(self.workdir, setup.task, state.variables,
                               setup.splits["test"], self.evals,
                               setup.config.eval.num_figure_examples, self.progress.writer,
                               step)
    self.close()
    log(f"Done: step {step}, test accuracy {100 * summary['test_accuracy']:.2f}% "
        f"(error {100 * summary['test_error']:.2f}%; chance, in %: "
        f"{reporting.chance_text(summary['chance'])}). Results in {self.workdir}.")
    return summary

  def close(self) -> None:
    """Waits for pending checkpoints and closes the log (also after a failure; once)."""
    if self.closed:
      return
    self.closed = True
    try:
      self.ckpt.wait()  # A save that failed to write is raised here, named, if not before.
    finally:
      if self.progress is not None:
        self.progress.close()
      self.ckpt.close()
      lost_peer.forget_checkpoints(self.ckpt.directory)


def stopped(stop: preemption.StopRequest, runs: list[tuple[Run, object]]) -> None:
  """Saves each ``(run, state)`` at its step after a stop signal and raises
  :class:`capsjax.runs.preemption.Preempted`."""
  stop.saving = True
  for run, state in runs:
    run.save_for_stop(state)
  saved = (f"checkpoint saved in {runs[0][0].ckpt.directory}" if len(runs) == 1 else
           f"each of the {len(runs)} runs saved its checkpoint")
  raise preemption.Preempted(f"Stopped by {stop.signal_name} at step {runs[0][0].step}; {saved}; "
                             "rerun the same command to resume.", stop.signal_name)


# --- What a run uses -------------------------------------------------------------------

def target_reached(config, accuracy: float | None, what: str) -> bool:
  """Whether ``accuracy`` (``what`` names it) meets ``config.train.stop_at_accuracy``; says so
  when it does."""
  target = config.train.stop_at_accuracy
  reached = target is not None and accuracy is not None and accuracy >= target
  if reached:
    log(f"Reached config.train.stop_at_accuracy={target}: {what} is "
        f"{100 * accuracy:.2f}%; training stops here.")
  return reached


def banner(setup: Setup, evals: dict, params) -> str:
  """One line on what this run trains, on what, where, and what chance would score."""
  config, budget, splits = setup.config, setup.budget, setup.splits
  num_params = sum(x.size for x in jax.tree.leaves(params))
  dataset = setup.task.dataset.describe()
  chance = setup.task.chance_levels()
  return (f"capsjax: {config.model.name} ({num_params:,} parameters) on "
          f"{dataset}: {budget.num_train} train, {len(splits.get('validation', ()))} validation, "
          f"{len(splits['test'])} test examples; evaluations {', '.join(evals)}; "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s) in "
          f"{jax.process_count()} process(es); {budget.num_steps} steps of batch "
          f"{budget.batch_size} ({budget.steps_per_epoch} steps per epoch); "
          f"{setup.optimizer.settings['name']}, {setup.optimizer.settings['schedule']}"
          f" learning-rate schedule. Chance: {reporting.chance_text(chance)}.")


def init_or_restore(setup: Setup, ckpt, workdir: str):
  """The newest checkpoint of ``ckpt`` that restores (damaged newer ones are reported and
  moved aside), else fresh parameters; and whether it had already reached
  ``train.stop_at_accuracy``, and the step restored (None: fresh). Warns of changed settings
  (:func:`capsjax.config.history.announce_changes`); :meth:`Run.record_config` writes them
  once a step has run."""
  config, budget = setup.config, setup.budget
  if ckpt.all_steps():
    check_same_model(setup, workdir)
  restored = setup.restore(ckpt, move_aside=jax.process_index() == 0)
  if jax.process_count() > 1:  # Process 0 may have moved damaged checkpoints aside.
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("capsjax: checkpoints restored")
    ckpt.reload()
  if restored is None:
    state, latest, reached = setup.fresh_state(), None, False
  else:
    latest, state, meta = restored
    log(f"Resuming from the checkpoint at step {latest} (epoch {meta.get('epoch')}, "
        f"position {meta.get('position_in_epoch')}) in {ckpt.directory}.")
    if meta.get("num_train") != budget.num_train or meta.get("batch_size") != budget.batch_size:
      log(f"Warning: the checkpoint was made with {meta.get('num_train')} training examples "
          f"and batch {meta.get('batch_size')}; now {budget.num_train} and {budget.batch_size}, so "
          "the data order differs from an uninterrupted run.")
    reached = target_reached(config, meta.get("selection_accuracy"),
                             f"the accuracy watched at the checkpoint of step {latest}")
    if jax.process_index() == 0:
      _truncate_metrics(workdir, latest)
  if jax.process_index() == 0:
    history.announce_changes(workdir, config, latest, log=log)
  return state, reached, latest


def write_predictions(path: str, setup: Setup, found: dict, what: str = "the run's predictions",
                      **meta) -> None:
  """The predictions ``found`` (``{evaluation: Predictions}``) at ``path``, with what they were made
  on (:mod:`capsjax.runs.predictions`); ``what``: their name in a failed write's error."""
  if found:
    predictions.write(path, found, dataset=setup.task.dataset.describe(),
                      source=setup.config.data.get("source"), what=what, **meta)  # Its own: none.


def _truncate_metrics(workdir: str, step: int) -> None:
  """After a resume, drop records newer than the restored step (they will be redone)."""
  records = reporting.read_metrics(workdir)
  with files.atomic_write(os.path.join(workdir, "metrics.jsonl"), what="the metrics log") as f:
    f.writelines(json.dumps(r) + "\n" for r in records if r["step"] <= step)


def summarise(setup: Setup, step: int, params, results: dict, progress: TrainLog, ckpt,
              selected_on: str) -> dict:
  """What ``summary.json`` holds: the main test set at the top level, every evaluation under
  ``evaluations``, the chance levels, and how the numbers were chosen (``selected_on``: ``final``,
  ``validation`` or ``test``, :mod:`capsjax.training.restoring`)."""
  config, budget = setup.config, setup.budget
  summary = {
      "num_params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
      "step": int(step), "num_steps": int(budget.num_steps),
      "epochs": step / budget.steps_per_epoch, "selected_on": selected_on,
      "stopped_at_accuracy": selected_on != "final",
      "test_accuracy": results["test"]["accuracy"], "test_error": results["test"]["error"],
      "test_loss": results["test"].get("loss"),
      "chance": setup.task.chance_levels(),
      "train_images_per_second": progress.images_per_second(),
      "train_seconds": progress.seconds, "devices": jax.device_count(),
      "platform": jax.devices()[0].platform, "processes": jax.process_count(),
      "best_checkpoint_step": ckpt.best_step(),
      "optimizer": setup.optimizer.settings,
      "evaluations": results,
      "config": json.loads(config.to_json_best_effort()),
  }
  if "validation" in results:
    summary["validation_accuracy"] = results["validation"]["accuracy"]
  return summary
