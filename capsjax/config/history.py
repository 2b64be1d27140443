"""What a resumed run changed: its settings against the ``config.json`` it wrote before
(announced at the start, recorded once a step has run with them, the earlier file kept), and
the settings a run may change on a resume.

Configs are compared resolved (:func:`comparable`): an unset setting and its default are the
same setting. Settings declared ``neutral`` (how often a run logs or checkpoints, where its
files are) may change on a resume without a word.
"""

from __future__ import annotations

import contextlib
import json
import os

import ml_collections

from capsjax.common import files
from capsjax.common.errors import UsageError
from capsjax.config import migrations, optimizer, runconfig, schema
from capsjax.config.runconfig import flatten

def config_changes(before: dict, after) -> list[str]:
  """``"key: old -> new"`` for each setting (dotted key) that differs between two configs as
  JSON dicts (``before`` of any earlier version: migrated first), both resolved
  (:func:`comparable`; ``after`` may be a run's resolved config, read as it is), leaving out
  the settings declared ``neutral`` and the keys under them."""
  before = comparable(migrations.migrate(before))
  after = (json.loads(after.to_json_best_effort()) if isinstance(after, schema.ResolvedConfig)
           else comparable(after))
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
  :func:`capsjax.config.schema.resolve_config`), so that an unset setting and its default
  are the same setting; as written where this version cannot resolve it."""
  raw = json.loads(json.dumps(raw))
  try:
    config = schema.resolve_config(ml_collections.ConfigDict(runconfig.tuples(raw)))
  except UsageError:  # Not whole, or another version's: its registries' sections resolved alone.
    return _sections_resolved(raw)
  return json.loads(config.to_json_best_effort())


def _sections_resolved(raw: dict) -> dict:
  """``raw`` with its optimiser and router sections resolved where they can be, the rest as
  written (a config this version cannot resolve whole)."""
  if isinstance(raw.get("optimizer"), dict):
    with contextlib.suppress(UsageError):
      raw["optimizer"] = optimizer.resolve(raw["optimizer"])
  section = raw.get("model", {}).get("routing")
  if isinstance(section, dict):
    with contextlib.suppress(UsageError):
      router, settings = schema.resolve_routing(section)
      raw["model"]["routing"] = {"name": router.name, **settings}
  return raw


def _changes(workdir: str, config, resumed_step: int | None) -> tuple[dict | None, list[str]]:
  """The run's earlier ``config.json`` (None when fresh) and how ``config`` differs from it."""
  earlier = runconfig.read_raw(workdir) if resumed_step is not None else None
  if earlier is None:
    return None, []
  return earlier, config_changes(earlier, schema.as_resolved(config))


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
