"""Comparisons at matched familiar error, as the matrix-capsules paper compares generalisation
to novel viewpoints (Hinton, Sabour & Frosst 2018, Sec. 5.1: each model's novel-view error at
the point where its familiar-view error reaches the other's).

A model that is simply trained longer is better on familiar and novel views alike, so the
novel error of two runs means something only beside their familiar error. For each run and
target, this takes the **first evaluation** (in ``metrics.jsonl``) at which the familiar
error is at or below the target, and reports the novel error of that same evaluation; a run
that never reaches the target has none.

Metrics are named ``"EVALUATION/KEY"``: ``test/accuracy`` (smallNORB's familiar-view test
set, the test split of a viewpoint-split run), ``novel_viewpoints/accuracy``,
``transforms/familiar_rotation_accuracy``, ``transforms/novel_rotation_accuracy``. The
familiar metric chooses the step, so it should not be the set whose result is reported: the
novel metric is never used to choose.

An experiment file may define ``MATCHED = dict(familiar=..., novel=..., target_errors=(...))``
and the sweep's ``results.md`` then holds the table (:mod:`capsjax.training.sweep_results`).
"""

from __future__ import annotations

import dataclasses

from capsjax.common.errors import UsageError
from capsjax.runs import reporting


@dataclasses.dataclass(frozen=True)
class Metric:
  """An accuracy of one evaluation, ``"EVALUATION/KEY"``."""
  evaluation: str
  key: str

  @classmethod
  def parse(cls, text: str) -> "Metric":
    evaluation, slash, key = text.partition("/")
    if not slash or not evaluation or not key:
      raise UsageError(f"Metric {text!r}: write it as 'EVALUATION/KEY', e.g. 'test/accuracy'.")
    return cls(evaluation, key)

  def __str__(self) -> str:
    return f"{self.evaluation}/{self.key}"


def error_curve(records: list[dict], metric: Metric) -> dict[int, float]:
  """``{step: 1 - accuracy}`` of ``metric`` over a run's records (the last record of a step
  where a resumed run evaluated it twice)."""
  return {r["step"]: 1.0 - r[metric.key] for r in records
          if r.get("kind") == metric.evaluation and r.get(metric.key) is not None}


def at_matched_error(records: list[dict], familiar: Metric, novel: Metric,
                     target_error: float) -> dict | None:
  """``{"step", "familiar_error", "novel_error"}`` at the first evaluation whose familiar
  error is at most ``target_error``; None if none is (or it has no novel error)."""
  familiar_errors, novel_errors = error_curve(records, familiar), error_curve(records, novel)
  step = min((s for s in familiar_errors if familiar_errors[s] <= target_error + 1e-9),
             default=None)  # The tolerance: 1 - 0.95 is 0.05000000000000004.
  if step not in novel_errors:
    return None
  return {"step": step, "familiar_error": familiar_errors[step], "novel_error": novel_errors[step]}


def matched_table(runs: dict[str, str], familiar: str, novel: str, target_errors) -> str:
  """A markdown table: per run (``{name: workdir}``) and target familiar error, the step, the
  familiar error reached and the novel error there."""
  familiar_metric, novel_metric = Metric.parse(familiar), Metric.parse(novel)
  lines = [f"Matched comparison: novel error ({novel}) at the first evaluation where the "
           f"familiar error ({familiar}) reaches each target.", "",
           "| run | target familiar error (%) | step | familiar error (%) | novel error (%) |",
           "|---|---|---|---|---|"]
  for name, workdir in runs.items():
    records = reporting.read_metrics(workdir)
    for target in target_errors:
      found = at_matched_error(records, familiar_metric, novel_metric, float(target))
      cells = (["not reached", "", ""] if found is None else
               [str(found["step"]), f"{100 * found['familiar_error']:.2f}",
                f"{100 * found['novel_error']:.2f}"])
      lines.append(f"| {name} | {100 * float(target):.2f} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
