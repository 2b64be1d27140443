"""Which examples a run got right: its predictions per example, kept beside its results, so
that two setups can be compared on the same examples (:mod:`capsjax.stats.paired`).

A run's final evaluation writes ``WORKDIR/predictions.npz``; ``capsjax.evaluate`` writes
``WORKDIR/evaluation_predictions.npz`` for the checkpoint it evaluated. Each holds, for every
evaluation of a split as it is (``type="split"``: ``test``, ``validation``), one row per
example in the order evaluated:

=====================  ==================  ================================================
``NAME/id``            int64 ``(n,)``      the example's position in its source's split
                                           (:attr:`capsjax.datasets.Split.ids`: MNIST's IDX
                                           order, wherever a sample put it)
``NAME/label``         int ``(n,)``        its label (``(n, k)``: k labels, MultiMNIST)
``NAME/predicted``     int ``(n,)``        the class of the highest score (``(n, k)``: the k
                                           highest, ties to the lower class)
``NAME/correct``       bool ``(n,)``       the model's own accuracy of the example
``NAME/scores``        float32 ``(n, c)``  its class scores (capsule lengths, logits)
``NAME/digest``        uint64 ``(n,)``     a hash of the example as evaluated (its arrays:
                                           pixels and label): two runs pair an example only
                                           where ids and digests agree
``NAME/wrong_images``  uint8 ``(m, ...)``  the images of the first ``m <= 256``
``NAME/wrong_ids``     int64 ``(m,)``      misclassified examples by id, for figures of
                                           disagreements (none where examples hold no
                                           images: MultiMNIST's pairs)
``meta``               JSON text           ``{"format", "step", "selected_on", "dataset",
                                           "source", "evaluations": {NAME: {"size",
                                           "source_size"}}}``
=====================  ==================  ================================================

``source`` is ``config.data.source`` (``"idx"``: the original files' order; ``"tfds"``:
tensorflow-datasets' order, which its writer chose by hashing keys; ``null``: a builder that
generates or reads its own). Host-side NumPy only; a file is written whole or not at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile
import zlib

import numpy as np

from capsjax.common import files
from capsjax.common.errors import UsageError

FORMAT = 1
RUN_FILE = "predictions.npz"              # The run's final parameters.
EVALUATE_FILE = "evaluation_predictions.npz"  # What capsjax.evaluate evaluated.
MAX_WRONG_IMAGES = 256
FIELDS = ("id", "label", "predicted", "correct", "scores", "digest", "wrong_images", "wrong_ids")


@dataclasses.dataclass
class Predictions:
  """One evaluation's predictions, one row per example (the module docstring's arrays), and
  ``source_size``: the size of the source split the ids index (its halves: ids below and from
  ``source_size // 2``)."""
  id: np.ndarray
  label: np.ndarray
  predicted: np.ndarray
  correct: np.ndarray
  scores: np.ndarray
  digest: np.ndarray
  wrong_images: np.ndarray
  wrong_ids: np.ndarray
  source_size: int

  def __len__(self) -> int:
    return len(self.id)

  @classmethod
  def of(cls, split, scores: np.ndarray, correct: np.ndarray, labels: np.ndarray,
         labels_per_example: int = 1) -> "Predictions":
    """The predictions of a model whose class scores on ``split`` (a
    :class:`capsjax.datasets.Split`) are ``scores`` ``(n, c)``, whose accuracy per example is
    ``correct`` ``(n,)``, against ``labels`` ``(n,)`` or ``(n, k)`` (the batches')."""
    labels = np.asarray(labels)
    images = np.asarray(split.examples.get("images", np.zeros((len(labels), 0), np.uint8)))
    scores = np.asarray(scores, np.float32)
    correct = np.asarray(correct) > 0.5
    ids = np.asarray(split.source_ids(), np.int64)
    wrong = np.flatnonzero(~correct)
    wrong = wrong[np.argsort(ids[wrong], kind="stable")][:MAX_WRONG_IMAGES]
    return cls(id=ids, label=labels, predicted=predicted_classes(scores, labels_per_example),
               correct=correct, scores=scores, digest=digests(split.examples),
               wrong_images=images[wrong], wrong_ids=ids[wrong], source_size=split.source_count())


def predicted_classes(scores: np.ndarray, labels_per_example: int = 1) -> np.ndarray:
  """The class of the highest score ``(n,)``, or the ``k`` highest ``(n, k)`` in order of
  score; ties go to the lower class (as ``jnp.argmax`` and ``lax.top_k``)."""
  order = np.argsort(-np.asarray(scores), axis=-1, kind="stable")
  return order[:, 0] if labels_per_example == 1 else order[:, :labels_per_example]


def digests(examples: dict[str, np.ndarray]) -> np.ndarray:
  """A 64-bit BLAKE2b hash of each example's arrays (``{name: (n, ...)}``: its pixels and
  label, or MultiMNIST's pair of digit indices), ``(n,)`` uint64: equal digests say two runs
  evaluated the same example."""
  rows = [np.ascontiguousarray(examples[name]).reshape(len(examples[name]), -1)
          for name in sorted(examples)]
  return np.array([int.from_bytes(hashlib.blake2b(
      b"".join(r[k].tobytes() for r in rows), digest_size=8).digest(), "little")
                   for k in range(len(rows[0]))], np.uint64)


def write(path: str, predictions: dict[str, Predictions], what: str = "the predictions",
          **meta) -> None:
  """``{evaluation name: Predictions}`` and ``meta`` (JSON-able: step, selected_on, dataset,
  source) into ``path``, atomically; ``what``: their name in a failed write's error."""
  arrays, sizes = {}, {}
  for name, p in predictions.items():
    if "/" in name:
      raise ValueError(f"evaluation name {name!r} holds '/'")
    arrays.update({f"{name}/{field}": getattr(p, field) for field in FIELDS})
    sizes[name] = {"size": len(p), "source_size": int(p.source_size)}
  arrays["meta"] = np.array(json.dumps({"format": FORMAT, **meta, "evaluations": sizes}))
  with files.atomic_write(path, "wb", what=what) as f:
    np.savez_compressed(f, **arrays)


def read(path: str) -> tuple[dict[str, Predictions], dict]:
  """``({evaluation name: Predictions}, meta)`` from a file :func:`write` wrote; a missing or
  damaged one is a UsageError naming it."""
  if not os.path.isfile(path):
    raise UsageError(f"{path} does not exist: runs write it at their end since capsjax "
                     "kept predictions (2026-11-28). Rerun the run's command on its workdir "
                     "(a finished run evaluates again and writes it) or run python -m "
                     f"capsjax.evaluate --workdir={os.path.dirname(path) or '.'}.")
  try:
    with np.load(path, allow_pickle=False) as stored:
      arrays = {key: stored[key] for key in stored.files}
    meta = json.loads(str(arrays.pop("meta")))
    found = {name: Predictions(**{field: arrays[f"{name}/{field}"] for field in FIELDS},
                               source_size=int(sizes["source_size"]))
             for name, sizes in meta["evaluations"].items()}
  except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile,
          zlib.error) as e:  # zlib's: bytes damaged inside a compressed array.
    kind = type(e).__name__ if type(e).__module__ == "builtins" else (
        f"{type(e).__module__}.{type(e).__name__}")  # zlib.error, zipfile.BadZipFile.
    raise UsageError(f"{path} is damaged or not a capsjax predictions file ({kind}: {e}). Move "
                     "it aside and run python -m capsjax.evaluate on its workdir to write it "
                     "again.") from e
  return found, meta
