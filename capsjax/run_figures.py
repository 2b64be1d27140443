"""The figures of a run, drawn after training (and by ``capsjax.evaluate``).

Every run: training curves and, when the records have them, routing
diagnostics. Models with a decoder: reconstructions of test examples and the
latent perturbations of paper Fig. 4. Each evaluator may add its own
(e.g. affine test examples with predictions).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from capsjax import figures, reporting


def draw_figures(workdir: str, graphdef, params, builder, test_split, evaluations: dict,
                 num_examples: int, writer, step: int) -> None:
  """Draws every figure of the run into ``workdir`` (and images into ``writer``).

  Args:
    builder: the dataset builder; its ``eval_batch`` prepares the test examples.
    test_split: the host test split (:class:`capsjax.datasets.Split`).
    evaluations: the run's evaluators; each may draw its own figures.
    num_examples: how many test examples the reconstruction figure shows.
  """
  records = reporting.read_metrics(workdir)
  figures.save_training_curves(os.path.join(workdir, "training_curves.png"), records)
  figures.save_routing_diagnostics(os.path.join(workdir, "routing_diagnostics.png"), records)
  params = jax.tree.map(np.asarray, params)  # Host copy: figures are tiny, skip the mesh.
  model = nnx.merge(graphdef, params)
  n = min(num_examples, len(test_split))
  if getattr(model, "decoder", None) is not None and n:
    batch = builder.eval_batch({k: v[:n] for k, v in test_split.examples.items()},
                               test_split.shared)
    _draw_reconstructions(workdir, model, batch, writer, step)
  for evaluator in evaluations.values():
    evaluator.draw(model, workdir, writer, step)


def _draw_reconstructions(workdir, model, batch, writer, step) -> None:
  """Inputs over their reconstructions, and paper Fig. 4 for the first example."""
  images = np.asarray(batch["images"])
  out = model.apply(batch, train=False)
  reconstructions = np.asarray(out.reconstructions)
  figures.save_reconstructions(os.path.join(workdir, "reconstructions.png"), images,
                               reconstructions, np.asarray(batch["labels"]),
                               np.asarray(out.predictions))
  if writer is not None:
    writer.write_image("test/reconstructions", step,
                       figures.reconstruction_grid(images, reconstructions))
  label = int(out.predictions[0])
  capsule = out.class_capsules[0]
  dims = capsule.shape[-1]
  deltas = jnp.asarray(figures.PERTURBATIONS, jnp.float32)
  # (dims, perturbations, classes, dim): one copy per (dimension, delta).
  tweaked = jnp.broadcast_to(capsule, (dims, len(deltas), *capsule.shape))
  tweaked = tweaked.at[:, :, label, :].add(jnp.eye(dims)[:, None, :] * deltas[None, :, None])
  decoded = model.decode(tweaked.reshape(-1, *capsule.shape),
                         jnp.full((dims * len(deltas),), label))
  decoded = np.asarray(decoded).reshape(dims, len(deltas), *decoded.shape[1:])
  figures.save_latent_perturbations(os.path.join(workdir, "latent_perturbations.png"),
                                    decoded, label)
  if writer is not None:
    writer.write_image("test/latent_perturbations", step, figures.tile(decoded))
