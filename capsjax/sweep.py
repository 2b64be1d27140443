"""Runs an experiment: a grid or list of config overrides, times seeds; collects results.

  python -m capsjax.sweep experiments/routing_iterations.py --workdir=DIR [--config.* ...]
  python -m capsjax.sweep experiments/routing_iterations.py --workdir=DIR --list
  python -m capsjax.sweep experiments/routing_iterations.py --workdir=DIR --index=$K  # one point
  python -m capsjax.sweep experiments/routing_iterations.py --workdir=DIR --collect

An experiment file defines ``BASE_CONFIG`` (a config path relative to the
repository, optionally with ``:variant``) and ``get_sweep()``, returning a dict
with ``grid`` (``{dotted.key: [values]}``, crossed) or ``points`` (a list of
``{dotted.key: value}``), and ``seeds``. The key ``config`` swaps the base
config of a point for another config file, e.g. ``{"config":
"configs/affnist.py:baseline"}`` to compare two models. Command-line
``--config.*`` overrides apply to every run (``--config=...`` replaces the base
config). Each run has
its own sub-workdir ``DIR/<point>``; finished runs are skipped and unfinished
ones resume, so rerunning a sweep continues it. ``--index=K`` runs point K
only, for SLURM arrays or Kubernetes indexed jobs; ``--collect`` (also done
after a full run) writes ``results.csv``, ``results.md`` and plots.
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import math
import os
import pathlib
import re
import sys
from typing import NamedTuple

from absl import flags, logging
from ml_collections import config_flags

from capsjax import cli, files, preemption, workdirs
from capsjax.reporting import chance_text, is_finished
from capsjax.errors import UsageError

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULT_COLUMNS = ("test_accuracy", "test_error", "test_loss", "step", "selected_on",
                  "train_images_per_second", "num_params")


def load_experiment(path: str):
  """Imports an experiment file; checks it defines BASE_CONFIG and get_sweep()."""
  if not os.path.isfile(path):
    raise UsageError(f"Experiment file {path!r} not found (e.g. experiments/routing_iterations.py).")
  spec = importlib.util.spec_from_file_location(f"capsjax_experiment_{pathlib.Path(path).stem}",
                                                path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # Any error of the experiment file itself: say where it is.
    where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
    raise UsageError(f"Experiment file {path} could not be imported{where}: "
                     f"{type(e).__name__}: {e}. Fix the file and rerun.") from e
  for name in ("BASE_CONFIG", "get_sweep"):
    if not hasattr(module, name):
      raise UsageError(f"{path} must define {name}; see capsjax/sweep.py.")
  return module


def base_config_path(experiment_module, experiment_path: str) -> str:
  """BASE_CONFIG resolved against the repository root, then the experiment's folder."""
  path, _, variant = experiment_module.BASE_CONFIG.partition(":")
  for root in (REPO, pathlib.Path(experiment_path).resolve().parent):
    if (root / path).exists():
      return str(root / path) + (f":{variant}" if variant else "")
  raise UsageError(f"BASE_CONFIG {experiment_module.BASE_CONFIG!r} of {experiment_path} not found.")


class Point(NamedTuple):
  index: int
  overrides: dict   # dotted key -> value
  seed: int
  name: str


def expand(sweep: dict) -> list[Point]:
  """The sweep's points: grid (crossed) or points (listed), each with every seed."""
  if ("grid" in sweep) == ("points" in sweep):
    raise UsageError("get_sweep() must return exactly one of 'grid' or 'points'.")
  if "grid" in sweep:
    keys = list(sweep["grid"])
    settings = [dict(zip(keys, values))
                for values in itertools.product(*(sweep["grid"][k] for k in keys))]
  else:
    settings = [dict(p) for p in sweep["points"]]
  seeds = list(sweep.get("seeds", [0]))
  points = []
  for setting in settings:
    for seed in seeds:
      points.append(Point(len(points), setting, seed, point_name(setting, seed)))
  return points


def point_name(setting: dict, seed: int) -> str:
  """A folder name such as ``iterations=3,reconstruction_weight=0.0005,seed=0``."""
  short = [k.rsplit(".", 1)[-1] for k in setting]
  keys = short if len(set(short)) == len(short) else list(setting)
  values = [_config_label(v) if k == CONFIG_KEY else _format(v) for k, v in setting.items()]
  parts = [f"{k}={v}" for k, v in zip(keys, values)] + [f"seed={seed}"]
  return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join(parts))


def _format(value) -> str:
  return ("-".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value))


CONFIG_KEY = "config"  # A point's own config file instead of the base config.


def _config_label(spec: str) -> str:
  """``configs/affnist.py:baseline`` -> ``affnist:baseline`` (point names, tables)."""
  path, _, variant = spec.partition(":")
  return pathlib.Path(path).stem + (f":{variant}" if variant else "")


def load_config_file(spec: str, experiment_path: str | None = None):
  """``get_config(variant)`` of ``PATH[:variant]``, the path resolved as BASE_CONFIG is."""
  from capsjax import runconfig

  path, _, variant = spec.partition(":")
  roots = [REPO] + ([pathlib.Path(experiment_path).resolve().parent] if experiment_path else [])
  for root in roots:
    if (root / path).is_file():
      return runconfig.import_config_file(root / path).get_config(variant or None)
  raise UsageError(f"Config file {path!r} (sweep key {CONFIG_KEY!r}) not found.")


def point_config(base, point: "Point", command_line: dict):
  """The config of one point: its own config file (key ``config``) with the command line's
  ``--config.*`` overrides, or the base config (which has them), then the point's values."""
  overrides = dict(point.overrides)
  spec = overrides.pop(CONFIG_KEY, None)
  if spec is not None:
    base = load_config_file(spec)
    try:
      base = apply_overrides(base, command_line, base.get("seed", 0))
    except UsageError as e:
      raise UsageError(f"A command-line override does not fit {spec}: {e}") from e
  return apply_overrides(base, overrides, point.seed)


def apply_overrides(config, overrides: dict, seed: int):
  """A copy of ``config`` with the point's dotted-key values and seed."""
  config = config.copy_and_resolve_references()
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    try:
      for p in parents:
        node = node[p]
      if leaf not in node:
        raise KeyError(leaf)
      node[leaf] = value
    except (KeyError, AttributeError) as e:
      raise UsageError(f"Sweep key {key!r} is not in the config.") from e
  config.seed = seed
  return config


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




def run_points(config, points: list[Point], workdir: str, command_line: dict | None = None,
               skip_held: bool = True) -> None:
  """Runs each point not yet finished in ``WORKDIR/<point name>``.

  A point whose workdir another worker holds is skipped (``skip_held``), so several workers
  can share one sweep directory; every point runs once. SIGTERM or SIGINT during a point
  saves it and raises :class:`capsjax.preemption.Preempted`; between points, it stops before
  the next one.
  """
  from capsjax import train

  with preemption.watch() as stop:
    for point in points:
      tag = f"[{point.index + 1}/{len(points)}] {point.name}"
      if stop.signal_name is not None:
        raise preemption.Preempted(f"Stopped by {stop.signal_name} before {tag}; rerun the "
                                   "same command to continue the sweep.", stop.signal_name)
      run_dir = os.path.join(workdir, point.name)
      if is_finished(run_dir):
        print(f"{tag}: finished, skipped.", flush=True)
        continue
      print(tag, flush=True)
      try:
        train.train_and_evaluate(point_config(config, point, command_line or {}), run_dir)
      except workdirs.WorkdirBusy:
        if not skip_held:
          raise
        print(f"{tag}: held by another worker ({workdirs.Lock(run_dir).holder()}), skipped.",
              flush=True)


def collect(points: list[Point], workdir: str) -> list[dict]:
  """Writes results.csv, results.md and plots from the finished runs' summaries."""
  keys = list(dict.fromkeys(k for p in points for k in p.overrides))
  rows, missing = [], []
  for point in points:
    path = os.path.join(workdir, point.name, "summary.json")
    if not is_finished(os.path.join(workdir, point.name)):
      missing.append(point.name)
      continue
    with open(path) as f:
      summary = json.load(f)
    label = lambda k, v: _config_label(v) if k == CONFIG_KEY and v else _format(v)
    row = {"run": point.name, **{k: label(k, point.overrides.get(k, "")) for k in keys},
           "seed": point.seed}
    row.update({c: summary.get(c) for c in RESULT_COLUMNS})
    row["chance"] = chance_text(summary.get("chance"))
    row.update(extra_evaluations(summary))
    rows.append(row)
  os.makedirs(workdir, exist_ok=True)
  extra = list(dict.fromkeys(k for row in rows for k in row if _is_extra(k)))
  with files.atomic_write(os.path.join(workdir, "results.csv"), newline="") as f:
    writer = csv.DictWriter(f, fieldnames=["run", *keys, "seed", *RESULT_COLUMNS, "chance",
                                           *extra])
    writer.writeheader()
    writer.writerows(rows)
  groups = _group(rows, keys)
  with files.atomic_write(os.path.join(workdir, "results.md")) as f:
    f.write(markdown_table(groups, keys))
    if missing:
      f.write(f"\nNot finished ({len(missing)}): {', '.join(missing)}\n")
  _plot(groups, keys, workdir)
  if missing:
    print(f"{len(missing)} of {len(points)} runs not finished: {', '.join(missing)}")
  print(f"Wrote {os.path.join(workdir, 'results.csv')} ({len(rows)} runs) and results.md.")
  return rows


def _mean_std(values):
  """Mean and sample std; the std is None for a single value (no spread to report)."""
  values = [v for v in values if v is not None]
  if not values:
    return float("nan"), None
  mean = sum(values) / len(values)
  if len(values) == 1:
    return mean, None
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _mean_pm(mean: float, std: float | None, scale: float = 100.0, digits: int = 2) -> str:
  """``89.50 ± 0.30`` over several seeds; ``89.50`` for one (the seeds column says so)."""
  text = f"{scale * mean:.{digits}f}"
  return text if std is None else f"{text} ± {scale * std:.{digits}f}"


def _group(rows: list[dict], keys: list[str]) -> list[dict]:
  groups: dict[tuple, list[dict]] = {}
  for row in rows:
    groups.setdefault(tuple(row[k] for k in keys), []).append(row)
  out = []
  for setting, members in groups.items():
    stats = {c: _mean_std([m[c] for m in members]) for c in
             ("test_error", "test_loss", "train_images_per_second")}
    extra = {c: _mean_std([m.get(c) for m in members]) for c in
             dict.fromkeys(c for m in members for c in m if _is_extra(c))}
    selected = sorted({str(m.get("selected_on") or "final") for m in members})
    out.append({"setting": dict(zip(keys, setting)), "seeds": len(members), **stats,
                "chance": members[0].get("chance", "?"), "selected_on": ", ".join(selected),
                "extra": extra})
  return out


def markdown_table(groups: list[dict], keys: list[str]) -> str:
  """Mean ± std over seeds per setting (the mean alone for one seed); beside the test error its chance level and how the
  numbers were chosen (``selected_on``: ``final``, ``validation`` or ``test`` when a run
  stopped on test accuracy); other evaluations' accuracies (and at-least-one rates) as
  extra columns."""
  extra = list(dict.fromkeys(c for g in groups for c in g.get("extra", {})))
  header = [*keys, "seeds", "test error (%)", "chance (%)", "selected on", "test loss",
            "train images/s", *(_extra_header(c) for c in extra)]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for g in groups:
    err_m, err_s = g["test_error"]
    loss_m, loss_s = g["test_loss"]
    ips_m, _ = g["train_images_per_second"]
    extra_cells = [_mean_pm(*g.get("extra", {}).get(c, (float("nan"), None))) for c in extra]
    lines.append("| " + " | ".join([*(str(g["setting"][k]) for k in keys), str(g["seeds"]),
                                    _mean_pm(err_m, err_s),
                                    g.get("chance", "?"), g.get("selected_on", "final"),
                                    _mean_pm(loss_m, loss_s, 1.0, 4), f"{ips_m:.0f}",
                                    *extra_cells]) + " |")
  return "\n".join(lines) + "\n"


def _extra_header(column: str) -> str:
  for suffix, words in (("_accuracy", "accuracy"), ("_at_least_one", "at least one")):
    if column.endswith(suffix):
      return f"{column.removesuffix(suffix)} {words} (%)"
  return column


def _plot(groups: list[dict], keys: list[str], workdir: str) -> None:
  """For each swept key: test error against its values, one line per other setting."""
  if not groups:
    return
  from capsjax import figures  # Selects the Agg backend.
  import matplotlib.pyplot as plt

  for key in keys:
    others = [k for k in keys if k != key]
    lines: dict[tuple, list] = {}
    for g in groups:
      lines.setdefault(tuple(g["setting"][k] for k in others), []).append(g)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, members in lines.items():
      members.sort(key=lambda g: _sort_key(g["setting"][key]))
      xs = [g["setting"][key] for g in members]
      ax.errorbar(range(len(xs)) if not _numeric(xs) else [float(x) for x in xs],
                  [100 * g["test_error"][0] for g in members],
                  yerr=[100 * (g["test_error"][1] or 0.0) for g in members], marker="o", capsize=3,
                  label=", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(others, label))
                  or None)
      if not _numeric(xs):
        ax.set_xticks(range(len(xs)), xs)
    ax.set(xlabel=key, ylabel="test error (%)", title=f"test error vs {key} (mean ± std, seeds)")
    ax.grid(alpha=0.3)
    if any(others):
      ax.legend(fontsize=8)
    figures.save(fig, os.path.join(workdir, f"test_error_vs_{key.rsplit('.', 1)[-1]}.png"))


def _numeric(values) -> bool:
  try:
    [float(v) for v in values]
    return True
  except (TypeError, ValueError):
    return False


def _sort_key(value):
  try:
    return (0, float(value), "")
  except (TypeError, ValueError):
    return (1, 0.0, str(value))


# --- Command line ------------------------------------------------------------------

def _experiment_path_from_argv(argv: list[str]) -> str | None:
  """The positional experiment file, found before flags are defined (its base
  config is the default of --config, so --config.* overrides parse against it)."""
  for arg in argv[1:]:
    if not arg.startswith("-"):
      return arg
  return None


def _default_config_from_argv() -> str | None:
  if __name__ != "__main__" or any(a.startswith("--help") for a in sys.argv):
    return None
  path = _experiment_path_from_argv(sys.argv)
  try:
    if path is None:
      raise UsageError("Usage: python -m capsjax.sweep EXPERIMENT.py --workdir=DIR "
                       "[--config.KEY=VALUE ...] [--index=K | --list | --collect]")
    return base_config_path(load_experiment(path), path)
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


_DEFAULT_CONFIG = _default_config_from_argv()

_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "Base config; defaults to the experiment's BASE_CONFIG.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory; one sub-workdir per run.")
_INDEX = flags.DEFINE_integer("index", None, "Run only point K (0-based), e.g. $SLURM_ARRAY_TASK_ID.")
_LIST = flags.DEFINE_bool("list", False, "Print the points and exit.")
_COLLECT = flags.DEFINE_bool("collect", False, "Only collect results of finished runs.")


def main(argv):
  logging.set_verbosity(logging.WARNING)
  with cli.clear_errors():
    if len(argv) != 2:
      raise UsageError("Usage: python -m capsjax.sweep EXPERIMENT.py --workdir=DIR "
                       "[--config.KEY=VALUE ...] [--index=K | --list | --collect]")
    experiment = load_experiment(argv[1])
    points = expand(experiment.get_sweep())
    if _LIST.value:
      for p in points:
        done = _WORKDIR.value and is_finished(os.path.join(_WORKDIR.value, p.name))
        print(f"{p.index}\t{p.name}\t{'finished' if done else ''}".rstrip())
      return
    if not _WORKDIR.value:
      raise UsageError("--workdir is required.")
    workdir = os.path.abspath(_WORKDIR.value)
    command_line = config_flags.get_override_values(flags.FLAGS["config"])
    config = cli.config_from_flag(_CONFIG)
    if _COLLECT.value:
      collect(points, workdir)
      return
    if _INDEX.value is not None:
      if not 0 <= _INDEX.value < len(points):
        raise UsageError(f"--index={_INDEX.value} is out of range: the sweep has "
                         f"{len(points)} points (0..{len(points) - 1}); see --list.")
      run_points(config, [points[_INDEX.value]], workdir, command_line, skip_held=False)
      return
    for p in points:  # Fail on a bad key before any run starts.
      point_config(config, p, command_line)
    run_points(config, points, workdir, command_line)
    collect(points, workdir)


if __name__ == "__main__":
  cli.run(main, "capsjax.sweep")
