"""A run's config on disk: ``WORKDIR/config.json``, what a resume changed, and defaults for
workdirs written by earlier versions."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import types

import ml_collections

from capsjax.common import config_keys, defaults
from capsjax.common.errors import UsageError
from capsjax.common import files

# Keys added after the first workdirs were written, with the value that reproduces them: for
# every run, and (the second table) for runs of the model and dataset that had the key, which
# were the only ones when it was added (others never had it: a config.json round-trips exactly).
# Where a key is optional in every config, that value is the one leaving it out means
# (``config_keys.OPTIONAL_KEYS``).
_DEFAULTS = {"dataset": defaults.DATASET, "model.name": defaults.MODEL,
             "train.stop_at_accuracy": None, "optimizer.name": "adam",
             "optimizer.schedule": "exponential", "matmul_precision": "default"}


def _optional(*keys: str) -> dict:
  return {key: config_keys.OPTIONAL_KEYS[key] for key in keys}


_ORDER = ("data.order", "data.stream_window")
_DEFAULTS_OF = {
    ("model.name", "capsnet"): {**_optional("model.primary.output_scale",
                                            "model.class_capsules.scores"),
                                "model.routing.name": "dynamic", "loss.margin_weight": 1.0},
    ("model.name", "efficient_capsnet"): {"loss.margin_weight": 1.0},
    ("model.name", "baseline_cnn"): {"model.padding": "SAME", "model.bias_init": 0.0,
                                     "model.dense_init_scale": None,
                                     "model.loss": "cross_entropy"},
    ("dataset", "mnist"): {"data.pad": 0, **_optional("data.validation_split", *_ORDER)},
    ("dataset", "smallnorb"): _optional("data.viewpoint_split", "data.validation_split"),
    ("dataset", "multimnist"): _optional("data.validation_split", *_ORDER),
    **{("dataset", name): _optional("data.validation_split") for name in ("cifar10", "svhn")},
}
# Settings that registries own (a router's, an optimiser's) are not listed: they are compared
# resolved (:func:`capsjax.training.config_history.comparable`).


def _drop_removed_settings(raw: dict) -> None:
  """Unsets, in place, settings a later version no longer has where they did not change what
  a run computed: dynamic routing's ``model.routing.gradient`` (``"autodiff"``, or
  ``"analytic"``, its written-out backward pass, equal to autodiff's gradient to rounding;
  since 2026-11-28 experiments/dynamic_gradient.py)."""
  section = raw.get("model", {}).get("routing")
  if isinstance(section, dict) and (section.get("name") or "dynamic") == "dynamic":
    if section.get("gradient") is not None:
      section["gradient"] = None


def flatten(tree: dict, prefix: str = "") -> dict:
  """A nested dict as ``{"dotted.key": value}``."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


DAMAGED_CONFIG_ADVICE = (
    "It records the run's settings. Restore it from a backup, or move it away to go on with "
    "the current command's settings (capsjax then writes it anew).")


def read_raw(workdir: str) -> dict | None:
  """``WORKDIR/config.json`` as a dict (None if there is none); damaged: a UsageError."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return None
  return files.read_json(path, DAMAGED_CONFIG_ADVICE)


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
  (:data:`_DEFAULTS`, :data:`_DEFAULTS_OF`) set to the values that reproduce its run, and
  settings removed since unset (:func:`_drop_removed_settings`)."""
  raw = json.loads(json.dumps(raw))
  _drop_removed_settings(raw)

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
