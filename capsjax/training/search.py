"""Each grid point's hyperparameters searched on its validation split (Optuna) before its
seeds train with the values found (docs/sweeps.md, "Tuned ablations"). ``get_sweep()``'s
dict declares it beside ``grid`` and ``seeds``::

    "search": {"space": {"optimizer.learning_rate": ("log_uniform", 1e-4, 1e-2),
                         "model.routing.iterations": ("int", 1, 5)},  # also "uniform",
               "trials": 16, "budget": {"train.num_steps": 300},     # "categorical"
               "metric": "validation/error"}                         # or ".../loss"

One study per grid point (TPE; the median pruner on the validation curve) in one store: a
journal file in the sweep's directory, or ``--search_storage`` (a shared path or a database
URL). Its trials (:mod:`capsjax.training.trials`) evaluate the validation split alone, named
``test``: no trial evaluates, scores or draws a test example.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import warnings
from typing import Callable

import optuna

from capsjax.common import figures, files
from capsjax.common.errors import UsageError
from capsjax.config import schema
from capsjax.training import trials as trials_lib
from capsjax.training.trials import describe

KINDS = ("log_uniform", "uniform", "int", "categorical")
METRICS = ("validation/error", "validation/loss")
SPEC_KEYS = ("space", "trials", "budget", "metric", "prune")
# Every trial evaluates the validation split alone ("test" is a required evaluation's name).
TRIAL_ONLY = {"evals": {"test": {"type": "split", "split": "validation"}},
              "train.eval_during": (), "eval.figures": False}
PRUNE_AFTER = 3  # Complete trials before the median pruner stops any.
LOCK_WAIT_SECONDS = 10.0  # A journal's write lock that stays longer is refused as left over.
WHERE = "get_sweep()'s search"


@dataclasses.dataclass(frozen=True)
class Search:
  """A search as an experiment declares it (:meth:`from_spec` checks its form)."""
  space: dict      # dotted key -> ("log_uniform" | "uniform" | "int", low, high)
  trials: int      #   or ("categorical", [choices])
  budget: dict     # dotted key -> value: a trial's overrides (e.g. fewer steps)
  metric: str
  prune: bool = True
  seed: int = 0    # The trials' seed and the sampler's.

  @classmethod
  def from_spec(cls, spec: dict, seed: int) -> "Search":
    """``get_sweep()["search"]``; UsageError, one line naming what to change, for an unknown field,
    a malformed dimension, fewer than one trial or a metric not the validation split's."""
    if unknown := [k for k in spec if k not in SPEC_KEYS]:
      raise UsageError(f"{WHERE} has the field {unknown[0]!r}; it has {', '.join(SPEC_KEYS)}.")
    space, trials = dict(spec.get("space") or {}), spec.get("trials")
    if not space:
      raise UsageError(f"{WHERE} needs a 'space': {{dotted.key: (kind, ...)}}, kinds {KINDS}.")
    for key, dim in space.items():
      _check_dimension(key, dim)
      if key.split(".")[0] in ("evals", "seed") or key in TRIAL_ONLY:
        raise UsageError(f"{WHERE}: {key} cannot be searched (trials evaluate the validation "
                         "split alone, with the search's seed); remove it from the space.")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
      raise UsageError(f"{WHERE}: trials={trials!r}; a search needs at least 1 trial per "
                       "point (set 'trials' to 1 or more, or drop 'search').")
    metric = spec.get("metric", METRICS[0])
    if metric not in METRICS:
      raise UsageError(f"{WHERE}: metric={metric!r}; a search chooses on the validation split "
                       f"only ({' or '.join(METRICS)}): the test set gives the verdicts after.")
    return cls(space, trials, dict(spec.get("budget") or {}), metric,
               bool(spec.get("prune", True)), seed)

  def trial_overrides(self, params: dict) -> dict:
    """A trial's overrides: the budget, ``params``, then :data:`TRIAL_ONLY`."""
    return {**self.budget, **params, **TRIAL_ONLY}

  def check(self, config_of: Callable[[dict], object]) -> None:
    """Refuses, in one line, a trial config without a validation split, and a dimension
    whose end (or a choice) its key's declaration refuses, or whose key nobody declared
    (:func:`capsjax.config.schema.resolve_config`). ``config_of(overrides)``: the point's
    config with ``overrides``."""
    resolved = _resolve(config_of(self.trial_overrides({})), "the search's trials")
    if not int(resolved.data.validation_size):
      raise UsageError("A search chooses on the validation split, and this config holds none "
                       "(config.data.validation_size=0): set data.validation_size in the base "
                       "config, the search's budget or --config.data.validation_size=N.")
    for key, dim in self.space.items():
      for value in (dim[1] if dim[0] == "categorical" else dim[1:]):
        _resolve(config_of(self.trial_overrides({key: value})),
                 f"search space {key}={dim!r} at {value!r}")

  def suggest(self, trial: optuna.trial.Trial) -> dict:
    """The trial's values (a resumed trial's own, as the store holds them)."""
    params = {}
    for key, (kind, *args) in self.space.items():
      if kind == "categorical":
        params[key] = trial.suggest_categorical(key, list(args[0]))
      elif kind == "int":
        params[key] = trial.suggest_int(key, *args)
      else:
        params[key] = trial.suggest_float(key, *args, log=kind == "log_uniform")
    return params

  def identity(self, experiment: str, setting: dict) -> str:
    """What a study must have been made for (its user attrs record it)."""
    return json.dumps({"experiment": experiment, "setting": setting, "space": self.space,
                       "budget": self.budget, "metric": self.metric, "seed": self.seed},
                      sort_keys=True, default=repr)


def _check_dimension(key: str, dim) -> None:
  """UsageError naming ``key`` unless ``dim`` is one of :data:`KINDS` with its arguments."""
  kind = dim[0] if isinstance(dim, (tuple, list)) and dim else None
  if kind == "categorical":
    if len(dim) != 2 or not isinstance(dim[1], (list, tuple)) or not dim[1]:
      raise UsageError(f"search space {key}={dim!r}: give ('categorical', [choices]).")
    return
  ends = dim[1:] if kind in KINDS and len(dim) == 3 else ()
  if not ends or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                         for v in ends) or not ends[0] < ends[1]:
    raise UsageError(f"search space {key}={dim!r}: give (kind, low, high) with low < high, "
                     f"kind one of {KINDS[:3]}, or ('categorical', [choices]).")
  if kind == "int" and not all(isinstance(v, int) for v in ends):
    raise UsageError(f"search space {key}={dim!r}: an 'int' range has integer ends.")
  if kind == "log_uniform" and ends[0] <= 0:
    raise UsageError(f"search space {key}={dim!r}: a log-uniform range needs low > 0.")


def _resolve(config, what: str):
  try:
    return schema.resolve_config(config)
  except UsageError as e:
    raise UsageError(f"{what}: {e} Change the search in get_sweep().") from None


def _first_line(e: Exception) -> str:
  return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


# --- The store ------------------------------------------------------------------------

def open_store(url: str | None, default_path: str | None):
  """The search's store: a journal file (``url`` a path, default ``default_path``) or a
  database (``url`` with ``://``); UsageError naming ``--search_storage`` when it cannot be
  opened, or when a journal's write lock stays taken (left by a process killed mid-write)."""
  path = url or default_path
  try:
    if "://" in path:
      return optuna.storages.RDBStorage(path)
    if url is None:
      os.makedirs(os.path.dirname(path), exist_ok=True)
    lock, since = path + ".lock", time.monotonic()  # The journal's JournalFileSymlinkLock.
    while os.path.lexists(lock) and time.monotonic() - since < LOCK_WAIT_SECONDS:
      time.sleep(0.2)
    if os.path.lexists(lock):
      raise UsageError(f"The search store {path} is locked: {lock} has stayed "
                       f"{LOCK_WAIT_SECONDS:.0f} s. If no worker is writing to the store, "
                       f"remove {lock} and rerun.")
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
  except UsageError:
    raise
  except Exception as e:  # OSError, a database driver's or SQLAlchemy's error: one line.
    raise UsageError(f"--search_storage={path}: the search store cannot be opened "
                     f"({_first_line(e)}); give a path you can write to or a reachable "
                     "database URL.") from None


def study_of(storage, name: str, identity: str, search: Search) -> optuna.Study:
  """The point's study (made if new), its identity recorded; UsageError when the store holds
  a study of this name made for another search (and then nothing is written to it)."""
  pruner = (optuna.pruners.MedianPruner(PRUNE_AFTER) if search.prune
            else optuna.pruners.NopPruner())
  try:
    try:
      study = optuna.load_study(study_name=name, storage=storage, pruner=pruner)
    except KeyError:
      study = optuna.create_study(storage=storage, study_name=name, direction="minimize",
                                  load_if_exists=True, pruner=pruner)
  except Exception as e:  # The store's own error (a locked database, another schema).
    raise UsageError(f"The search store cannot hold study {name!r} ({_first_line(e)}); "
                     "give another --search_storage.") from None
  found = study.user_attrs.get("capsjax")
  if found is None:
    study.set_user_attr("capsjax", identity)
  elif found != identity:
    ours, theirs = json.loads(identity), json.loads(found)
    differ = ", ".join(f"{k} {theirs.get(k)!r} (here {v!r})" for k, v in ours.items()
                       if theirs.get(k) != v)
    raise UsageError(f"The search store's study {name!r} belongs to another search: {differ}."
                     " Give this one its own --workdir or --search_storage, or restore the "
                     "experiment's search.")
  return study


# --- What was chosen ------------------------------------------------------------------

def chosen(study: optuna.Study, search: Search, directory: str) -> dict:
  """The best complete trial's values and how they were found, written to
  ``directory/chosen.json`` beside the search's pictures; UsageError when none completed."""
  states = [t.state for t in study.get_trials(deepcopy=False)]
  count = {name: states.count(state)
           for name, state in zip(("complete", "pruned", "failed"), trials_lib.COUNTED)}
  if not count["complete"]:
    raise UsageError(f"{study.study_name}: none of its {len(states)} trials completed "
                     f"({count['pruned']} pruned, {count['failed']} failed: a non-finite "
                     "loss); move or narrow the search's space, or give its trials a larger "
                     "budget.")
  best = study.best_trial
  record = {"values": best.params, "metric": search.metric, "best_value": best.value,
            "best_trial": best.number, **count, "study": study.study_name}
  files.write_json(os.path.join(directory, "chosen.json"), record, what="the search's choice")
  from optuna.visualization import matplotlib as plots

  plt = figures.pyplot()  # The Agg backend, before Optuna's plots import pyplot.
  with warnings.catch_warnings():  # Optuna marks its matplotlib plots experimental.
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    for name, draw in (("history", plots.plot_optimization_history),
                       ("params", plots.plot_slice)):  # Each value against the metric.
      axes = draw(study, target_name=search.metric)
      fig = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
      for ax in fig.axes:  # A log axis's minor labels overlap.
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
      figures.save(fig, os.path.join(directory, f"{name}.png"))
  return record


def setting_name(point) -> str:
  """A grid point's folder under ``DIR/search``: its runs' name without the seed."""
  return re.sub(r",?seed=-?\d+$", "", point.name) or "default"


def _read_chosen(workdir: str, name: str) -> dict | None:
  """Grid point ``name``'s ``chosen.json`` (:func:`chosen`); None until its search has chosen."""
  path = os.path.join(workdir, "search", name, "chosen.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def tuned_points(points: list, workdir: str) -> list:
  """``points`` (:class:`capsjax.sweep.Point`) with the values their search chose added to
  their overrides where it has chosen (their names, and so their workdirs, stay)."""
  records = [_read_chosen(workdir, setting_name(p)) or {"values": {}} for p in points]
  return [p._replace(overrides={**p.overrides, **r["values"]}) for p, r in zip(points, records)]


def results_section(points: list, workdir: str) -> str:
  """results.md's table of the searches: per grid point, the values chosen, on what, after
  how many trials, and the pictures."""
  lines = ["Each point's values were searched on its validation split, then its seeds "
           "trained with them (capsjax/training/search.py; no trial evaluated the test set):",
           "", "| point | values chosen | on | trials: complete, pruned, failed | pictures |",
           "|---|---|---|---|---|"]
  for name in dict.fromkeys(setting_name(p) for p in points):
    if (c := _read_chosen(workdir, name)) is None:
      lines.append(f"| {name} | search not finished | | | |")
      continue
    lines.append(f"| {name} | {describe(c['values'])} | {c['metric']} {c['best_value']:.4f} "
                 f"(trial {c['best_trial']}) | {c['complete']}, {c['pruned']}, "
                 f"{c['failed']} | [history](search/{name}/history.png), "
                 f"[values](search/{name}/params.png) |")
  return "\n".join(lines) + "\n"


def run_searches(search: Search, points: list, selected: list, experiment: str,
                 workdir: str, storage_url: str | None, config_of: Callable,
                 train_fn: Callable, say=print) -> list:
  """Searches each grid point of ``selected`` (one study each, in the store of ``storage_url`` or
  ``WORKDIR/search/journal.log``), every search checked and the store opened before any trial
  trains; returns ``selected`` with the values chosen. ``config_of(point, overrides)``: a point's
  config with ``overrides``; ``experiment`` names the studies' experiment."""
  first = {}
  for point in points:  # The trials' config: the grid point's, at the search's seed.
    first.setdefault(setting_name(point), point._replace(seed=search.seed))
  names = list(dict.fromkeys(setting_name(p) for p in selected))
  trial_config = {n: lambda overrides, p=first[n]: config_of(p, overrides) for n in names}
  for name in names:
    search.check(trial_config[name])
  storage = open_store(storage_url, os.path.join(workdir, "search", "journal.log"))
  optuna.logging.set_verbosity(optuna.logging.WARNING)  # The trials' own lines say enough.
  studies = {name: study_of(storage, name, search.identity(experiment, first[name].overrides),
                            search) for name in names}
  for name, study in studies.items():
    directory = os.path.join(workdir, "search", name)
    trials_lib.tune(study, search, directory, trial_config[name], train_fn, say)
    record = chosen(study, search, directory)
    say(f"{name}: chose {describe(record['values'])} ({search.metric} "
        f"{record['best_value']:.4f}, trial {record['best_trial']}; {record['complete']} "
        f"complete, {record['pruned']} pruned, {record['failed']} failed).")
  return tuned_points(selected, workdir)
