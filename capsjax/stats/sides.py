"""What two compared sides are, and the warnings where their comparison is not what it seems.

A comparison says what it compared: each side's model, data, budget (steps, epochs), the
examples each run evaluated and its accuracy on them beside chance, the settings in which the
two sides differ (from their ``config.json``, resolved and without the settings declared
neutral: :func:`capsjax.config.history.config_changes`, which the callers hand in),
and the examples each seed pair shares. It warns where

- the sides differ in more than the setting compared (a sweep's swept keys, the settings of
  the point names ``capsjax.compare`` was given, or else any one setting): a difference is then
  not the effect of that setting;
- the examples a seed pair shares are fewer than either run evaluated: the comparison is on
  the shared ones only;
- a side's accuracy is within :data:`NEAR_CHANCE` of chance: it has barely learnt, and a
  difference from it says little about the setting.

Reads ``summary.json`` and ``config.json`` (:mod:`capsjax.runs`); host-side only.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from capsjax.common import files
from capsjax.config import runconfig
from capsjax.runs.predictions import Predictions
from capsjax.stats import spread

NEAR_CHANCE = 0.05  # A side this close to chance (5 points of accuracy) is warned of.
SHOWN = 6  # Settings a warning names (all are listed above it).
CONFIG_KEY = "config"  # A sweep key that swaps a point's config file: any setting may differ.


@dataclasses.dataclass
class Side:
  """One side of a comparison: its runs as they were trained and evaluated.

  Attributes:
    spec: how the side was named (a workdir, ``SWEEP_DIR:SETTING``, a row of a sweep).
    seeds: each run's seed.
    model: the model's name and parameter count (``capsnet, 123,808 parameters``).
    data: the dataset and its source (``mnist (idx)``).
    steps, epochs: each run's steps trained and epochs (None where not recorded).
    examples: the examples each run evaluated (its predictions).
    accuracies: each run's accuracy on them.
    chance: the accuracy of guessing (None where the run did not record it).
  """
  spec: str
  seeds: list
  model: str
  data: str
  steps: list
  epochs: list
  examples: list[int]
  accuracies: list[float]
  chance: float | None

  @classmethod
  def read(cls, spec: str, runs: list[tuple[object, str, Predictions]]) -> "Side":
    """From ``[(seed, workdir, the evaluation's predictions)]``."""
    summaries = [_summary(workdir) for _, workdir, _ in runs]
    summary = summaries[0]
    # For display only: the config.json as recorded (a run of another version or model may
    # lack a key, shown as "?"), not settings to run with.
    recorded = runconfig.flatten(runconfig.read_raw(runs[0][1]) or {})
    model = recorded.get("model.name", "?")
    params = summary.get("num_params")
    chance = (summary.get("chance") or {}).get("accuracy")
    return cls(
        spec=spec, seeds=[seed for seed, _, _ in runs],
        model=f"{model}, {params:,} parameters" if isinstance(params, int) else str(model),
        data=f"{recorded.get('dataset', '?')} ({recorded.get('data.source') or 'its own files'})",
        steps=[s.get("step") for s in summaries], epochs=[s.get("epochs") for s in summaries],
        examples=[len(p) for _, _, p in runs],
        accuracies=[float(np.mean(p.correct)) if len(p) else float("nan") for _, _, p in runs],
        chance=float(chance) if chance is not None else None)

  @property
  def accuracy(self) -> float:
    return float(np.mean(self.accuracies))

  def budget(self) -> str:
    """``300 steps, 9.38 epochs`` (a range where runs differ)."""
    steps = _range([s for s in self.steps if s is not None])
    epochs = _range([round(e, 2) for e in self.epochs if e is not None])
    return ", ".join(part for part in (steps and f"{steps} steps", epochs and f"{epochs} epochs")
                     if part) or "not recorded"

  def accuracy_text(self) -> str:
    """``89.15 ± 2.05 (chance 10.00)``: accuracy (%) on its own examples, mean ± std over runs."""
    chance = "?" if self.chance is None else f"{100 * self.chance:.2f}"
    return f"{spread.mean_pm(*spread.mean_std(self.accuracies))} (chance {chance})"


def _summary(workdir: str) -> dict:
  path = os.path.join(workdir, "summary.json")
  return files.read_json(path, "Rerun the run's command on its workdir to write it again.") if (
      os.path.exists(path)) else {}


def _range(values) -> str:
  if not values:
    return ""
  low, high = min(values), max(values)
  text = lambda v: f"{v:,}" if isinstance(v, int) else f"{v:g}"
  return text(low) if low == high else f"{text(low)}-{text(high)}"


def warnings(a: Side, b: Side, differing: list[str], compared: set[str] | None,
             own: list[tuple[int, int]], shared: list[int], labels: list) -> list[str]:
  """The warnings of the module docstring.

  ``differing``: ``"key: A's -> B's"`` per setting in which the sides differ (seed left out);
  ``compared``: the settings the comparison is about (None: unknown, any one may differ);
  ``own``, ``shared``, ``labels``: per seed pair, the examples each run evaluated, those both
  did, and the pair's label."""
  found = []
  keys = [line.partition(":")[0] for line in differing]
  if compared is None:
    extra = keys if len(keys) > 1 else []
  elif CONFIG_KEY in compared:
    extra = []  # The point's config file is the setting compared: it sets the others.
  else:  # A setting compared is named dotted, or by its last part as point names shorten it.
    extra = [k for k in keys if k not in compared and k.rsplit(".", 1)[-1] not in compared]
  if extra:
    about = ("" if compared is None else f" ({', '.join(sorted(compared))})" if compared else "")
    # Settings both sides have first: one that only one side has follows from another (a model's
    # own settings from model.name).
    shown = sorted((line for line in differing if line.partition(":")[0] in extra),
                   key=lambda line: "'(unset)'" in line)
    more = (f"; and {len(shown) - SHOWN} more (above)" if len(shown) > SHOWN else "")
    found.append(f"the sides differ in more than the setting compared{about}: "
                 + "; ".join(shown[:SHOWN]) + more
                 + ". A difference between them is not the effect of any one setting.")
  for label, (own_a, own_b), n in zip(labels, own, shared):
    if n < max(own_a, own_b):
      found.append(f"seed pair {label} is compared on the {n:,} examples both runs evaluated, "
                   f"of A's {own_a:,} and B's {own_b:,} (the whole test set on both sides: "
                   "--config.data.test_limit=0).")
  for name, side in (("A", a), ("B", b)):
    if side.chance is not None and side.accuracy - side.chance < NEAR_CHANCE:
      found.append(f"{name}'s accuracy {100 * side.accuracy:.2f}% is within "
                   f"{100 * NEAR_CHANCE:.0f} points of chance ({100 * side.chance:.2f}%): it "
                   "has barely learnt, and a difference from it says little about the setting.")
  return found


LISTED = 6  # More settings that differ than this are listed one per line.


def settings_text(differing: list[str]) -> list[str]:
  """The settings that differ (``"key: A's -> B's"``): a few on one line; more (a CapsNet
  against the CNN differs in dozens) one per line, by section."""
  head = "Settings that differ (A -> B; seeds and settings declared neutral left out)"
  if len(differing) <= LISTED:
    return [f"{head}: {'; '.join(differing) if differing else 'none'}."]
  return [f"{head}, {len(differing)}:", "", *(f"- {line}" for line in sorted(differing)), ""]


def markdown(a: Side, b: Side, differing: list[str], own: list[tuple[int, int]],
             shared: list[int], warned: list[str], evaluation: str = "test") -> str:
  """What was compared, as text: a table of the two sides, the settings that differ, the
  examples shared and each side's own, and the warnings."""
  seeds = lambda side: f"{len(side.seeds)} ({', '.join(map(str, side.seeds))})"
  own_a, own_b = [o[0] for o in own], [o[1] for o in own]
  lines = [
      "What was compared:", "",
      "| | A | B |", "|---|---|---|",
      f"| side | {a.spec} | {b.spec} |",
      f"| runs (seeds) | {seeds(a)} | {seeds(b)} |",
      f"| model | {a.model} | {b.model} |",
      f"| data | {a.data} | {b.data} |",
      f"| budget | {a.budget()} | {b.budget()} |",
      f"| {evaluation} examples evaluated, per run | {_range(a.examples)} | "
      f"{_range(b.examples)} |",
      f"| {evaluation} accuracy (%) on them, mean ± std over runs | {a.accuracy_text()} | "
      f"{b.accuracy_text()} |", "",
      *settings_text(differing),
      f"Examples compared: {_range(shared)} per seed pair, those both runs evaluated (A's own "
      f"{_range(own_a)}, B's own {_range(own_b)}).", ""]
  lines += [f"Warning: {w}" for w in warned]
  return "\n".join(lines + ([""] if warned else [])) + "\n"
