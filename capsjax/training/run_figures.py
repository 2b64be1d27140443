"""The figures of a run, drawn after training (and by ``capsjax.evaluate``).

Every run: training curves and, when the records have them, routing diagnostics; then the
model's own (its ``draw_figures`` hook: e.g. capsule models' reconstructions, paper Fig. 4 and 5)
and each evaluator's (e.g. affine test examples with predictions): :func:`draw_figures`.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx

from capsjax.config import run_settings
from capsjax.common import figures
from capsjax.runs import reporting

SETTINGS = run_settings.FIGURES  # config.eval's figures.


def draw_figures(workdir: str, task, variables, test_split, evaluations: dict,
                 num_examples: int, writer, step: int, output: str | None = None) -> None:
  """Draws every figure of the run in ``workdir`` into ``output`` (default: the workdir;
  another folder for a run that cannot be written to) and images into ``writer``: the model's
  (``task``: :class:`capsjax.training.tasks.Task`; ``variables``: ``TrainState.variables``) of
  ``num_examples`` of the host ``test_split``, and those of each of the run's ``evaluations``."""
  records = reporting.read_metrics(workdir)
  output = output or workdir
  figures.save_training_curves(os.path.join(output, "training_curves.png"), records)
  figures.save_routing_diagnostics(os.path.join(output, "routing_diagnostics.png"), records)
  variables = jax.tree.map(np.asarray, variables)  # Host copy: figures are tiny, skip the mesh.
  model = JittedModel(task, variables)
  n = min(num_examples, len(test_split))
  hook = getattr(task.model_class, "draw_figures", None)
  if hook is not None and n:
    batch = jax.jit(lambda e, s: task.complete_batch(task.dataset.eval_batch(e, s)))(
        {k: v[:n] for k, v in test_split.examples.items()}, test_split.shared)
    hook(model, batch, output, writer, step)
  for evaluator in evaluations.values():
    evaluator.draw(model, output, writer, step)


class JittedModel:
  """A model's evaluation outputs (:meth:`capsjax.training.tasks.Task.forward`) and, where it
  can reconstruct, ``decode`` under ``jax.jit``: one compilation each, instead of one per
  operation when called eagerly. ``capabilities``: what the model declares
  (:data:`capsjax.models.CAPABILITIES`); ``num_classes``: the dataset's."""

  def __init__(self, task, variables):
    self.capabilities = task.capabilities
    self.num_classes = task.dataset.info.num_classes
    self._variables = variables
    self._apply = jax.jit(lambda v, batch: task.forward(v, batch, train=False).outputs)
    self._decode = jax.jit(lambda v, capsules, ids: nnx.merge(task.graphdef, v).decode(
        capsules, ids))

  def apply(self, batch: dict, *, train: bool = False):
    if train:
      raise ValueError("JittedModel draws figures: evaluation only.")
    return self._apply(self._variables, batch)

  def decode(self, class_capsules, class_ids):
    if "reconstruction" not in self.capabilities:
      raise ValueError("This model declares no 'reconstruction' capability: it cannot decode.")
    return self._decode(self._variables, class_capsules, class_ids)
