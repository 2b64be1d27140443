"""Runs an experiment: a grid or list of config overrides, times seeds; collects results.

  python -m capsjax.sweep experiments/routing_iterations.py --workdir=DIR [--config.* ...]
  python -m capsjax.sweep experiments/routing_iterations.py --workdir=DIR --list
  python -m capsjax.sweep experiments/routing_iterations.py --workdir=DIR --index=$K  # one point
  python -m capsjax.sweep experiments/routing_iterations.py --workdir=DIR --collect

An experiment file defines ``BASE_CONFIG`` (a config path relative to the repository, optionally
with ``:variant``) and ``get_sweep()``, returning a dict with ``grid``
(``{dotted.key: [values]}``, crossed) or ``points`` (a list of ``{dotted.key: value}``), and
``seeds``. The key ``config`` swaps the base config of a point for another config file, e.g.
``{"config": "configs/affnist.py:baseline"}`` to compare two models. Command-line ``--config.*``
overrides apply to every run (``--config=...`` replaces the base config). Each run has its own
sub-workdir ``DIR/<point>``; finished runs are skipped and unfinished ones resume, so rerunning a
sweep continues it. ``--vectorize``, ``--index`` and ``--collect`` (also done after a full run):
their flags' help and docs/sweeps.md.

An experiment may also define ``TABLES``, ``MATCHED``, ``REFERENCES`` and ``PAIRED_REFERENCE``:
further tables and columns of results.md (:func:`capsjax.training.sweep_results.collect` says
what each holds). ``EXPERIMENT.py:variant`` calls ``get_sweep(variant)``. A ``search`` in
``get_sweep()``'s dict tunes each grid point on its validation split before its seeds train
(:mod:`capsjax.training.search`; ``--search_storage``: its store).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import itertools
import os
import pathlib
import re
import sys
import types
from typing import NamedTuple

from absl import flags, logging
import ml_collections
from ml_collections import config_flags

from capsjax.common.errors import NonFiniteLossError, UsageError
from capsjax.config import runconfig, schema
from capsjax.runs import cli, preemption, workdirs
from capsjax.runs.reporting import is_finished
from capsjax.training.sweep_results import CONFIG_KEY, collect, shown_value

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_experiment(spec: str):
  """Imports an experiment file (``PATH`` or ``PATH:variant``); checks it defines BASE_CONFIG
  and get_sweep()."""
  path = spec.partition(":")[0]
  if not os.path.isfile(path):
    raise UsageError(f"Experiment file {path!r} not found "
                     "(e.g. experiments/routing_iterations.py).")
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


def experiment_sweep(experiment_module, spec: str) -> dict:
  """The experiment's ``get_sweep()``, or ``get_sweep(variant)`` for ``PATH:variant`` (e.g. a
  tiny variant of the same sweep for tests)."""
  variant = spec.partition(":")[2]
  if not variant:
    return experiment_module.get_sweep()
  try:
    return experiment_module.get_sweep(variant)
  except TypeError as e:
    raise UsageError(f"{spec}: this experiment's get_sweep() takes no variant ({e}).") from e


def base_config_path(experiment_module, experiment_path: str) -> str:
  """BASE_CONFIG resolved against the repository root, then the experiment's folder."""
  experiment_path = experiment_path.partition(":")[0]
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


SWEEP_KEYS = ("grid", "points", "seeds", "search")


def expand(sweep: dict) -> list[Point]:
  """The sweep's points: grid (crossed) or points (listed), each with every seed."""
  if unknown := [key for key in sweep if key not in SWEEP_KEYS]:
    close = difflib.get_close_matches(str(unknown[0]), SWEEP_KEYS, n=1, cutoff=0.5)
    raise UsageError(f"get_sweep() returned the key {unknown[0]!r}, which a sweep does not have "
                     f"(it has {', '.join(SWEEP_KEYS)})"
                     + (f"; did you mean {close[0]!r}?" if close else "."))
  if ("grid" in sweep) == ("points" in sweep):
    raise UsageError("get_sweep() must return exactly one of 'grid' or 'points'.")
  if "grid" in sweep:
    grid = sweep["grid"]
    settings = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
  else:
    settings = [dict(p) for p in sweep["points"]]
  pairs = itertools.product(settings, sweep.get("seeds", [0]))
  return [Point(k, setting, seed, point_name(setting, seed))
          for k, (setting, seed) in enumerate(pairs)]


def point_name(setting: dict, seed: int) -> str:
  """A folder name such as ``iterations=3,reconstruction_weight=0.0005,seed=0``."""
  short = [k.rsplit(".", 1)[-1] for k in setting]
  names = short if len(set(short)) == len(short) else list(setting)
  parts = [f"{name}={shown_value(k, v)}" for name, (k, v) in zip(names, setting.items())]
  return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join([*parts, f"seed={seed}"]))


def point_config(base, point: "Point", command_line: dict):
  """The config of one point: its own config file (key ``config``: ``PATH[:variant]``, the path
  relative to the repository) with the command line's ``--config.*`` overrides, or the base
  config (which has them), then the point's values."""
  overrides = dict(point.overrides)
  spec = overrides.pop(CONFIG_KEY, None)
  if spec is not None:
    path, _, variant = spec.partition(":")
    if not (REPO / path).is_file():
      raise UsageError(f"Config file {path!r} (sweep key {CONFIG_KEY!r}) not found.")
    own = runconfig.import_config_file(REPO / path).get_config(variant or None)
    base = apply_overrides(own, command_line)
    try:
      schema.resolve_config(base)
    except UsageError as e:
      raise UsageError(f"A command-line override does not fit {spec}: {e}") from e
  return apply_overrides(base, overrides, point.seed)


def apply_overrides(config, overrides: dict, seed: int | None = None):
  """A copy of ``config`` with the point's dotted-key values (a section the config leaves out
  is made: a key nobody declared is refused when the config is resolved,
  :func:`capsjax.config.schema.resolve_config`) and ``seed`` (None: the config's)."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    for key, value in overrides.items():
      *parents, leaf = key.split(".")
      node = config
      for p in parents:
        if p not in node or node[p] is None:
          node[p] = ml_collections.ConfigDict()
        node = node[p]
        if not hasattr(node, "unlocked"):
          raise UsageError(f"Sweep key {key!r}: config.{p} is a setting, not a section.")
      if leaf in node:
        del node[leaf]  # The point's value, of whatever type (ConfigDict is type-safe).
      node[leaf] = value
    if seed is not None:
      config.seed = seed
  return config


def train_points(config, points: list[Point], workdir: str, command_line: dict | None = None,
               skip_held: bool = True, min_runs: int | None = None,
               resolved: dict | None = None) -> None:
  """Runs each point not yet finished in ``WORKDIR/<point name>``, every one the same way:
  planned into groups, each group trained by :func:`capsjax.train.train_and_evaluate_group`.

  ``min_runs``: None trains each point alone, its data loaded when its turn comes; a number
  vectorises: the points that differ only in settings declared safe
  (:mod:`capsjax.training.vectorize` groups them, by declared rules and each point's own data,
  loaded once for all and shared where equal) train as one program each when a group has at
  least ``max(2, min_runs)`` runs, the others alone on the data already loaded.

  A point whose workdir another worker holds is skipped (``skip_held``), so several workers can
  share one sweep directory; every point runs once (a point finished by another worker between
  this one's look and its hold is skipped too). A point whose loss becomes non-finite stops
  alone; the others go on, and the sweep ends with :class:`NonFiniteLossError` naming it.
  SIGTERM or SIGINT during a group saves its runs and raises
  :class:`capsjax.runs.preemption.Preempted`; between groups, it stops before the next one.
  ``resolved``: ``{point name: its resolved config}`` where the caller has it already.
  """
  # JAX and the models are imported once a point trains, not for --list or --collect.
  from capsjax import train
  from capsjax.training import memory, setup as setup_lib, vectorize

  def finished(point: Point) -> bool:  # Whether its run is (then said, and skipped).
    if done := is_finished(os.path.join(workdir, point.name)):
      print(f"{_tag(point, points)}: finished, skipped.", flush=True)
    return done

  pending = [point for point in points if not finished(point)]
  if not pending:
    return
  resolved = resolved or {}
  configs = [resolved[p.name] if p.name in resolved else point_config(config, p, command_line or {})
             for p in pending]
  setups: list = [None] * len(pending)
  if min_runs is None:
    groups = [vectorize.Group((i,)) for i in range(len(pending))]
  else:
    with memory.advice_on_allocation_failure(configs[0], "Loading the runs' data"):
      setups = [setup_lib.Setup(c) for c in configs]
    train.share_equal_data(setups)
    groups = vectorize.plan_groups(setups)
    print(vectorize.describe_groups(groups, pending), flush=True)
  diverged = []
  with preemption.watch() as stop:
    for k, group in enumerate(groups):
      # Another worker on the same sweep directory may have finished some since the budget.
      indices = [i for i in group.indices if not finished(pending[i])]
      if not indices:
        continue
      members = [pending[i] for i in indices]
      tag = (_tag(members[0], points) if min_runs is None else
             f"[group {k + 1}/{len(groups)}] {len(members)} run(s): "
             f"{', '.join(p.name for p in members)}")
      if stop.signal_name is not None:
        raise preemption.Preempted(f"Stopped by {stop.signal_name} before {tag}; rerun the "
                                   "same command to continue the sweep.", stop.signal_name)
      print(tag, flush=True)
      outcomes = _train_group(indices, group.per_run_keys, configs, setups,
                              [os.path.join(workdir, p.name) for p in members], min_runs)
      for point, outcome in zip(members, outcomes):
        if isinstance(outcome, workdirs.WorkdirBusy):
          if not skip_held:
            raise outcome
          holder = workdirs.Lock(os.path.join(workdir, point.name)).holder()
          print(f"{_tag(point, points)}: held by another worker ({holder}), skipped.",
                flush=True)
        elif isinstance(outcome, workdirs.FinishedMeanwhile):
          print(f"{_tag(point, points)}: finished by another worker, skipped.", flush=True)
        elif isinstance(outcome, NonFiniteLossError):
          diverged.append(f"{point.name}: {outcome}")
        elif isinstance(outcome, BaseException):
          raise outcome
  if diverged:
    raise NonFiniteLossError("These runs stopped on a non-finite loss (the others finished):\n  "
                             + "\n  ".join(diverged))


def _train_group(indices: list[int], per_run_keys, configs: list, setups: list,
                 run_dirs: list[str], min_runs: int | None) -> list:
  """The outcomes (summaries, or what stopped a run alone) of training the runs ``indices`` of
  ``configs`` into ``run_dirs``: as one program when there are at least ``max(2, min_runs)``,
  else one by one (each on its setup already loaded, if any)."""
  from capsjax import train  # Imported by train_points already: no start time to save here.
  from capsjax.training import memory

  if len(indices) >= max(2, min_runs or 2):
    return train.train_and_evaluate_group(
        [configs[i] for i in indices], run_dirs, per_run_keys,
        setups=[setups[i] for i in indices], skip_finished=True)
  outcomes = []
  for i, run_dir in zip(indices, run_dirs):
    with memory.advice_on_allocation_failure(configs[i]):
      outcomes += train.train_and_evaluate_group(
          [configs[i]], [run_dir], setups=None if setups[i] is None else [setups[i]],
          vectorised=False, skip_finished=True)
  return outcomes


def _tag(point: Point, points: list[Point]) -> str:
  """``[k/n] name`` as the sweep's progress names a point (and ``(point i)`` for a subset)."""
  k = points.index(point)
  # A subset (--index): the point also named as --list numbers it.
  subset = f" (point {point.index})" if point.index != k else ""
  return f"[{k + 1}/{len(points)}] {point.name}{subset}"


# --- Command line ------------------------------------------------------------------

USAGE = ("Usage: python -m capsjax.sweep EXPERIMENT.py --workdir=DIR [--config.KEY=VALUE ...] "
         "[--index=K | --list | --collect]")


def _default_config_from_argv(argv: list[str]) -> str | None:
  """The experiment's BASE_CONFIG, the default of --config (None for --help), from the
  positional experiment file, found before flags are defined."""
  if any(a.startswith("--help") for a in argv):
    return None
  path = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
  try:
    if path is None:
      raise UsageError(USAGE)
    return base_config_path(load_experiment(path), path)
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


FLAGS: types.SimpleNamespace | None = None  # The command's flags (define_flags), once it runs.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS, argv: list[str] | None = None):
  """The command's flags, in ``flag_values``; ``argv`` names the experiment, whose base
  config is the default of --config (so --config.* overrides parse against it)."""
  global FLAGS
  define = dict(flag_values=flag_values)
  FLAGS = types.SimpleNamespace(
      config=cli.define_config_file(
          "config", _default_config_from_argv(argv if argv is not None else sys.argv),
          "Base config; defaults to the experiment's BASE_CONFIG.", flag_values, argv),
      workdir=flags.DEFINE_string("workdir", None,
                                  "Sweep directory; one sub-workdir per run.", **define),
      index=flags.DEFINE_list(
          "index", None, "Run only point K (0-based), e.g. $SLURM_ARRAY_TASK_ID, or the "
          "points K,L,... (vectorised together where they can be).", **define),
      list=flags.DEFINE_bool("list", False, "Print the points and exit.", **define),
      collect=flags.DEFINE_bool("collect", False, "Only collect results of finished runs.",
                                **define),
      vectorize=flags.DEFINE_bool(
          "vectorize", None, "Train the points that differ only in seeds, learning rates, "
          "loss weights or init scales (and load equal data) as one program each (jax.vmap "
          "over runs). Default: groups of 4 or more on accelerators, none on CPUs "
          "(docs/performance.md); --novectorize: one at a time.", **define),
      search_storage=flags.DEFINE_string(
          "search_storage", None, "The store of the experiment's search: a journal file "
          "(default DIR/search/journal.log) on a filesystem every worker shares, or a "
          "database URL (postgresql://...).", **define))
  return FLAGS


def main(argv):
  logging.set_verbosity(logging.WARNING)
  f = FLAGS
  with cli.clear_errors():
    if len(argv) != 2:
      raise UsageError(USAGE)
    experiment = load_experiment(argv[1])
    spec = experiment_sweep(experiment, argv[1])
    points = expand(spec)
    if f.list.value:
      for p in points:
        done = f.workdir.value and is_finished(os.path.join(f.workdir.value, p.name))
        print(f"{p.index}\t{p.name}\t{'finished' if done else ''}".rstrip())
      return
    if not f.workdir.value:
      raise UsageError("--workdir is required.")
    workdir = os.path.abspath(f.workdir.value)
    workdirs.check_writable(workdir)  # Refused in one line before any data or compiling.
    command_line = config_flags.get_override_values(cli.flag_of(f.config))
    config = cli.config_from_flag(f.config)
    report = {name.lower(): getattr(experiment, name, None)
              for name in ("TABLES", "MATCHED", "REFERENCES", "PAIRED_REFERENCE")}
    report["searched"] = "search" in spec
    if f.collect.value:
      collect(points, workdir, **report)
      return
    from capsjax.training import vectorize  # JAX: not for --list or --collect.

    min_runs = (vectorize.default_min_runs() if f.vectorize.value is None
                else 2 if f.vectorize.value else None)
    tune = _tuning(spec, points, os.path.basename(argv[1]), config, command_line, workdir)
    selected = ([points[k] for k in _indices(f.index.value, len(points))] if f.index.value
                else points)
    # Every point's settings checked before any run starts, and kept for its run (a search's
    # points train with other values: those are resolved when they train).
    resolved = {p.name: schema.resolve_config(point_config(config, p, command_line))
                for p in selected}
    selected = tune(selected)
    resolved = {} if report["searched"] else resolved
    if f.index.value:
      train_points(config, selected, workdir, command_line, skip_held=False, min_runs=min_runs,
                   resolved=resolved)
      return
    try:
      train_points(config, selected, workdir, command_line, min_runs=min_runs,
                   resolved=resolved)
    except NonFiniteLossError:  # The finished runs' tables all the same.
      collect(selected, workdir, **report)
      raise
    collect(selected, workdir, **report)


def _tuning(spec: dict, points: list[Point], experiment: str, config, command_line: dict,
            workdir: str):
  """``tune(selected)``: the ``selected`` points with the values their grid point's search
  chose (:func:`capsjax.training.search.run_searches`, run first); the points as they are
  when the experiment declares no search."""
  if "search" not in spec:
    return lambda selected: selected
  from capsjax import train  # JAX and Optuna: only for a search.
  from capsjax.training import search

  tuner = search.Search.from_spec(spec["search"], points[0].seed)
  return functools.partial(
      search.run_searches, tuner, points, experiment=experiment, workdir=workdir,
      storage_url=FLAGS.search_storage.value, train_fn=train.train_and_evaluate,
      config_of=lambda p, overrides: apply_overrides(point_config(config, p, command_line),
                                                     overrides))


def _indices(texts: list[str], num_points: int) -> list[int]:
  """``--index`` as point numbers, each checked against the sweep's size."""
  for text in texts:
    if not text.strip().lstrip("-").isdigit() or not 0 <= int(text) < num_points:
      raise UsageError(f"--index={text} is out of range: the sweep has {num_points} points "
                       f"(0..{num_points - 1}); see --list.")
  return [int(text) for text in texts]


if __name__ == "__main__":
  cli.run(main, "capsjax.sweep", define_flags)
