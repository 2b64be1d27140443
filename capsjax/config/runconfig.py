"""A run's config on disk: ``WORKDIR/config.json``, read in this version's form (earlier
forms migrated: :mod:`capsjax.config.migrations`)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import types

import ml_collections

from capsjax.common.errors import UsageError
from capsjax.common import files
from capsjax.config import migrations, settings

flatten = settings.flatten  # A nested dict as ``{"dotted.key": value}``.

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
  """A ConfigDict from a saved config.json's dict in this version's form (every migration
  since the version it records applied: :func:`capsjax.config.migrations.migrate`)."""
  return ml_collections.ConfigDict(tuples(migrations.migrate(raw)))


def tuples(tree):
  """JSON's lists turned back into the tuples they were written from, at every depth (config
  files hold sequences as tuples)."""
  if isinstance(tree, dict):
    return {key: tuples(value) for key, value in tree.items()}
  if isinstance(tree, list):
    return tuple(tuples(value) for value in tree)
  return tree


def import_config_file(path: str | os.PathLike) -> types.ModuleType:
  """Imports a config file by path (config files are not a package), e.g. a base config from the
  file that extends it: ``import_config_file(pathlib.Path(__file__).with_name("mnist.py"))``."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise UsageError(f"Config file {path} not found.")
  spec = importlib.util.spec_from_file_location(f"capsjax_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
