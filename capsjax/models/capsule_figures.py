"""Figures of capsule models with a decoder (their ``draw_figures`` hook,
:meth:`capsjax.models.capsnet.CapsuleModel.draw_figures`): reconstructions of test examples and the
latent perturbations of paper Fig. 4; with two digits per image, paper Fig. 5 (each digit
reconstructed from its capsule, overlaid in red and green) and the same with a class that is
not present (the paper's "*" columns)."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

from capsjax.common import figures


def draw_reconstructions(workdir, model, batch, writer, step) -> None:
  """Inputs over their reconstructions, and paper Fig. 4 for the first example."""
  out = model.apply(batch, train=False)
  images = figures.displayable(batch["images"])
  reconstructions = figures.displayable(out.reconstructions)
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
  decoded = figures.displayable(decoded)
  decoded = decoded.reshape(dims, len(deltas), *decoded.shape[1:])
  figures.save_latent_perturbations(os.path.join(workdir, "latent_perturbations.png"),
                                    decoded, label)
  if writer is not None:
    writer.write_image("test/latent_perturbations", step, figures.tile(decoded))


def draw_pair_reconstructions(workdir, model, batch, writer, step) -> None:
  """Paper Fig. 5 from the predicted classes, and with the second class swapped for the
  longest capsule of a class that is not in the image."""
  images, labels = np.asarray(batch["images"]), np.asarray(batch["labels"])
  out = model.apply(batch, train=False)

  def save(name, decoded, classes, caption):
    figures.save_pair_reconstructions(os.path.join(workdir, f"{name}.png"), images, decoded,
                                      labels, classes, caption)
    if writer is not None:
      writer.write_image(f"test/{name}", step, figures.tile(np.stack(
          [np.repeat(images, 3, axis=-1), figures.overlay(decoded)])))

  save("reconstructions", np.asarray(out.reconstructions), np.asarray(out.predictions),
       "inputs (top) and the two predicted capsules decoded (red, green); labels above, then "
       "the decoded classes")
  absent_lengths = np.where(np.eye(model.num_classes, dtype=bool)[labels].any(axis=1),
                            -np.inf, np.asarray(out.lengths))
  forced = np.stack([labels[:, 0], absent_lengths.argmax(axis=1)], axis=1)
  save("forced_reconstructions", np.asarray(model.decode(out.class_capsules, jnp.asarray(forced))),
       forced, "a present class (red) and a class not present (green, the paper's *): what the "
       "capsule of an absent class decodes to")
