"""Where metrics go: ``metrics.jsonl``, TensorBoard events and a console progress bar."""

from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np

from capsjax.common import files


def _tensorboardx():
  """tensorboardX's summary protos and its synchronous event-file writer (TensorBoard events without
  TensorFlow), imported without PyTorch: where PyTorch is installed, ``import tensorboardX`` imports
  it (2 s of every run's start on the 2-core CPU, 0.3 s without) only to accept torch tensors, and
  capsjax writes numbers and NumPy arrays. A ``torch`` already imported is left as it is."""
  if "torch" not in sys.modules:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects.
    try:
      return _tensorboardx()
    finally:
      del sys.modules["torch"]
  from tensorboardX import summary
  from tensorboardX.event_file_writer import EventsWriter
  from tensorboardX.proto import event_pb2
  return summary, EventsWriter, event_pb2


class EventFile:
  """TensorBoard's event file in ``folder``, written in the caller's thread: a failed write
  (a full disk) is raised where it happens, named (:class:`capsjax.common.files.Writes`).
  tensorboardX's ``SummaryWriter`` writes from a thread of its own, which such an error ends
  with a traceback, and which then blocks the run once its queue of events is full."""

  def __init__(self, folder: str):
    self._summary, events_writer, self._event_pb2 = _tensorboardx()
    self._writes = files.Writes(folder, "TensorBoard events")
    with self._writes():
      os.makedirs(folder, exist_ok=True)
      self._events = events_writer(os.path.join(folder, "events"))

  def _add(self, summary, step: int) -> None:
    event = self._event_pb2.Event(summary=summary, wall_time=time.time(), step=int(step))
    with self._writes():
      self._events.write_event(event)

  def add_scalar(self, tag: str, value: float, step: int) -> None:
    self._add(self._summary.scalar(tag, value), step)

  def add_image(self, tag: str, image: np.ndarray, step: int, dataformats: str = "HWC") -> None:
    self._add(self._summary.image(tag, image, dataformats=dataformats), step)

  def flush(self) -> None:
    with self._writes():
      self._events.flush()

  def close(self) -> None:
    with self._writes.closing():
      self._events.close()


class MetricWriter:
  """Appends one JSON object per event to ``WORKDIR/metrics.jsonl`` and mirrors
  scalars and images to TensorBoard (``WORKDIR/tensorboard``). metrics.jsonl is opened at
  its first record (an evaluation drawing figures into another folder writes images only).
  A failed write (a full disk, a read-only folder) is raised naming the file
  (:class:`capsjax.common.files.Writes`); :meth:`close` after one does not raise it again.

  Only process 0 of a multi-host job should make one.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._writes = files.Writes(self.path, "the metrics log")
    self._jsonl = None
    self._tb = EventFile(os.path.join(workdir, "tensorboard"))

  def write(self, kind: str, step: int, metrics: dict) -> None:
    """``kind`` is "train" or an evaluation's name; values are floats, lists (e.g. one per
    routing iteration) or dicts of floats (e.g. accuracy by shift)."""
    record = {"kind": kind, "step": int(step), "time": time.time()}
    for key, value in metrics.items():
      if isinstance(value, dict):
        record[key] = {k: float(v) for k, v in value.items()}
        for k, v in value.items():
          self._tb.add_scalar(f"{kind}/{key}/{k}", float(v), step)
        continue
      value = np.asarray(value)
      record[key] = value.tolist()
      if value.ndim == 0:
        if not np.isfinite(value):  # E.g. a rate with no timed step yet: left out, not NaN.
          record[key] = None
          continue
        self._tb.add_scalar(f"{kind}/{key}", float(value), step)
      else:  # Per-iteration routing diagnostics: one scalar per entry.
        for k, v in enumerate(value.reshape(-1)):
          self._tb.add_scalar(f"{kind}/{key}/{k + 1}", float(v), step)
    with self._writes():
      if self._jsonl is None:
        self._jsonl = open(self.path, "a", buffering=1)
      self._jsonl.write(json.dumps(record) + "\n")

  def write_image(self, tag: str, step: int, image: np.ndarray) -> None:
    """``image``: ``(h, w, c)`` floats in [0, 1]."""
    self._tb.add_image(tag, np.clip(image, 0, 1), step, dataformats="HWC")

  def flush(self) -> None:
    if self._jsonl is not None:
      with self._writes():
        self._jsonl.flush()
    self._tb.flush()

  def close(self) -> None:
    try:
      if self._jsonl is not None:
        with self._writes.closing():
          self._jsonl.close()
    finally:
      self._tb.close()


def log(text: str) -> None:
  """Prints on process 0 only (every process of a multi-host job runs the same code)."""
  import jax

  if jax.process_index() == 0:
    print(text, flush=True)


def chance_text(chance: dict | None) -> str:
  """Chance levels (``summary["chance"]``) in the terms of results tables, in %: ``error
  90.00`` for one label, ``error 97.78, at least one 37.78`` for two (random guessing)."""
  if not chance:
    return "?"
  text = f"error {100 * (1 - chance['accuracy']):.2f}"
  if "at_least_one" in chance:
    text += f", at least one {100 * chance['at_least_one']:.2f}"
  return text


def read_metrics(workdir: str) -> list[dict]:
  """All records of ``WORKDIR/metrics.jsonl``; a torn last line (crash) is skipped."""
  path = os.path.join(workdir, "metrics.jsonl")
  records = []
  if os.path.exists(path):
    with open(path, errors="replace") as f:  # A damaged line is skipped, not fatal.
      for line in f:
        try:
          records.append(json.loads(line))
        except json.JSONDecodeError:
          continue
  return records


def is_finished(workdir: str) -> bool:
  """Whether ``WORKDIR/summary.json`` says the run trained all its steps or stopped at
  ``train.stop_at_accuracy``."""
  path = os.path.join(workdir, "summary.json")
  if not os.path.exists(path):
    return False
  try:
    with open(path) as f:
      summary = json.load(f)
  except (OSError, ValueError) as e:  # Damaged: the run is resumed, which rewrites it.
    log(f"Warning: {path} cannot be read ({type(e).__name__}: {e}); the run counts as "
        "unfinished, and running it again rewrites it from its last checkpoint.")
    return False
  return summary.get("step") == summary.get("num_steps") or bool(summary.get("stopped_at_accuracy"))


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def is_terminal(stream) -> bool:
  return hasattr(stream, "isatty") and stream.isatty()


def count_progress(prefix: str, n: int, total: int, stream=None) -> None:
  """``prefix n/total``: redrawn in place on a terminal, one line per update otherwise (a log
  file then reads line by line)."""
  stream = stream or sys.stderr
  end = "\n" if n >= total or not is_terminal(stream) else ""
  stream.write(("\r" if is_terminal(stream) else "") + f"{prefix} {n}/{total}{end}")
  stream.flush()


class ProgressBar:
  """``step 1200/23400 [##---] 5% | loss 0.031 | acc 98.4% | 160 img/s | ETA 0:38:10``.

  Redraws one line on a terminal; prints a line per update otherwise (logs), and always with
  a ``label`` (several runs of one program each print theirs, ``[label] step ...``).
  """

  def __init__(self, total_steps: int, stream=None, width: int = 20, label: str | None = None):
    self.total = max(1, total_steps)
    self.stream = stream or sys.stderr
    self.width = width
    self.prefix = f"[{label}] " if label else ""
    self.interactive = is_terminal(self.stream) and not label

  def update(self, step: int, loss: float, accuracy: float, images_per_second: float,
             seconds_per_step: float) -> None:
    frac = min(1.0, step / self.total)
    filled = int(round(frac * self.width))
    eta = (self.total - step) * seconds_per_step
    rate = f"{images_per_second:.0f}" if math.isfinite(images_per_second) else "?"
    line = (f"{self.prefix}step {step}/{self.total} [{'#' * filled}{'-' * (self.width - filled)}] "
            f"{100 * frac:3.0f}% | loss {loss:.4f} | acc {100 * accuracy:.1f}% | "
            f"{rate} img/s | ETA {format_duration(eta)}")
    self.stream.write("\r" + line if self.interactive else line + "\n")
    self.stream.flush()

  def message(self, text: str) -> None:
    """A line that does not overwrite the bar."""
    self.stream.write(("\n" if self.interactive else "") + self.prefix + text + "\n")
    self.stream.flush()

  def close(self) -> None:
    if self.interactive:
      self.stream.write("\n")
      self.stream.flush()
