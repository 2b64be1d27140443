"""A search's trials, each a capsjax run, claimed so that no trial trains twice and none is
lost when a worker dies (:mod:`capsjax.training.search` declares the search).

A worker holds ``DIR/search/<point>/claims/<number>/.capsjax.lock`` (an ``flock``:
:class:`capsjax.runs.workdirs.Lock`) while it trains trial <number> in
``DIR/search/<point>/trials/<number>``, and it asks Optuna for a new trial and claims it under
the point's own lock, under which every worker also looks for free claims. So a trial the
store has RUNNING whose claim is free was left by a worker that died (``kill -9``, SIGTERM, a
lost node): the operating system drops a dead process's ``flock`` at once, on every host of a
shared filesystem. The next worker claims it and resumes the same trial (its number, its
values, its workdir from the last checkpoint); nothing is counted twice. Optuna's heartbeat
with ``RetryFailedTrialCallback`` was not chosen: a heartbeat cannot tell a dead worker from
a slow one until a grace period has passed (a rerun right after a kill would wait, or train
the trial twice), and its retry is a new trial, under a new number, beside a failed one.
Claims need every worker to see the sweep's directory, as a sweep's runs already do.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Callable

import optuna

from capsjax.common.errors import NonFiniteLossError
from capsjax.runs import preemption, workdirs
from capsjax.runs.reporting import is_finished

POLL_SECONDS = 5.0  # How often a worker looks again when others hold every trial left.
COUNTED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
           optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING)


def tune(study: optuna.Study, search, directory: str, config_of: Callable[[dict], object],
         train_fn: Callable, say=print) -> None:
  """Trains trials of ``study`` (``search``: a :class:`capsjax.training.search.Search`) into
  ``directory`` until it holds ``search.trials`` counted ones (complete, pruned, failed),
  waiting for those other workers train. ``config_of(overrides)``: the point's config with
  them; ``train_fn(config, workdir)`` trains a run (``capsjax.train.train_and_evaluate``).
  A stop signal between trials raises :class:`capsjax.runs.preemption.Preempted`; during
  one, the run saves and raises it, its trial left RUNNING for the next worker to resume."""
  waiting = None
  with preemption.watch() as stop:
    while True:
      if stop.signal_name is not None:
        raise preemption.Preempted(f"Stopped by {stop.signal_name} between trials; rerun the "
                                   "same command to continue the search.", stop.signal_name)
      with _held(directory):
        claim = _claim(study, search, directory)
      if claim is None:
        return
      if isinstance(claim, list):
        if claim != waiting:
          say(f"{study.study_name}: trials {claim} are trained by other workers; waiting.")
        waiting = claim
        time.sleep(POLL_SECONDS)
        continue
      frozen, lock = claim
      try:
        _train_trial(study, frozen, search, directory, config_of, train_fn, say)
      finally:
        lock.release()


@contextlib.contextmanager
def _held(directory: str):
  """The point's own lock, waited for (held for a look at the store, an ask and a claim)."""
  os.makedirs(directory, exist_ok=True)
  lock = workdirs.Lock(directory)
  while not lock.try_acquire():
    time.sleep(0.05)
  try:
    yield
  finally:
    lock.release()


def _claim(study: optuna.Study, search, directory: str):
  """``(trial, claim)``: a RUNNING trial whose worker died, else a new trial while fewer than
  ``search.trials`` are counted; else the numbers of the trials other workers hold, or None
  when there are none (the search is done)."""
  trials = study.get_trials(deepcopy=False)
  held = []
  for trial in trials:
    if trial.state == optuna.trial.TrialState.RUNNING:
      lock = _claim_lock(directory, trial.number)
      if lock.try_acquire():
        return trial, lock
      held.append(trial.number)
  if sum(t.state in COUNTED for t in trials) >= search.trials:
    return held or None
  # Seeded by the trials so far: each ask's draw differs between workers and repeats with the
  # same command. constant_liar: TPE takes the running trials as bad, not as absent.
  study.sampler = optuna.samplers.TPESampler(
      seed=search.seed * 100_003 + len(trials), constant_liar=True,
      n_startup_trials=max(1, min(10, search.trials // 2)))
  trial = study.ask()
  search.suggest(trial)  # Its values in the store before any worker can see it.
  lock = _claim_lock(directory, trial.number)
  lock.acquire()
  return study.get_trials(deepcopy=False)[trial.number], lock


def _claim_lock(directory: str, number: int) -> workdirs.Lock:
  path = os.path.join(directory, "claims", str(number))
  os.makedirs(path, exist_ok=True)
  return workdirs.Lock(path)


def _train_trial(study, frozen, search, directory: str, config_of, train_fn, say) -> None:
  """Trains (or resumes) trial ``frozen`` in ``directory/trials/<number>``, its validation
  curve reported to the pruner, and tells the store how it ended: its final validation
  value, pruned, or failed (a non-finite loss). A stop signal saves the run and leaves the
  trial RUNNING (Preempted propagates)."""
  from capsjax.training import run as run_lib  # JAX: only once a trial trains.

  trial = optuna.trial.Trial(study, frozen._trial_id)  # A resumed trial's, too.
  params = search.suggest(trial)
  workdir = os.path.join(directory, "trials", str(trial.number))
  evaluation, key = search.metric.split("/")
  reported = set(frozen.intermediate_values)
  say(f"{study.study_name}: trial {trial.number}{' (resumed)' if os.path.isdir(workdir) else ''}"
      f": {describe(params)} (its one evaluation is the validation split, named 'test')")

  def report(run_dir: str, step: int, measured: dict) -> None:
    if run_dir != os.path.abspath(workdir) or evaluation not in measured:
      return
    if step not in reported:
      trial.report(float(measured[evaluation][key]), step)
      reported.add(step)
    if search.prune and trial.should_prune():
      raise optuna.TrialPruned(f"pruned at step {step}")

  run_lib.EVALUATION_LISTENERS.append(report)
  try:
    if is_finished(workdir):  # Trained before its worker could tell the store.
      with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    else:
      summary = train_fn(config_of(search.trial_overrides(params)), workdir)
  except optuna.TrialPruned as e:
    study.tell(trial.number, state=optuna.trial.TrialState.PRUNED)
    say(f"{study.study_name}: trial {trial.number} {e}.")
    return
  except NonFiniteLossError as e:
    trial.set_user_attr("failed", str(e).splitlines()[0])
    study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    say(f"{study.study_name}: trial {trial.number} failed: {e}")
    return
  finally:
    run_lib.EVALUATION_LISTENERS.remove(report)
  value = float(summary["evaluations"][evaluation][key])
  study.tell(trial.number, value)
  say(f"{study.study_name}: trial {trial.number}: {search.metric} {value:.4f}.")


def describe(params: dict) -> str:
  """``key=value, ...`` with floats to 4 significant digits."""
  return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in params.items())
