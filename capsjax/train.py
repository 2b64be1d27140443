"""Training and evaluation: ``train_and_evaluate(config, workdir)``.

The loop never names a dataset, model or loss: ``config.dataset`` picks the dataset builder,
``config.model.name`` the model (which owns its loss and metrics), ``config.evals`` the
evaluations; :class:`capsjax.training.runtime.Runtime` sets them up as for every other command,
and :class:`capsjax.training.run.Run` keeps the run's records (how checkpoints and evaluations
are chosen: its docstring). Several runs that differ only in numbers train as one program
through :func:`capsjax.training.run_group.train_and_evaluate_group`.
"""

from __future__ import annotations

import os

import ml_collections

from capsjax.runs import preemption, workdirs
from capsjax.training import memory
from capsjax.training import run as run_lib
from capsjax.training.runtime import Runtime


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
       preemption.watch() as stop, memory.advice_on_allocation_failure(config):
    runtime.load()
    run = run_lib.Run(runtime, workdir)
    try:
      state = run.start()
      examples, shared = runtime.on_devices(runtime.splits["train"])
      # Compiled and its memory checked before the first step (memory.OutOfMemory says what to
      # change, and nothing of the run is written).
      train_step = memory.CompiledSteps(runtime.make_train_step(), runtime.config)
      while run.training:
        n = run.plan.next_dispatch(run.step)
        state, metrics = train_step(state, examples, shared, n)
        run.dispatched(n, metrics, state)
        if stop.due(run.step):
          run_lib.stopped(stop, [(run, state)])
        run.after_dispatch(state)
      return run.finish(state)
    except BaseException:
      run.close()  # A checkpoint still being written is finished: nothing saved is lost.
      raise
