"""Several runs as one program (:class:`capsjax.training.train_step.Step`, mapped over a leading
run axis of their states, data shared): which runs can share it.

:func:`plan_groups` decides which runs can share a program from their configs and data, by
declared rules (examples: docs/sweeps.md, "Which runs share a program"); nothing is guessed:

* ``seed`` never splits a group: each run is initialised and draws its batches from its own;
* nor does a per-run number (:mod:`capsjax.config.per_run`): the optimiser's
  (:data:`capsjax.training.optimizers.PER_RUN_KEYS`, held in each run's state) and the fields of
  the model class's ``per_run_numbers`` (the step maps over one instance per run);
* nor a setting used only to build the initial parameters, declared so beside its code
  (``Setting(init_only=True)`` in the model class's ``SETTINGS``; a model without ``SETTINGS``
  may list the keys as ``init_only_settings``) or in :data:`INIT_ONLY_KEYS`;
* any other difference, of any type, splits the group, and the plan names it; so do data that
  differ (each run loads its own, from its own config). Declarations are dotted config keys;
  ``*`` matches any one part (``model.*.init_scale``).

On several devices every run's batch is sharded over them, as in a single run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
from typing import Callable, Sequence

import numpy as np

from capsjax.common import platform
from capsjax.config import per_run, settings
from capsjax.config.runconfig import flatten
from capsjax.training import optimizers
from capsjax.training.setup import Setup

SEED_KEYS = ("seed",)  # Never a reason to split (a seed that changes the data: by the data).
INIT_ONLY_KEYS: tuple[str, ...] = ()  # Used only to initialise, whatever the model.

UNDECLARED = "neither a per-run number nor initialisation-only"  # Why, as the plan prints it.
DATA = "data"  # The pseudo-key of runs whose loaded data differ.
DATA_DIFFER = "each run's data, loaded from its own config, differ"


@dataclasses.dataclass(frozen=True)
class Group:
  """Runs that train as one program: their ``indices`` in the list given to :func:`plan_groups`;
  the settings that differ between them, per-run numbers (``per_run_keys``) or declared
  initialisation-only (``init_keys``); and ``apart``, ``(setting, why)`` of each difference that
  set these runs apart from others (:data:`DATA` when their data differ), for the sweep's budget."""
  indices: tuple[int, ...]
  per_run_keys: tuple[str, ...] = ()
  init_keys: tuple[str, ...] = ()
  apart: tuple[tuple[str, str], ...] = ()

  @property
  def split_by(self) -> tuple[str, ...]:
    """The settings of :attr:`apart`."""
    return tuple(key for key, _ in self.apart)


def declared(setup: Setup) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """``(per_run, init_only)``: the keys (or patterns) declared for ``setup``'s model, by the
  rules of the module docstring."""
  model = setup.task.model_class
  table = getattr(model, "SETTINGS", None) or {}
  init_only = tuple(key for key, s in settings.declared(table).items() if s.init_only)
  return (tuple(optimizers.PER_RUN_KEYS.values())
          + per_run.config_keys(getattr(model, "per_run_numbers", None)),
          INIT_ONLY_KEYS + init_only + tuple(getattr(model, "init_only_settings", ())))


def _matches(key: str, patterns: Sequence[str]) -> bool:
  parts = key.split(".")
  return any(len(p.split(".")) == len(parts) and fnmatch.fnmatchcase(key, p) for p in patterns)


def kind_of(key: str, setup: Setup) -> str | None:
  """``"per_run"``, ``"init"`` or None (undeclared): how ``key`` may differ between the runs."""
  per_run_keys, init_only = declared(setup)
  if _matches(key, per_run_keys):
    return "per_run"
  if _matches(key, init_only):
    return "init"
  return None


def plan_groups(setups: Sequence[Setup]) -> list[Group]:
  """The runs of ``setups`` (each loaded from its own config) in groups that can share one
  program, by the rules of the module docstring. Groups keep the runs' order."""
  flat = [flatten(r.config.to_dict()) for r in setups]
  differing = sorted(k for k in set().union(*flat) if k not in SEED_KEYS
                     and len({repr(f.get(k)) for f in flat}) > 1)
  kinds = [{k: kind_of(k, r) for k in differing} for r in setups]
  undeclared = [k for k in differing if any(kind[k] is None for kind in kinds)]

  def signature(i):  # Runs of one bucket agree on every undeclared setting.
    return (tuple(repr(flat[i].get(k)) if kinds[i][k] is None else kinds[i][k]
                  for k in differing),
            tuple(flat[i].get(k) is None for k in differing))

  buckets = _buckets(range(len(setups)), signature)
  apart = tuple((k, UNDECLARED) for k in undeclared) if len(buckets) > 1 else ()
  # Once per splits object (runs that share their arrays share it), by id while setups holds it.
  splits_by_id = {id(s.splits): s.splits for s in setups}
  fingerprints = {key: data_fingerprint(splits) for key, splits in splits_by_id.items()}
  groups = []
  for bucket in buckets:
    for sub in _buckets(bucket, lambda i: fingerprints[id(setups[i].splits)]):
      data_apart = ((DATA, DATA_DIFFER),) if len(sub) < len(bucket) else ()
      groups.append(_group(kinds, flat, sub, apart + data_apart))
  return groups


def describe_groups(groups: Sequence[Group], points: Sequence) -> str:
  """The vectorisation budget of a sweep's ``points`` (:class:`capsjax.sweep.Point`): one line
  per group, its per-run numbers and what set it apart from the others, with why (:data:`DATA`
  is not named among the keys)."""
  lines = [f"Vectorised: {len(points)} run(s) in {len(groups)} program(s)."]
  for k, group in enumerate(groups):
    names = ", ".join(points[i].name for i in group.indices)
    notes = []
    if group.per_run_keys:
      notes.append(f"per-run: {', '.join(group.per_run_keys)}")
    if group.init_keys:
      notes.append(f"initialisation only: {', '.join(group.init_keys)}")
    for why in dict.fromkeys(why for _, why in group.apart):
      keys = [key for key, w in group.apart if w == why and key != DATA]
      notes.append(f"apart by {', '.join(keys)} ({why})" if keys else f"apart: {why}")
    lines.append(f"  program {k + 1}: {len(group.indices)} run(s) [{names}]"
                 + (f"; {'; '.join(notes)}" if notes else ""))
  return "\n".join(lines)


def _buckets(indices, key: Callable) -> list[list[int]]:
  """``indices`` by ``key(i)``, in order of first appearance."""
  buckets: dict = {}
  for i in indices:
    buckets.setdefault(key(i), []).append(i)
  return list(buckets.values())


def _group(kinds, flat, indices, apart) -> Group:
  """``indices`` as one group, with the per-run and init-only settings its runs differ in."""
  keys = [k for k in kinds[indices[0]] if len({repr(flat[i].get(k)) for i in indices}) > 1]
  return Group(tuple(indices), tuple(k for k in keys if kinds[indices[0]][k] == "per_run"),
               tuple(k for k in keys if kinds[indices[0]][k] == "init"), tuple(apart))


def data_fingerprint(splits: dict) -> str:
  """A digest of every split's arrays (names, dtypes, shapes and bytes): equal for equal data."""
  digest = hashlib.blake2b(digest_size=16)
  for name in sorted(splits):
    split = splits[name]
    for part, arrays in (("examples", split.examples), ("shared", split.shared)):
      for key in sorted(arrays):
        array = np.ascontiguousarray(arrays[key])
        digest.update(f"{name}/{part}/{key}:{array.dtype.str}{array.shape};".encode())
        digest.update(array.reshape(-1).view(np.uint8))
  return digest.hexdigest()


def default_min_runs(backend: str | None = None) -> int | None:
  """The smallest group ``capsjax.sweep`` vectorises when ``--vectorize`` is not given; None: none.
  On a CPU one run already keeps it busy; on a GPU, groups of 4 or more ran faster than their runs
  one by one (measured: docs/notes/performance_log.md, "Several runs in one program"). ``backend``:
  None, the one programs are built for (:func:`capsjax.common.platform.target`)."""
  return None if (backend or platform.target()) == "cpu" else 4
