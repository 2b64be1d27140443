"""Restoring a run to evaluate it: the one sequence ``evaluate``, ``evaluate --evals`` and
ensembles use, and the one vocabulary for which parameters were evaluated.

``selected_on`` (in ``summary.json``, ``evaluation.json``, ``extra_evaluations.json`` and
``ensemble.json``) is one of :data:`SELECTED_ON`: ``final``, the parameters at the run's last step
(nothing chosen); ``validation``, chosen on the validation split (``--checkpoint=best``, or a run
that stopped when its validation accuracy reached ``train.stop_at_accuracy``); ``test``, a run
that stopped on its *test* accuracy (it held out no validation split; its summary and the
training log say so); ``step N``, the checkpoint of step N, asked for by number, or the newest of
a run that has not finished.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections

from capsjax.common import files
from capsjax.runs import checkpointing
from capsjax.config import runconfig, schema
from capsjax.training.setup import Setup, check_no_test_selection

SELECTED_ON = ("final", "validation", "test", "step N")


@dataclasses.dataclass
class Restored:
  """A run's restored ``setup``, ``step``, train ``state`` and ``selected_on``."""
  setup: Setup
  step: int
  state: Any
  selected_on: str


def load_config(workdir: str, checkpoint: str = "latest", data_dir: str | None = None,
                add_evals: dict | None = None) -> ml_collections.ConfigDict:
  """The run's ``config.json`` as a resolved config, with ``data.dir`` replaced by ``data_dir``
  when given and the evaluations ``add_evals`` (``{name: settings}``) added; UsageError for
  ``--checkpoint=best`` of a run without a validation split (:func:`check_no_test_selection`)."""
  config = runconfig.load(workdir)
  if data_dir:
    config.data.dir = data_dir
  for name, settings in (add_evals or {}).items():
    config.evals[name] = settings
  config = schema.resolve_config(config)
  check_no_test_selection(config, checkpoint)
  return config


def restore(workdir: str, setup: Setup, checkpoint: str = "latest",
            own_data: bool = True) -> Restored:
  """Restores ``checkpoint`` (``latest``, ``best`` or a step number) of ``workdir`` into ``setup``'s
  train state (built from :func:`load_config`'s config). ``own_data``: False when the setup holds
  another run's data (an ensemble's later members share the first one's), so that its budget's
  length is not this run's: the run's summary then says where it ended. A damaged checkpoint is
  reported and the next candidate tried; nothing is moved (a training run may hold this workdir)."""
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                    keep=setup.config.train.keep_checkpoints,
                                    keep_best=checkpoint == "best")
  try:
    step, state, _ = setup.restore(ckpt, steps=ckpt.candidates(checkpoint))
  finally:
    ckpt.close()
  num_steps = setup.budget.num_steps if own_data else None
  return Restored(setup, step, state, selected_on(workdir, checkpoint, step, num_steps))


def selected_on(workdir: str, checkpoint: str, step: int, num_steps: int | None) -> str:
  """How the parameters of ``step`` were chosen (:data:`SELECTED_ON`): ``validation`` for the
  best checkpoint, ``final`` at the run's last step (``num_steps``, or when None the one its
  ``summary.json`` records), the summary's word where the run stopped at this step on an
  accuracy, else ``step N``."""
  if checkpoint == "best":
    return "validation"
  path = os.path.join(workdir, "summary.json")
  summary = (files.read_json(path, "Move it aside; rerun the training to rewrite it.")
             if os.path.exists(path) else None)
  summary = summary if isinstance(summary, dict) else {}
  if num_steps is None:
    num_steps = summary.get("num_steps")
  if step == num_steps:
    return "final"
  if summary.get("stopped_at_accuracy") and summary.get("step") == step:
    return summary["selected_on"]
  return f"step {step}"
