"""PNG figures of a run: reconstructions, latent perturbations (Fig. 4), curves, routing."""

from __future__ import annotations

import os
import sys

import numpy as np

from capsjax.common import files

PERTURBATIONS = np.round(np.arange(-0.25, 0.25 + 1e-9, 0.05), 2)  # Paper, Sec. 5.1: 11 values.


def pyplot():
  """``matplotlib.pyplot``, imported when the first figure is drawn (a command that draws none
  does not spend the 0.4 s), on the Agg backend (no display on servers) unless pyplot was
  imported before with a backend of its own (a notebook's, which saving a PNG does not need)."""
  if "matplotlib.pyplot" not in sys.modules:
    import matplotlib

    matplotlib.use("Agg")  # Must precede pyplot's import.
  import matplotlib.pyplot

  return matplotlib.pyplot


def save(fig, path: str) -> None:
  """Writes ``fig`` as a PNG at ``path`` through a temporary file (a full disk or a crash
  leaves the earlier figure whole; its error names the figure) and closes it."""
  try:
    with files.atomic_write(path, "wb", what=f"figure {os.path.basename(path)}") as f:
      fig.savefig(f, format="png", dpi=100, bbox_inches="tight")
  finally:
    pyplot().close(fig)


def tile(images: np.ndarray) -> np.ndarray:
  """``(rows, cols, h, w, c)`` -> one ``(rows*h, cols*w, c)`` image with 1-px gaps."""
  rows, cols, h, w, c = images.shape
  gapped = np.pad(np.asarray(images, np.float32), [(0, 0), (0, 0), (0, 1), (0, 1), (0, 0)],
                  constant_values=1)  # A gap after each image, the last ones' cut off below.
  return gapped.transpose(0, 2, 1, 3, 4).reshape(rows * (h + 1), cols * (w + 1), c)[:-1, :-1]


def displayable(images: np.ndarray) -> np.ndarray:
  """``(..., h, w, c)`` images as grey or RGB in [0, 1]: channels other than 1 or 3 (e.g.
  smallNORB's two stereo views) side by side, and values outside [0, 1] (standardised
  images) stretched to it per image."""
  images = np.asarray(images, np.float32)
  if images.shape[-1] not in (1, 3):
    images = np.concatenate(np.split(images, images.shape[-1], axis=-1), axis=-2)
  if images.size and (images.min() < 0 or images.max() > 1):
    low = images.min(axis=(-3, -2, -1), keepdims=True)
    high = images.max(axis=(-3, -2, -1), keepdims=True)
    images = (images - low) / np.maximum(high - low, 1e-12)
  return images


def _show(ax, image):
  image = np.clip(image, 0, 1)
  if image.shape[-1] == 1:
    ax.imshow(image[..., 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
  else:
    ax.imshow(image, interpolation="nearest")
  ax.set(xticks=[], yticks=[])


def reconstruction_grid(images: np.ndarray, reconstructions: np.ndarray) -> np.ndarray:
  """Inputs (top row) over their reconstructions (bottom row), as one image."""
  return tile(np.stack([images, reconstructions]))


def save_reconstructions(path: str, images, reconstructions, labels, predictions) -> None:
  """Top: inputs with (label, prediction); bottom: reconstruction from the predicted capsule."""
  fig, ax = pyplot().subplots(figsize=(1.2 * len(images), 2.8))
  _show(ax, reconstruction_grid(images, reconstructions))
  ax.set_title("inputs (top) and reconstructions (bottom); (label, prediction): "
               + " ".join(f"({l},{p})" for l, p in zip(labels, predictions)), fontsize=8)
  save(fig, path)


def save_latent_perturbations(path: str, decoded: np.ndarray, label: int) -> None:
  """Paper Fig. 4: ``decoded`` is ``(capsule_dim, len(PERTURBATIONS), h, w, c)``."""
  fig, ax = pyplot().subplots(figsize=(0.6 * decoded.shape[1] + 1, 0.6 * decoded.shape[0] + 0.8))
  _show(ax, tile(decoded))
  ax.set_xlabel("perturbation " + " ".join(f"{p:+.2f}" for p in PERTURBATIONS), fontsize=7)
  ax.set_ylabel("capsule dimension (1 at top)")
  ax.set_title(f"Each dimension of the class-{label} capsule tweaked by -0.25..+0.25")
  save(fig, path)


def save_training_curves(path: str, records: list[dict]) -> None:
  save(training_curves(records), path)


def training_curves(records: list[dict]):
  """Loss and error against step for the train, validation and test records of ``metrics.jsonl``: a
  figure with two axes, one line per kind. The train line is drawn without markers only when it has
  many points: a short run's one or two train records would otherwise not show."""
  fig, (ax_loss, ax_acc) = pyplot().subplots(1, 2, figsize=(11, 4))
  for kind, style in (("train", "-"), ("validation", "o-"), ("test", "s-")):
    rows = [r for r in records if r.get("kind") == kind and "loss" in r]
    if not rows:
      continue
    if kind == "train" and len(rows) < 50:
      style = ".-"
    steps = [r["step"] for r in rows]
    ax_loss.plot(steps, [r["loss"] for r in rows], style, label=kind, markersize=3)
    ax_acc.plot(steps, [100 * (1 - r["accuracy"]) for r in rows], style, label=kind, markersize=3)
  ax_loss.set(xlabel="step", ylabel="loss", yscale="log", title="loss")
  ax_acc.set(xlabel="step", ylabel="error (%)", yscale="log", title="classification error")
  for ax in (ax_loss, ax_acc):
    ax.grid(alpha=0.3)
    ax.legend()
  return fig


# Axis labels of the diagnostics the routers in capsjax.routing supply; others by their name.
DIAGNOSTIC_LABELS = {
    "coupling_entropy": "mean entropy of c_i (nats)",
    "coupling_max": "mean largest c_ij",
    "logit_change": "mean |b^r - b^(r-1)|",
    "preactivation_norm": "mean |s_j|",
    "agreement": "mean agreement",
    "pose_change": "mean |p^r - p^(r-1)|",
    "parent_activation_max": "mean largest parent activation",
}


def routing_diagnostic_names(record: dict) -> list[str]:
  """The per-iteration routing diagnostics of a metrics record: its list-valued entries
  (one value per routing iteration), in the record's order."""
  return [k for k, v in record.items() if isinstance(v, list) and v
          and all(isinstance(x, (int, float)) for x in v)]


def change_text(values) -> str:
  """``2.3026 -> 2.301 (-0.07%)``: a series' first and last values and the change between
  them relative to the first, so that a figure says how large a change is."""
  first, last = float(values[0]), float(values[-1])
  if not first:
    return f"{first:.5g} -> {last:.5g}"
  percent = 100 * (last - first) / abs(first)
  return f"{first:.5g} -> {last:.5g} ({percent:{'+.0f' if abs(percent) >= 10 else '+.2g'}}%)"


def save_routing_diagnostics(path: str, records: list[dict]) -> None:
  """One panel per routing diagnostic the router supplied (cf. Fig. A.1), over its
  iterations, from the last evaluation record that has any; nothing if none has. Each panel's
  title gives its first and last values and the change between them, and its axis spans at
  least 2% of the values, so that a tiny change looks tiny."""
  last = next((r for r in reversed(records) if routing_diagnostic_names(r)), None)
  if last is None:
    return
  names = routing_diagnostic_names(last)
  cols = min(len(names), 3)
  nrows = -(-len(names) // cols)
  fig, axes = pyplot().subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
  for ax, name in zip(axes.ravel(), names):
    values = last[name]
    iters = np.arange(1, len(values) + 1)
    ax.plot(iters, values, "o-")
    ax.set(xlabel="routing iteration", ylabel=DIAGNOSTIC_LABELS.get(name, name),
           title=f"{name}\n{change_text(values)}")
    low, high = min(values), max(values)
    pad = max(0.01 * max(abs(low), abs(high)), 0.05 * (high - low))
    if pad > 0:  # A change of 0.07% drawn as one, not stretched over the whole axis.
      ax.set_ylim(low - pad, high + pad)
    ax.set_xticks(iters)
    ax.grid(alpha=0.3)
  for ax in axes.ravel()[len(names):]:
    ax.axis("off")
  fig.suptitle(f"routing diagnostics, {last['kind']} set at step {last['step']}")
  fig.tight_layout()
  save(fig, path)


def save_examples(path: str, images: np.ndarray, labels, predictions, title: str,
                  per_row: int = 8) -> None:
  """A grid of test examples, each titled ``label -> prediction`` (red when wrong)."""
  n = len(images)
  rows = -(-n // per_row)
  fig, axes = pyplot().subplots(rows, per_row, figsize=(1.3 * per_row, 1.45 * rows + 0.4),
                                squeeze=False)
  for k, ax in enumerate(axes.ravel()):
    if k < n:
      _show(ax, images[k])
      ax.set_title(f"{int(labels[k])} -> {int(predictions[k])}", fontsize=8,
                   color="red" if int(labels[k]) != int(predictions[k]) else "black")
    else:
      ax.axis("off")
  fig.suptitle(title, fontsize=8)
  save(fig, path)


def overlay(pair: np.ndarray) -> np.ndarray:
  """Two grey images ``(..., 2, h, w, 1)`` as one RGB image ``(..., h, w, 3)``: the first in
  red, the second in green (yellow where they overlap), as in paper Fig. 5."""
  first, second = pair[..., 0, :, :, 0], pair[..., 1, :, :, 0]
  return np.clip(np.stack([first, second, np.zeros_like(first)], axis=-1), 0, 1)


def save_pair_reconstructions(path: str, images: np.ndarray, reconstructions: np.ndarray,
                              labels, decoded, title: str) -> None:
  """Paper Fig. 5: ``images`` ``(n, h, w, 1)`` (top) over the two ``reconstructions``
  ``(n, 2, h, w, 1)`` overlaid in red and green; the column titles show ``labels`` ``(n, 2)``, the
  true classes, and ``decoded`` ``(n, 2)``, the classes reconstructed (red, green)."""
  grey = np.repeat(np.clip(images, 0, 1), 3, axis=-1)
  fig, ax = pyplot().subplots(figsize=(1.3 * len(images), 3.0))
  _show(ax, tile(np.stack([grey, overlay(reconstructions)])))
  width = images.shape[2] + 1
  for k, (label, shown) in enumerate(zip(labels, decoded)):
    ax.text(k * width + width / 2, -2, f"{label[0]},{label[1]}\n"
            f"R{shown[0]} G{shown[1]}", ha="center", va="bottom", fontsize=7)
  ax.set_title(title, fontsize=8, pad=22)
  save(fig, path)


def save_attack_curves(path: str, epsilons, accuracies: dict[str, list[float]], chance: float,
                       title: str) -> None:
  """Accuracy under attack against the budget, one line per attack, chance dashed."""
  fig, ax = pyplot().subplots(figsize=(5, 3.5))
  for attack, values in accuracies.items():
    ax.plot(epsilons, values, marker="o", label=attack)
  ax.axhline(chance, color="gray", linestyle="--", label="chance")
  ax.set(xlabel="epsilon (L-infinity)", ylabel="accuracy under attack", ylim=(0, 1), title=title)
  ax.legend()
  save(fig, path)


def save_distance_histograms(path: str, clean: np.ndarray, attacked: dict[str, np.ndarray],
                             threshold: float, title: str) -> None:
  """Histograms of reconstruction distances, clean against each attack's (one panel per
  attack), and the detection threshold (DARCCC's figures)."""
  fig, axes = pyplot().subplots(1, len(attacked), figsize=(4 * len(attacked), 3.2), squeeze=False)
  for ax, (name, distances) in zip(axes[0], attacked.items()):
    bins = np.linspace(0, max(float(np.max(clean)), float(np.max(distances)), threshold) * 1.05, 40)
    ax.hist(clean, bins, alpha=0.6, label="clean")
    ax.hist(distances, bins, alpha=0.6, label=name)
    ax.axvline(threshold, color="black", linestyle="--", label="threshold")
    ax.set_xlabel("|input - reconstruction| (L2)")
    ax.legend(fontsize=7)
  axes[0][0].set_ylabel("images")
  fig.suptitle(title, fontsize=9)
  save(fig, path)


TRANSFORM_AXES = {"rotations": "rotation (degrees)", "scales": "scale",
                  "shears": "shear (x += k y)", "translations": "horizontal shift (px)"}


def save_transform_curves(path: str, curves: dict[str, tuple], chance: float,
                          familiar_degrees: float, title: str) -> None:
  """Accuracy against each transform's amount (``{kind: (values, accuracies)}``), one panel
  per kind, the familiar rotations shaded and chance dashed."""
  fig, axes = pyplot().subplots(1, len(curves), figsize=(3.6 * len(curves), 3.2), squeeze=False)
  for ax, (kind, (values, accuracies)) in zip(axes[0], curves.items()):
    ax.plot(values, accuracies, marker="o")
    ax.axhline(chance, color="gray", linestyle="--", label="chance")
    if kind == "rotations":
      ax.axvspan(-familiar_degrees, familiar_degrees, color="green", alpha=0.1, label="familiar")
      ax.legend(fontsize=7)
    ax.set(xlabel=TRANSFORM_AXES.get(kind, kind), ylim=(0, 1))
  axes[0][0].set_ylabel("accuracy")
  fig.suptitle(title, fontsize=9)
  save(fig, path)


def save_disagreements(path: str, panels: list[tuple[str, np.ndarray, list[str]]],
                       per_row: int = 8, title: str | None = None) -> None:
  """Examples two setups disagree on: ``panels`` is ``[(heading, images, captions)]``, each panel's
  images in rows of ``per_row`` under its heading (an empty panel's heading says why), all
  under ``title`` (which runs, which side is A)."""
  rows = [max(1, -(-len(images) // per_row)) for _, images, _ in panels]
  fig, axes = pyplot().subplots(sum(rows), per_row,
                                figsize=(1.4 * per_row, 1.5 * sum(rows) + 0.6), squeeze=False)
  top = 0
  for (heading, images, captions), n_rows in zip(panels, rows):
    images = displayable(images) if len(images) else images
    for k, ax in enumerate(axes[top:top + n_rows].ravel()):
      if k < len(images):
        _show(ax, images[k])
        ax.set_title(captions[k], fontsize=7)
      else:
        ax.axis("off")
    axes[top, 0].text(0, 1.35 if len(images) else 0.5, heading,
                      transform=axes[top, 0].transAxes, fontsize=9, ha="left", va="bottom")
    top += n_rows
  fig.subplots_adjust(hspace=0.9, top=1 - 0.9 / (1.5 * sum(rows) + 0.6) if title else None)
  if title:
    fig.suptitle(title, fontsize=9, wrap=True)
  save(fig, path)
