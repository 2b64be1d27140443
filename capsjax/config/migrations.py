"""Every earlier form of a run's ``config.json``, brought to this version's in one ordered chain.

``config.json`` records ``schema_version`` (:data:`SCHEMA_VERSION`; files written before
2026-11-28 have none: version 0). :func:`migrate` applies, in order, each migration newer than
the file's version; each one turns a file of the version before into one of its own, with the
values that reproduce the run that wrote it (a config.json of this version round-trips
exactly). No model, router, dataset or optimiser keeps code for old configs: a change that
would need it adds a migration here, with a real config.json of the old form under
``tests/data/config_forms/`` and a test that resumes it (tests/test_migrations.py).

Add one: append ``Migration(version=SCHEMA_VERSION + 1, since="DATE: what changed",
apply=fn)`` where ``fn(raw)`` edits the dict in place, and bump nothing else.
"""

from __future__ import annotations

import json
from typing import Callable, NamedTuple

from capsjax.common.errors import UsageError


class Migration(NamedTuple):
  version: int                    # The schema version a file has after it.
  since: str                      # When and what changed.
  apply: Callable[[dict], None]   # Edits a config.json's dict in place.


# Keys added from the first workdirs (2026-11-21) to 2026-11-28, with the value that
# reproduces the runs written before them: for every run, and (the second table) for runs of
# the model and dataset that had the key, which were the only ones when it was added. Settings
# that registries own (a router's, an optimiser's) are not listed: their defaults, which
# resolving the config fills in, are what those runs ran.
ADDED_KEYS = {"dataset": "mnist", "model.name": "capsnet",
              "train.stop_at_accuracy": None, "optimizer.name": "adam",
              "optimizer.schedule": "exponential", "matmul_precision": "default"}
_ORDER = {"data.order": "permutation", "data.stream_window": 5384}
_RANDOM = {"data.validation_split": "random"}
ADDED_KEYS_OF = {
    ("model.name", "capsnet"): {"model.primary.output_scale": 1.0,
                                "model.class_capsules.scores": "auto",
                                "model.routing.name": "dynamic", "loss.margin_weight": 1.0,
                                "model.class_capsules.use_bias": False},
    ("model.name", "efficient_capsnet"): {"loss.margin_weight": 1.0},
    ("model.name", "baseline_cnn"): {"model.padding": "SAME", "model.bias_init": 0.0,
                                     "model.dense_init_scale": None, "model.loss": "cross_entropy"},
    ("dataset", "mnist"): {"data.pad": 0, **_RANDOM, **_ORDER},
    ("dataset", "smallnorb"): {"data.viewpoint_split": "", **_RANDOM},
    ("dataset", "multimnist"): {**_RANDOM, **_ORDER},
    **{("dataset", name): _RANDOM for name in ("cifar10", "svhn")},
}


def _set_default(raw: dict, key: str, value):
  node, (*parents, leaf) = raw, key.split(".")
  for p in parents:
    node = node.setdefault(p, {})
  return node.setdefault(leaf, value)


def _add_keys(raw: dict) -> None:
  """Version 1: :data:`ADDED_KEYS` and :data:`ADDED_KEYS_OF` set where a file lacks them."""
  # Each condition of ADDED_KEYS_OF is on a key of ADDED_KEYS (model.name, dataset): set by now.
  found = {key: _set_default(raw, key, value) for key, value in ADDED_KEYS.items()}
  for (key, value), keys in ADDED_KEYS_OF.items():
    if found[key] == value:
      for added, default in keys.items():
        _set_default(raw, added, default)


def _unset_dynamic_gradient(raw: dict) -> None:
  """Version 2: dynamic routing's ``model.routing.gradient`` (``"autodiff"``, or
  ``"analytic"``, its written-out backward pass, equal to autodiff's gradient to rounding;
  now experiments/dynamic_gradient.py) unset. EM's was kept (until version 3)."""
  section = raw.get("model", {}).get("routing")
  if isinstance(section, dict) and (section.get("name") or "dynamic") == "dynamic":
    if section.get("gradient") is not None:
      section["gradient"] = None


def _drop_routing_gradient(raw: dict) -> None:
  """Version 3: ``model.routing.gradient`` removed, the last router's (EM's: ``"analytic"``, its
  written-out backward pass, or ``"autodiff"`` of its reference loop, ``"auto"`` resolved to
  one of them; both equal to rounding to the one loop EM runs since, differentiated by JAX;
  now experiments/em_loop_forms.py). Every built-in router's file recorded the key, unset but
  for EM: it goes where it is unset or the router is EM. A router named by import path that
  declares a ``gradient`` of its own keeps its value."""
  section = raw.get("model", {}).get("routing")
  if isinstance(section, dict) and "gradient" in section:
    if section["gradient"] is None or section.get("name") == "em":
      del section["gradient"]


# The config sections a model that is not a capsule model never read, though the configs built
# on configs/mnist.py carried them (the margin loss's settings).
_UNREAD = {"baseline_cnn": ("loss",)}


def _drop_unread_sections(raw: dict) -> None:
  """Version 4: settings are declared beside the code that reads them, and a key no code
  reads is refused; the sections a model never read (:data:`_UNREAD`) leave its config.json."""
  for section in _UNREAD.get(raw.get("model", {}).get("name"), ()):
    raw.pop(section, None)


MIGRATIONS = (
    Migration(1, "2026-11-21 to 2026-11-28: keys added before config.json had a version",
              _add_keys),
    Migration(2, "2026-11-28: dynamic routing's gradient setting removed",
              _unset_dynamic_gradient),
    Migration(3, "2026-11-29: EM routing's gradient setting removed (one loop, autodiff)",
              _drop_routing_gradient),
    Migration(4, "2026-11-29: settings declared beside their code; unread sections dropped",
              _drop_unread_sections),
)
SCHEMA_VERSION = MIGRATIONS[-1].version
VERSION_KEY = "schema_version"


def migrate(raw: dict) -> dict:
  """A copy of a config.json's dict in this version's form, without its ``schema_version``
  (the file's, not a setting). UsageError for a file a newer capsjax wrote."""
  raw = json.loads(json.dumps(raw))
  version = raw.pop(VERSION_KEY, 0)
  if not isinstance(version, int) or version > SCHEMA_VERSION:
    raise UsageError(f"config.json has schema_version={version!r}, newer than this capsjax's "
                     f"{SCHEMA_VERSION}: it was written by a later version; upgrade capsjax "
                     "to resume or evaluate this run.")
  for migration in MIGRATIONS:
    if migration.version > version:
      migration.apply(raw)
  return raw


def versioned(raw: dict) -> dict:
  """``raw`` (a config as JSON) with this version's ``schema_version``, as config.json holds it."""
  return {VERSION_KEY: SCHEMA_VERSION, **raw}
