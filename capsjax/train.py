"""Training and evaluation: ``train_and_evaluate(config, workdir)``.

The loop never names a dataset, model or loss: ``config.dataset`` picks the dataset builder,
``config.model.name`` the model (which owns its loss and metrics), ``config.evals`` the
evaluations; :class:`capsjax.training.runtime.Runtime` sets them up as for every other command,
and :class:`capsjax.training.run.Run` keeps the run's records (how checkpoints and evaluations
are chosen: its docstring). One driver trains a run alone and several that differ only in
numbers as one program: :func:`capsjax.training.driver.train_and_evaluate_group`.
"""

from __future__ import annotations

import ml_collections

from capsjax.training import driver, memory, schema


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains, evaluates, checkpoints to ``workdir`` and resumes from it.

  Holds ``workdir`` against other runs; SIGTERM or SIGINT saves the step reached and
  raises :class:`capsjax.runs.preemption.Preempted`. Returns the summary that is also written to
  ``WORKDIR/summary.json``; raises what stopped the run
  (:class:`capsjax.common.errors.NonFiniteLossError`, :class:`capsjax.runs.workdirs.WorkdirBusy`,
  :class:`capsjax.training.memory.OutOfMemory`, ...).
  """
  config = schema.resolve_config(config)  # Every setting checked before anything runs.
  with memory.advice_on_allocation_failure(config):
    (outcome,) = driver.train_and_evaluate_group([config], [workdir], vectorised=False)
  if isinstance(outcome, BaseException):
    raise outcome
  return outcome
