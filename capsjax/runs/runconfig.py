"""A run's config on disk: ``WORKDIR/config.json``, what a resume changed, and defaults for
workdirs written by earlier versions."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import types

import ml_collections

from capsjax.common import defaults
from capsjax.common.errors import UsageError
from capsjax.runs import files

# Settings a resumed run may change without changing what it computes: its length, how often
# it logs, evaluates and checkpoints, where the data files live, how convolutions are computed.
RESUME_NEUTRAL_KEYS = ("train.num_steps", "train.num_epochs", "train.log_every_steps",
                       "train.eval_every_steps", "train.checkpoint_every_steps",
                       "train.keep_checkpoints", "train.steps_per_dispatch", "data.dir",
                       "data.tfds_data_dir", "model.conv_impl", "eval", "evals",
                       "train.stop_at_accuracy", "train.saturation_warning",
                       "train.eval_during")

# Keys added after the first workdirs were written, with the value that reproduces them: for
# every run, and (the second table) for runs of the model and dataset that had the key, which
# were the only ones when it was added (others never had it: a config.json round-trips exactly).
_DEFAULTS = {"dataset": defaults.DATASET, "model.name": defaults.MODEL,
             "train.stop_at_accuracy": None, "optimizer.name": "adam",
             "optimizer.schedule": "exponential"}
_DEFAULTS_OF = {
    ("model.name", "capsnet"): {"model.primary.output_scale": 1.0,
                                "model.routing.name": "dynamic",
                                "model.class_capsules.scores": "auto"},
    ("dataset", "mnist"): {"data.pad": 0},
    ("dataset", "smallnorb"): {"data.viewpoint_split": ""},
}
# Settings that registries own (a router's, an optimiser's) are not listed: they are compared
# resolved, and an unset setting of another router or optimiser is no setting
# (:func:`comparable`).


def flatten(tree: dict, prefix: str = "") -> dict:
  """A nested dict as ``{"dotted.key": value}``."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def config_changes(before: dict, after: dict) -> list[str]:
  """``"key: old -> new"`` for each setting (dotted key) that differs between two resolved
  configs as JSON dicts, leaving out :data:`RESUME_NEUTRAL_KEYS` and the keys under them, and
  keys added since ``before`` was written whose value reproduces it. Optimiser and router
  settings are compared resolved (:func:`comparable`)."""
  # Keys added since ``before`` was written take the value that reproduces it.
  before, after = flatten(comparable(with_added_keys(before))), flatten(comparable(after))
  changes = []
  for key in sorted(before.keys() | after.keys()):
    if any(key == k or key.startswith(k + ".") for k in RESUME_NEUTRAL_KEYS):
      continue
    old, new = before.get(key, "(unset)"), after.get(key, "(unset)")
    if old != new:
      changes.append(f"{key}: {old!r} -> {new!r}")
  return changes


DAMAGED_CONFIG_ADVICE = (
    "It records the run's settings. Restore it from a backup, or move it away to go on with "
    "the current command's settings (capsjax then writes it anew).")


def read_raw(workdir: str) -> dict | None:
  """``WORKDIR/config.json`` as a dict (None if there is none); damaged: a UsageError."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return None
  return files.read_json(path, DAMAGED_CONFIG_ADVICE)


def comparable(raw: dict) -> dict:
  """A config as JSON with its optimiser and router settings resolved (defaults filled in),
  so that an unset setting and its default are the same setting."""
  from capsjax import routing
  from capsjax.training import optimizers

  raw = json.loads(json.dumps(raw))
  if isinstance(raw.get("optimizer"), dict):
    try:
      raw["optimizer"] = optimizers.resolve(ml_collections.ConfigDict(raw["optimizer"]))
    except UsageError:
      pass  # Compared as written.
  section = raw.get("model", {}).get("routing")
  if isinstance(section, dict):
    try:
      router, settings = routing.resolve(section)
    except UsageError:
      return raw
    # Other routers' settings, unset, are no setting of this run (new routers add them).
    raw["model"]["routing"] = {"name": router.name, **settings}
  return raw


def _changes(workdir: str, config, resumed_step: int | None) -> tuple[dict | None, list[str]]:
  """The run's earlier ``config.json`` (None when fresh) and how ``config`` differs from it."""
  earlier = read_raw(workdir) if resumed_step is not None else None
  if earlier is None:
    return None, []
  return earlier, config_changes(earlier, json.loads(config.to_json_best_effort()))


def announce_changes(workdir: str, config, resumed_step: int | None, log=print) -> list[str]:
  """Warns when a resumed run's settings differ from its ``config.json`` (at the start, before
  anything is written); returns the changes."""
  earlier, changes = _changes(workdir, config, resumed_step)
  if changes:
    log(f"Warning: resuming with settings that differ from the run's config.json: "
        f"{'; '.join(changes)}. The checkpoint's parameters, optimiser state, RNG and data "
        f"position carry on under the new settings; once a step has run with them, the "
        f"earlier config is kept as config.before_step_{resumed_step}.json.")
    if earlier.get("seed") != config.seed and config.data.validation_size:
      log("Warning: config.seed draws the validation split, so the new seed's validation "
          "examples overlap the ones trained on so far.")
  return changes


def record(workdir: str, config, resumed_step: int | None, log=print,
           announce: bool = True) -> None:
  """Writes ``WORKDIR/config.json``; when a resumed run changed settings, keeps the earlier
  file as ``config.before_step_N.json`` (``config.before_step_N.2.json`` and so on when that
  name holds another config already: nothing is overwritten), so the run's history is not
  lost. Call it once a step has run with ``config`` (a run that fails at its first step leaves
  the record as it was); ``announce``: also warn of the changes (:func:`announce_changes`)."""
  if announce:
    announce_changes(workdir, config, resumed_step, log)
  earlier, changes = _changes(workdir, config, resumed_step)
  if changes:
    kept = os.path.join(workdir, f"config.before_step_{resumed_step}.json")
    k = 1
    while os.path.exists(kept) and read_raw_file(kept) != earlier:
      k += 1
      kept = os.path.join(workdir, f"config.before_step_{resumed_step}.{k}.json")
    if not os.path.exists(kept):
      files.write_json(kept, earlier)
  with files.atomic_write(os.path.join(workdir, "config.json")) as f:
    f.write(config.to_json_best_effort(indent=2))


def read_raw_file(path: str) -> dict | None:
  """A kept config file as JSON, or None when it is not readable JSON (never overwritten)."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def load(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config a run saved in ``WORKDIR/config.json``, with tuples restored and
  the keys of later versions filled in with values that reproduce the run."""
  raw = read_raw(workdir)
  if raw is None:
    raise UsageError(f"{os.path.join(workdir, 'config.json')} not found: --workdir must be a "
                     "directory that `python -m capsjax.main` wrote.")
  return from_raw(raw)


def from_raw(raw: dict) -> ml_collections.ConfigDict:
  """A ConfigDict from a saved config.json's dict (see :func:`load`)."""
  return ml_collections.ConfigDict(tuples(with_added_keys(raw)))


def with_added_keys(raw: dict) -> dict:
  """A copy of a config.json's dict with the keys added since it was written
  (:data:`_DEFAULTS`, :data:`_DEFAULTS_OF`) set to the values that reproduce its run."""
  raw = json.loads(json.dumps(raw))

  def node_of(key):
    node, (*parents, leaf) = raw, key.split(".")
    for p in parents:
      node = node.setdefault(p, {})
    return node, leaf

  for key, value in _DEFAULTS.items():
    node, leaf = node_of(key)
    node.setdefault(leaf, value)
  for (key, value), keys in _DEFAULTS_OF.items():
    node, leaf = node_of(key)
    if node[leaf] == value:
      for added, default in keys.items():
        node, leaf = node_of(added)
        node.setdefault(leaf, default)
  return raw


def tuples(tree):
  """JSON's lists turned back into the tuples they were written from, at every depth (config
  files hold sequences as tuples)."""
  if isinstance(tree, dict):
    return {key: tuples(value) for key, value in tree.items()}
  if isinstance(tree, list):
    return tuple(tuples(value) for value in tree)
  return tree


def import_config_file(path: str | os.PathLike) -> types.ModuleType:
  """Imports a config file by path (config files are not a package), e.g. a base config
  from the file that extends it: ``import_config_file(pathlib.Path(__file__).with_name(
  "mnist.py"))``."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise UsageError(f"Config file {path} not found.")
  spec = importlib.util.spec_from_file_location(f"capsjax_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def check_same_model(runtime, workdir: str) -> None:
  """Raises UsageError when the checkpoints in ``workdir`` cannot hold ``runtime``'s train
  state: the run there trained a model (or optimiser) of other shapes. The message names the
  settings that differ from its ``config.json``. Without a readable earlier config there is
  nothing to compare, and the restore reports what it finds."""
  import jax

  from capsjax.training import optimizers, tasks, train_step

  earlier_raw = read_raw(workdir)
  if earlier_raw is None:
    return
  try:
    earlier = from_raw(earlier_raw)
    task = tasks.Task.from_config(earlier)
    tx = optimizers.build(earlier.optimizer).tx
    before = jax.eval_shape(lambda: train_step.init_state(task, tx))
  except Exception:  # A config this version cannot build: let the restore speak.
    return
  now = runtime.abstract_state()
  shapes = lambda tree: jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)
  if (jax.tree.structure(before) == jax.tree.structure(now)
      and shapes(before) == shapes(now)):
    return
  changes = config_changes(earlier_raw, json.loads(runtime.config.to_json_best_effort()))
  raise UsageError(
      f"{workdir} holds a run of another model: its checkpoints do not fit this config's "
      f"parameters or optimiser state. Settings that differ from its config.json: "
      f"{'; '.join(changes) or '(none written there; the code that builds the model changed)'}."
      " Use a new --workdir for this config, or rerun with that run's settings to go on "
      "with it.")
