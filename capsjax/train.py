"""Training and evaluation: ``train_and_evaluate(config, workdir)``, and the one training loop.

The loop never names a dataset, model or loss: ``config.dataset`` picks the dataset builder,
``config.model.name`` the model (which owns its loss and metrics), ``config.evals`` the
evaluations; :class:`capsjax.training.setup.Setup` sets them up as for every other command,
:class:`capsjax.training.train_step.Step` is the step (batch, forward, loss, gradient, update,
metrics), and :class:`capsjax.training.run.Run` keeps each run's records (how checkpoints and
evaluations are chosen: its docstring).

One loop, :func:`train_and_evaluate_group`, trains one run with its own jitted step
(:func:`train_and_evaluate`) or the runs of a :class:`capsjax.training.vectorize.Group` through one
vectorised step. Each keeps its own workdir, lock and records and ends as it would alone, to float32
rounding, as batched matrix products sum in another order (docs/sweeps.md,
"Which runs share a program"); a run that diverges or reaches ``train.stop_at_accuracy`` stops
alone. Runs restored at different steps (one's newest checkpoint was damaged, say) train as separate
programs, each from its step. A group that does not fit in the device's free memory is split in
halves (:func:`_train`); a single run that does not fit is refused with advice. SIGTERM, a full
disk, a read-only workdir: docs/training.md, "Stop and resume"; a lost host:
"Several GPUs or hosts".
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Sequence

import ml_collections

from capsjax.common.errors import NonFiniteLossError
from capsjax.config import precision, schema
from capsjax.runs import lost_peer, preemption, workdirs
from capsjax.runs.reporting import is_finished, log
from capsjax.training import inflight, memory, run as run_lib, train_step, vectorize
from capsjax.training.setup import Setup


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains, evaluates, checkpoints to ``workdir`` and resumes from it: one run of
  :func:`train_and_evaluate_group`, unvectorised. Returns the summary also written to
  ``WORKDIR/summary.json``; raises what stopped the run (its outcome there, or
  :class:`capsjax.training.memory.OutOfMemory`, ...)."""
  config = schema.as_resolved(config)  # Every setting checked before anything runs.
  with memory.advice_on_allocation_failure(config):
    (outcome,) = train_and_evaluate_group([config], [workdir], vectorised=False)
  if isinstance(outcome, BaseException):
    raise outcome
  return outcome


def train_and_evaluate_group(configs: Sequence[ml_collections.ConfigDict],
                             run_dirs: Sequence[str], per_run_keys: Sequence[str] = (),
                             setups: Sequence[Setup] | None = None,
                             memory_limit=None, vectorised: bool | None = None,
                             skip_finished: bool = False) -> list:
  """Trains the runs of ``configs`` into ``run_dirs``, each holding its workdir against others.

  ``per_run_keys``: the per-run numbers that differ between the runs
  (:func:`capsjax.training.vectorize.plan_groups` finds them; any other difference must not change
  the train step). ``setups``: the configs' setups already built (the planner's), else built here;
  either way each run's data must equal the first's (ValueError). ``vectorised``: one program over a
  leading run axis (default: when there are several runs); False trains a single run with its own
  step. Returns, per run, its summary or the exception that stopped it alone
  (:class:`NonFiniteLossError`, or :class:`capsjax.runs.workdirs.WorkdirBusy` when another process
  holds its workdir; with ``skip_finished``, :class:`capsjax.runs.workdirs.FinishedMeanwhile` when
  its run is finished once held: a sweep's workers look before they hold). SIGTERM or SIGINT saves
  every run at the step reached and raises :class:`capsjax.runs.preemption.Preempted`.
  """
  configs = [schema.as_resolved(c) for c in configs]  # Checked before anything runs.
  vectorised = len(configs) > 1 if vectorised is None else vectorised
  if not vectorised and len(configs) != 1:
    raise ValueError(f"Only one run trains unvectorised; got {len(configs)}.")
  for workdir in run_dirs:  # A read-only or full one refused before data or compiling.
    workdirs.check_writable(workdir)
  if setups is None:
    with memory.advice_on_allocation_failure(
        configs[0], "Loading the runs' data" if vectorised else "The run"):
      setups = [Setup(c) for c in configs]
  if len(setups) > 1:
    check_same_data(setups)
  outcomes: list = [None] * len(configs)
  with contextlib.ExitStack() as held, preemption.watch() as stop:
    # Everything the runs compute, backward passes included, in the runs' matmul precision.
    held.enter_context(precision.group_scope(configs))
    runs = {}
    for i, (setup, workdir) in enumerate(zip(setups, run_dirs)):
      created = not os.path.isdir(workdir)
      workdir = workdirs.prepare(workdir)
      try:
        held.enter_context(workdirs.hold(workdir, tidy_failed_start=True, created=created))
      except workdirs.WorkdirBusy as e:
        outcomes[i] = e
        continue
      if skip_finished and is_finished(workdir):  # Finished since the caller looked.
        outcomes[i] = workdirs.FinishedMeanwhile(workdir)
        continue
      runs[i] = run_lib.Run(setup, workdir, created=created, announce=not runs,
                            label=os.path.basename(workdir) if vectorised else None)
    if vectorised:
      log(f"{len(runs)} run{'s' if len(runs) != 1 else ''} in one program (jax.vmap over "
          f"the runs); per-run numbers that differ: "
          f"{', '.join(per_run_keys) or 'none (they differ in seed or initialisation only)'}.")
    by_step: dict[int, list[int]] = {}
    for i, run in runs.items():
      by_step.setdefault(run.step, []).append(i)
    if len(by_step) > 1:
      log("The runs were restored at different steps "
          f"({', '.join(str(s) for s in sorted(by_step))}); each step's runs train as one "
          "program.")
    try:
      for step in sorted(by_step):
        members = by_step[step]
        template = setups[members[0]]
        new_steps = functools.partial(train_step.Step, template, vectorised, memory_limit)
        _train(template, [runs[i] for i in members], new_steps, per_run_keys, stop, outcomes,
               members)
    except BaseException as e:
      # A lost process ends this one here, in one line: finishing a checkpoint would wait for it.
      lost_peer.exit_if_lost(e)
      for run in runs.values():
        run.close()  # Checkpoints still being written are finished: nothing saved is lost.
      raise
  return outcomes


def share_equal_data(setups: Sequence[Setup]) -> None:
  """Setups whose data (each loaded from its own config: a setting that only its dataset's
  ``load()`` reads, or the seed that draws its validation split, may change them) come out equal
  share one copy of the arrays on the host."""
  by_fingerprint: dict[str, dict] = {}
  for setup in setups:
    setup.splits = by_fingerprint.setdefault(vectorize.data_fingerprint(setup.splits), setup.splits)


def check_same_data(setups: Sequence[Setup]) -> None:
  """Shares equal data among ``setups`` (:func:`share_equal_data`), then raises ValueError unless
  every setup holds the first's, which the runs of one program all train on."""
  share_equal_data(setups)
  if any(setup.splits is not setups[0].splits for setup in setups[1:]):
    raise ValueError(
        "These runs' data differ (each loaded from its own config), so they cannot train "
        "as one program on the first run's data: plan them with "
        "capsjax.training.vectorize.plan_groups, which keeps them apart.")


def _train(template: Setup, runs: list, new_steps, per_run_keys, stop, outcomes: list,
           indices: list[int]) -> None:
  """Trains ``runs`` (all at the same step) together with the step ``new_steps()`` makes; fills
  ``outcomes[indices[k]]``. Splits a group in halves while its program does not fit in memory."""
  for run, i in zip(runs, indices):
    if not run.training:  # Finished or reached its target before: only its final records.
      outcomes[i] = run.finish(run.initial_state)
  runs, indices = [r for r in runs if r.training], [i for r, i in zip(runs, indices) if r.training]
  if not runs:
    return
  step_fn = new_steps()
  what = f"{len(runs)} runs in one program" if step_fn.vectorised else "The run"
  try:
    with memory.advice_on_allocation_failure(template.config, what):
      _train_together(template, runs, step_fn, per_run_keys, stop, outcomes, indices)
  except memory.OutOfMemory as e:
    if len(runs) == 1 or any(run.step > run.first_step for run in runs):
      raise  # One run alone does not fit (the message says what to change).
    half = (len(runs) + 1) // 2
    log(f"{len(runs)} runs in one program do not fit: {e} Splitting them into {half} and "
        f"{len(runs) - half} runs.")
    for part, part_indices in ((runs[:half], indices[:half]), (runs[half:], indices[half:])):
      _train(template, part, new_steps, per_run_keys, stop, outcomes, part_indices)


def _train_together(template: Setup, runs: list, step_fn, per_run_keys, stop,
                    outcomes: list, indices: list[int]) -> None:
  """The training loop: dispatch, log, evaluate, checkpoint, stop; for one run or several."""
  examples, shared = template.on_devices(template.splits["train"])
  states = step_fn.stack([run.initial_state for run in runs])
  values = step_fn.values([run.setup.config for run in runs])
  budget = template.budget
  in_flight = inflight.Window()  # XLA:CPU's collectives deadlock under a deep queue.
  while runs:
    n = budget.next_dispatch(runs[0].step)
    states, metrics = step_fn(states, values, examples, shared, n)
    in_flight.add(metrics)
    for run in runs:  # The stepped copy is the state now (a split would have come first).
      run.release_initial_state()
    for run, run_metrics in zip(runs, step_fn.unstack(metrics, len(runs))):
      run.dispatched(n, run_metrics, states)
    state_of = lambda k: step_fn.state_of(states, k)
    if stop.due(runs[0].step):
      run_lib.stopped(stop, [(run, state_of(k)) for k, run in enumerate(runs)])
    keep, due = [], []
    for k, run in enumerate(runs):  # Every run's train metrics before anyone's evaluation.
      try:
        due.append(run.log())
      except NonFiniteLossError as e:  # Stopped alone, as alone; the others go on.
        run.close()
        workdirs.remove_failed_start(run.workdir, run.created)  # What its hold does alone.
        outcomes[indices[k]] = e
        if step_fn.vectorised:
          log(f"{run.workdir}: {e} The other runs of its program go on.")
        due.append(None)
    for k, run in enumerate(runs):
      if due[k] is None:
        continue
      if due[k]:
        run.evaluate_and_checkpoint(lambda k=k: state_of(k))
      if run.training:
        keep.append(k)
      else:
        outcomes[indices[k]] = run.finish(state_of(k), runs_in_program=len(runs))
    if any(due) and len(runs) > 1:  # Each run's evaluation took the others' time too.
      for k in keep:
        runs[k].progress.restart_timer(runs[k].step)
    if len(keep) < len(runs):
      runs, indices = [runs[k] for k in keep], [indices[k] for k in keep]
      if runs:
        states, values = step_fn.take((states, values), keep)
        # Compiled for the fewer runs before the timers restart: compiling is not training.
        step_fn.prepare(states, values, examples, shared, budget.next_dispatch(runs[0].step))
        for run in runs:
          run.progress.restart_timer(run.step)
