"""A sweep's results: ``results.csv``, ``results.md`` and plots from its finished runs.

One row per run and one table line per setting (mean ± std over seeds). A key that a point
does not set shows the value the run used (its ``config.json``, routers' defaults resolved),
so ``dynamic`` reads 3 iterations beside ``dynamic, 1``; ``–`` marks a setting that does not
apply to that run (a router without iterations). Plots: test error against each swept key,
one marker series per setting of the other keys.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib

from capsjax.common import figures, files
from capsjax.common.errors import UsageError
from capsjax.config import history, migrations, runconfig
from capsjax.runs import predictions
from capsjax.runs.reporting import chance_text, is_finished
from capsjax.stats import matched as matched_lib
from capsjax.stats import paired, sides, spread

RESULT_COLUMNS = ("test_accuracy", "test_error", "test_loss", "step", "selected_on",
                  "train_images_per_second", "num_params")
# Errors chosen during training, beside the result for comparison only (stats/chosen.py).
COMPARISON_COLUMNS = {
    "min_test_error": "min test error over evaluations (%; chosen on test: comparison only)",
    "validation_chosen_test_error": "test error at best validation (%; comparison only)",
}
CONFIG_KEY = "config"  # A point's own config file instead of the base config.
NOT_APPLICABLE = "–"  # In results.md: the run's config has no value for the key.


def format_value(value) -> str:
  return ("-".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value))


def config_label(spec: str) -> str:
  """``configs/affnist.py:baseline`` -> ``affnist:baseline`` (point names, tables)."""
  path, _, variant = spec.partition(":")
  return pathlib.Path(path).stem + (f":{variant}" if variant else "")


def shown_value(key: str, value) -> str:
  """A point's ``value`` of ``key`` as its name and the tables show it."""
  return config_label(value) if key == CONFIG_KEY else format_value(value)


def value_in_effect(run_config: dict | None, key: str) -> str:
  """The value of dotted ``key`` in a run's saved config, its router and optimiser defaults
  filled in (:func:`capsjax.config.history.comparable`); "" where the run has none (the setting
  does not apply, or no config.json)."""
  if run_config is None or key == CONFIG_KEY:
    return ""
  node = run_config
  for part in key.split("."):
    if not isinstance(node, dict) or part not in node:
      return ""
    node = node[part]
  return "" if node is None else format_value(node)


EXTRA_SUFFIXES = ("_accuracy", "_at_least_one")  # Columns of further evaluations.


def extra_evaluations(summary: dict) -> dict[str, float]:
  """``{"NAME_accuracy": ...}`` for each evaluation besides test (validation first), and
  ``NAME_at_least_one`` (test included) where there are several labels per example."""
  extra = {}
  evaluations = summary.get("evaluations", {})
  for name in sorted(evaluations, key=lambda n: n != "validation"):
    metrics = evaluations[name]
    if name != "test":
      extra[f"{name}_accuracy"] = metrics.get("accuracy")
    if "at_least_one" in metrics:
      extra[f"{name}_at_least_one"] = metrics["at_least_one"]
  return extra


def _is_extra(column: str) -> bool:
  return column.endswith(EXTRA_SUFFIXES) and column not in RESULT_COLUMNS


RESULTS = "the sweep's results"  # Their name in a failed write's error.


def collect(points: list, workdir: str, tables: dict | None = None,
            matched: dict | None = None, references: dict | None = None,
            paired_reference: dict | None = None, searched: bool = False) -> list[dict]:
  """Writes results.csv, results.md and plots from the finished runs' summaries.

  ``points``: the sweep's :class:`capsjax.sweep.Point` s; each run is ``WORKDIR/point.name``.
  ``tables`` (an experiment's ``TABLES``): ``{title: ["EVALUATION/KEY", ...]}``, each a further
  table in results.md, one column per metric (percent, mean ± std over seeds); ``matched`` (an
  experiment's ``MATCHED``): ``{"familiar", "novel", "target_errors"}``, the comparison at matched
  familiar error of :mod:`capsjax.stats.matched`; ``references`` (an experiment's ``REFERENCES``):
  ``{column title: function(setting) -> text}``, published numbers in columns beside the test error
  (``setting``: the row's ``{key: value as shown}``); ``paired_reference`` (an experiment's
  ``PAIRED_REFERENCE``): the settings of the row every other row is compared with, seed by seed on
  the same test examples (:func:`paired_table`). ``searched``: the points' values come from their
  search (:mod:`capsjax.training.search`), whose choices results.md gives after the main table.
  """
  if searched:
    from capsjax.training import search  # Optuna: only for a search.

    points = search.tuned_points(points, workdir)
  keys = list(dict.fromkeys(k for p in points for k in p.overrides))
  rows, missing, evaluations = [], [], {}
  for point in points:
    path = os.path.join(workdir, point.name, "summary.json")
    if not is_finished(os.path.join(workdir, point.name)):
      missing.append(point.name)
      continue
    with open(path) as f:
      summary = json.load(f)
    run_config = runconfig.read_raw(os.path.join(workdir, point.name))
    run_config = (history.comparable(migrations.migrate(run_config))
                  if run_config is not None else None)
    row = {"run": point.name, "seed": point.seed,
           **{k: shown_value(k, point.overrides[k]) if k in point.overrides
              else value_in_effect(run_config, k) for k in keys}}
    row.update({c: summary.get(c) for c in RESULT_COLUMNS})
    row["chance"] = chance_text(summary.get("chance"))
    row.update({c: summary.get("comparison_only", {}).get(c) for c in COMPARISON_COLUMNS})
    row.update(extra_evaluations(summary))
    rows.append(row)
    evaluations[point.name] = summary.get("evaluations", {})
  with files.writing(workdir, RESULTS):
    os.makedirs(workdir, exist_ok=True)
  extra = list(dict.fromkeys(k for row in rows for k in row if _is_extra(k)))
  with files.atomic_write(os.path.join(workdir, "results.csv"), newline="",
                          what=RESULTS) as f:
    writer = csv.DictWriter(f, fieldnames=["run", *keys, "seed", *RESULT_COLUMNS, "chance",
                                           *COMPARISON_COLUMNS, *extra])
    writer.writeheader()
    writer.writerows(rows)
  groups = _group(rows, keys)
  with files.atomic_write(os.path.join(workdir, "results.md"), what=RESULTS) as f:
    f.write(markdown_table(groups, keys, references))
    if searched:
      f.write("\n" + search.results_section(points, workdir))
    for title, metrics in (tables or {}).items():
      f.write(f"\n{title}\n\n" + metric_table(rows, keys, evaluations, metrics))
    if paired_reference:
      f.write("\n" + paired_table(rows, keys, workdir, paired_reference))
    if matched:
      finished = {row["run"]: os.path.join(workdir, row["run"]) for row in rows}
      f.write("\n" + matched_lib.matched_table(finished, **matched))
    if missing:
      f.write(f"\nNot finished ({len(missing)}): {', '.join(missing)}\n")
  _plot(groups, keys, workdir)
  if missing:
    print(f"{len(missing)} of {len(points)} runs not finished: {', '.join(missing)}")
  print(f"Wrote {os.path.join(workdir, 'results.csv')} ({len(rows)} runs) and results.md.")
  return rows


# Declared neutral (a resume may extend a run), but a comparison's budget: said where they differ.
BUDGET_KEYS = ("train.num_steps", "train.num_epochs", "train.stop_at_accuracy")


def differing_settings(workdir_a: str, workdir_b: str) -> list[str]:
  """``"key: A's -> B's"`` for each setting in which two runs' ``config.json`` differ, both
  resolved, their seeds and the settings declared neutral but the budget's left out
  (:func:`capsjax.config.history.config_changes`); none where either has none."""
  raw_a, raw_b = (runconfig.read_raw(w) for w in (workdir_a, workdir_b))
  if raw_a is None or raw_b is None:
    return []
  raw_b = migrations.migrate(raw_b)
  flat_a, flat_b = runconfig.flatten(migrations.migrate(raw_a)), runconfig.flatten(raw_b)
  budget = [f"{key}: {flat_a.get(key, '(unset)')!r} -> {flat_b.get(key, '(unset)')!r}"
            for key in BUDGET_KEYS if flat_a.get(key, "(unset)") != flat_b.get(key, "(unset)")]
  return sorted(budget + [line for line in history.config_changes(raw_a, raw_b)
                          if not line.startswith("seed:")])


def paired_table(rows: list[dict], keys: list[str], workdir: str, reference: dict) -> str:
  """Each setting (A) against the reference row (B), on the same test examples, the runs of
  one seed paired: the examples only A gets wrong and only B, McNemar's exact p per seed pair,
  the two verdicts (these trained models; the setup) and the seed pairs the difference needs
  (:mod:`capsjax.stats.paired`), and the warnings of :mod:`capsjax.stats.sides`. A setting
  whose runs kept no predictions (before 2026-11-28) says so."""
  shown = {k: shown_value(k, v) for k, v in reference.items()}
  groups = _group(rows, keys)
  matching = [g for g in groups if all(g["setting"].get(k) == v for k, v in shown.items())]
  title = ", ".join(f"{k}={v}" for k, v in shown.items())
  if len(matching) != 1:
    return (f"Paired against {title}: {len(matching)} rows have these settings (one is "
            "needed; PAIRED_REFERENCE).\n")

  def runs_of(group) -> dict:
    """``{seed: (workdir, test predictions or None)}`` of a row's runs."""
    members = [r for r in rows if all(r[k] == group["setting"][k] for k in keys)]
    found = {}
    for r in members:
      run_dir = os.path.join(workdir, r["run"])
      path = os.path.join(run_dir, predictions.RUN_FILE)
      found[r["seed"]] = (run_dir, predictions.read(path)[0].get("test")
                          if os.path.exists(path) else None)
    return found

  base = runs_of(matching[0])
  header = [*keys, *paired.ROW_HEADER, "warnings"]
  lines = [f"Paired against {title} (B, the reference; each other row is A), on the same test "
           "examples, the runs of each seed paired. Two verdicts (capsjax/stats/paired.py, "
           "capsjax/stats/seed_pairs.py): about *these trained models*, the test digits as the "
           "units and the trained runs fixed (McNemar's exact test per seed pair, combined by "
           "the sign-flip test over digits), and about *the setup*, the training runs as the "
           "units (the exact sign-flip test over seed pairs, beside a two-level bootstrap "
           "interval of the error difference over seed pairs and digits). A difference of "
           "setups is separated only by the setup's verdict.", "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for group in groups:
    if group is matching[0]:
      continue
    this = runs_of(group)
    seeds = sorted(s for s in set(this) & set(base)
                   if this[s][1] is not None and base[s][1] is not None)
    cells = [group["setting"][k] or NOT_APPLICABLE for k in keys]
    blank = [""] * (len(header) - len(keys) - 2)
    try:
      pairs = [(paired.pair_label(s, s), this[s][1], base[s][1]) for s in seeds]
      result = paired.compare(pairs) if seeds else None
    except UsageError as e:  # Other examples: said in the table, not a failed collect.
      cells += [str(len(seeds)), f"not comparable: {e}", *blank]
    else:
      if result is None:
        cells += ["0", "no predictions kept", *blank]
      else:
        a, b = (sides.Side.read(name, [(s, *side[s]) for s in seeds])
                for name, side in (("A", this), ("B", base)))
        warned = sides.warnings(a, b, differing_settings(this[seeds[0]][0], base[seeds[0]][0]),
                                set(keys), result.own, result.examples, result.seeds)
        cells += [*paired.row(result), " ".join(f"{w[0].upper()}{w[1:]}" for w in warned)
                  or "none"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def metric_table(rows: list[dict], keys: list[str], evaluations: dict[str, dict],
                 metrics: list[str]) -> str:
  """A markdown table of further metrics (``"EVALUATION/KEY"``, in percent): a line per
  setting, mean ± std over its seeds; ``?`` where no run has the metric."""
  def value(run, metric):
    evaluation, _, key = metric.partition("/")
    found = evaluations.get(run, {}).get(evaluation, {}).get(key)
    return found if isinstance(found, (int, float)) else None

  header = [*keys, "seeds", *metrics]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for group in _group(rows, keys):
    members = [r["run"] for r in rows if all(r[k] == group["setting"][k] for k in keys)]
    cells = []
    for metric in metrics:
      mean, std = spread.mean_std([value(run, metric) for run in members])
      cells.append("?" if mean != mean else spread.mean_pm(mean, std))
    lines.append("| " + " | ".join([*(group["setting"][k] or NOT_APPLICABLE for k in keys),
                                    str(group["seeds"]), *cells]) + " |")
  return "\n".join(lines) + "\n"


def _group(rows: list[dict], keys: list[str]) -> list[dict]:
  groups: dict[tuple, list[dict]] = {}
  for row in rows:
    groups.setdefault(tuple(row[k] for k in keys), []).append(row)
  out = []
  for setting, members in groups.items():
    mean_std = lambda columns: {c: spread.mean_std([m.get(c) for m in members]) for c in columns}
    stats = mean_std(("test_error", "test_loss", "train_images_per_second", *COMPARISON_COLUMNS))
    extra = mean_std(dict.fromkeys(c for m in members for c in m if _is_extra(c)))
    selected = sorted({str(m.get("selected_on") or "final") for m in members})
    out.append({"setting": dict(zip(keys, setting)), "seeds": len(members), **stats,
                "chance": members[0].get("chance", "?"), "selected_on": ", ".join(selected),
                "extra": extra})
  return out


def markdown_table(groups: list[dict], keys: list[str], references: dict | None = None) -> str:
  """Mean ± std over seeds per setting (the mean alone for one seed); beside the test error its
  chance level and how the numbers were chosen (:mod:`capsjax.training.restoring`);
  other evaluations' accuracies (and at-least-one rates) as extra columns; last, where runs
  logged them, the comparison-only errors chosen during training (:mod:`capsjax.stats.chosen`),
  headed as such."""
  extra = list(dict.fromkeys(c for g in groups for c in g["extra"]))
  compared = [c for c in COMPARISON_COLUMNS if any(g[c][0] == g[c][0] for g in groups)]  # Not NaN.
  references = references or {}
  header = [*keys, "seeds", "test error (%)", *references, "chance (%)", "selected on",
            "test loss", "train images/s", *(_extra_header(c) for c in extra),
            *(COMPARISON_COLUMNS[c] for c in compared)]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for g in groups:
    extra_cells = [spread.mean_pm(*g["extra"].get(c, (float("nan"), None))) for c in extra]
    lines.append("| " + " | ".join([*(g["setting"][k] or NOT_APPLICABLE for k in keys),
                                    str(g["seeds"]), spread.mean_pm(*g["test_error"]),
                                    *(str(ref(dict(g["setting"]))) for ref in
                                      references.values()),
                                    g["chance"], g["selected_on"],
                                    spread.mean_pm(*g["test_loss"], 1.0, 4),
                                    f"{g['train_images_per_second'][0]:.0f}", *extra_cells,
                                    *(spread.mean_pm(*g[c]) for c in compared)]) + " |")
  if any(not g["setting"][k] for g in groups for k in keys):
    lines.append(f"\n{NOT_APPLICABLE}: the setting does not apply to that run (e.g. a router "
                 "without it); keys a point does not set show the value the run used.")
  return "\n".join(lines) + "\n"


def _extra_header(column: str) -> str:
  for suffix, words in (("_accuracy", "accuracy"), ("_at_least_one", "at least one")):
    if column.endswith(suffix):
      return f"{column.removesuffix(suffix)} {words} (%)"
  return column


def _plot(groups: list[dict], keys: list[str], workdir: str) -> None:
  """For each swept key: test error against its values, one series per setting of the other keys;
  runs to which the key does not apply are left out of that plot. Numeric values are joined by
  lines; categories (router names), in the sweep's order, share one axis and are drawn as markers
  side by side. The error axis is logarithmic when the errors span more than a factor of ten."""
  if not groups:
    return

  plt = figures.pyplot()  # On the Agg backend.

  for key in keys:
    applicable = [g for g in groups if g["setting"][key]]
    if not applicable:
      continue
    others = [k for k in keys if k != key]
    values = list(dict.fromkeys(g["setting"][key] for g in applicable))  # The sweep's order.
    numeric = all(_sort_key(v)[0] == 0 for v in values)  # Every value a number.
    if numeric:
      values.sort(key=float)
    position = ({v: float(v) for v in values} if numeric else
                {v: float(i) for i, v in enumerate(values)})
    series: dict[tuple, list] = {}
    for g in applicable:
      series.setdefault(tuple(g["setting"][k] for k in others), []).append(g)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(values)), 4))
    errors = []
    for i, (label, members) in enumerate(series.items()):
      members.sort(key=lambda g: _sort_key(g["setting"][key]))
      offset = 0.0 if numeric else 0.1 * (i - (len(series) - 1) / 2)
      ys = [100 * g["test_error"][0] for g in members]
      errors += ys
      ax.errorbar([position[g["setting"][key]] + offset for g in members], ys,
                  yerr=[100 * (g["test_error"][1] or 0.0) for g in members], marker="o",
                  capsize=3, linestyle="-" if numeric else "none",
                  label=", ".join(f"{k.rsplit('.', 1)[-1]}={v or NOT_APPLICABLE}"
                                  for k, v in zip(others, label)) or None)
    if not numeric or len(values) <= 10:  # Ticks at the swept values only.
      ax.set_xticks([position[v] for v in values], values,
                    rotation=20 if not numeric and len(values) > 4 else 0)
    positive = [e for e in errors if e > 0]
    if positive and max(positive) > 10 * min(positive):
      ax.set_yscale("log")
    ax.set(xlabel=key, ylabel="test error (%)", title=f"test error vs {key} (mean ± std, seeds)")
    ax.grid(alpha=0.3)
    if others:
      ax.legend(fontsize=8)
    figures.save(fig, os.path.join(workdir, f"test_error_vs_{key.rsplit('.', 1)[-1]}.png"))


def _sort_key(value):
  try:
    return (0, float(value), "")
  except (TypeError, ValueError):
    return (1, 0.0, str(value))


