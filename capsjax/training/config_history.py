"""What a resumed run changed: its settings against the ``config.json`` it wrote before
(announced at the start, recorded once a step has run with them, the earlier file kept), and
the refusal of a workdir whose checkpoints hold another model.

Configs are compared resolved (:func:`comparable`): an unset setting and its default are the
same setting. Settings declared ``neutral`` (how often a run logs or checkpoints, where its
files are) may change on a resume without a word.
"""

from __future__ import annotations

import json
import os

import jax
import ml_collections

from capsjax import routing
from capsjax.common import files
from capsjax.common.errors import UsageError
from capsjax.runs import migrations, runconfig
from capsjax.runs.runconfig import flatten
from capsjax.training import optimizers, schema, tasks, train_step

def config_changes(before: dict, after: dict) -> list[str]:
  """``"key: old -> new"`` for each setting (dotted key) that differs between two configs as
  JSON dicts (``before`` of any earlier version: migrated first), both resolved
  (:func:`comparable`), leaving out the settings declared ``neutral`` and the keys under them."""
  before, after = comparable(migrations.migrate(before)), comparable(after)
  neutral = schema.neutral_keys(after)
  before, after = flatten(before), flatten(after)
  changes = []
  for key in sorted(before.keys() | after.keys()):
    if any(key == k or key.startswith(k + ".") for k in neutral):
      continue
    old, new = before.get(key, "(unset)"), after.get(key, "(unset)")
    if old != new:
      changes.append(f"{key}: {old!r} -> {new!r}")
  return changes


def comparable(raw: dict) -> dict:
  """A config as JSON, resolved (every default filled in:
  :func:`capsjax.training.schema.resolve_config`), so that an unset setting and its default
  are the same setting; as written where this version cannot resolve it."""
  raw = json.loads(json.dumps(raw))
  try:
    config = schema.resolve_config(ml_collections.ConfigDict(runconfig.tuples(raw)))
  except Exception:  # Not whole, or another version's: its registries' sections resolved alone.
    return _sections_resolved(raw)
  return json.loads(config.to_json_best_effort())


def _sections_resolved(raw: dict) -> dict:
  """``raw`` with its optimiser and router sections resolved where they can be, the rest as
  written (a config this version cannot resolve whole)."""
  if isinstance(raw.get("optimizer"), dict):
    try:
      raw["optimizer"] = optimizers.resolve(raw["optimizer"])
    except UsageError:
      pass
  section = raw.get("model", {}).get("routing")
  if isinstance(section, dict):
    try:
      router, settings = routing.resolve(section)
      raw["model"]["routing"] = {"name": router.name, **settings}
    except UsageError:
      pass
  return raw


def _changes(workdir: str, config, resumed_step: int | None) -> tuple[dict | None, list[str]]:
  """The run's earlier ``config.json`` (None when fresh) and how ``config`` differs from it."""
  earlier = runconfig.read_raw(workdir) if resumed_step is not None else None
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
    while os.path.exists(kept) and runconfig.read_raw_file(kept) != earlier:
      k += 1
      kept = os.path.join(workdir, f"config.before_step_{resumed_step}.{k}.json")
    if not os.path.exists(kept):
      files.write_json(kept, earlier, what="the config history (the earlier config)")
  with files.atomic_write(os.path.join(workdir, "config.json"),
                          what="the config history (the run's config)") as f:
    json.dump(migrations.versioned(json.loads(config.to_json_best_effort())), f, indent=2)


def check_same_model(setup, workdir: str) -> None:
  """Raises UsageError when the checkpoints in ``workdir`` cannot hold ``setup``'s train
  state: the run there trained a model (or optimiser) of other shapes. The message names the
  settings that differ from its ``config.json``. Without a readable earlier config there is
  nothing to compare, and the restore reports what it finds."""
  earlier_raw = runconfig.read_raw(workdir)
  if earlier_raw is None:
    return
  try:
    earlier = runconfig.from_raw(earlier_raw)
    task = tasks.Task.from_config(earlier)
    tx = optimizers.build(earlier.optimizer).tx
    before = jax.eval_shape(lambda: train_step.init_state(task, tx))
  except Exception:  # A config this version cannot build: let the restore speak.
    return
  now = setup.abstract_state()
  shapes = lambda tree: jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)
  if (jax.tree.structure(before) == jax.tree.structure(now)
      and shapes(before) == shapes(now)):
    return
  changes = config_changes(earlier_raw, json.loads(setup.config.to_json_best_effort()))
  raise UsageError(
      f"{workdir} holds a run of another model: its checkpoints do not fit this config's "
      f"parameters or optimiser state. Settings that differ from its config.json: "
      f"{'; '.join(changes) or '(none written there; the code that builds the model changed)'}."
      " Use a new --workdir for this config, or rerun with that run's settings to go on "
      "with it.")
