"""Registries: a table of names to classes, the same for models, datasets and evaluators.

Each package keeps one table in its ``__init__.py``, name -> ``"module:Class"``, e.g.::

    MODELS = Registry("model", "config.model.name", {
        "capsnet": "capsjax.models.capsnet:CapsNet",
        "baseline_cnn": "capsjax.models.baseline_cnn:BaselineCNN",
    })

Adding one is one file (the class) plus one line in that table. A class is imported when
it is first asked for, so a module that fails to import breaks only the configs that use it,
and the command lines start without importing every model and dataset.

A researcher's own class needs no line in a table: the config names it by import path,
``"package.module:Class"`` (importable from the working directory or ``PYTHONPATH``) or
``"path/to/file.py:Class"`` (a file, relative to the working directory), e.g.
``config.model.name = "examples/tiny_capsnet.py:TinyCapsNet"``; it then works exactly as a
registered one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import types


class Registry:
  """Names to classes, imported on first use.

  Args:
    kind: what the entries are ("model"), for messages.
    key: the config key that names one ("config.model.name"), for messages.
    entries: name -> ``"package.module:Class"``.
    attribute: set on each class as it is loaded to the name it is registered under (e.g.
      a dataset builder's ``name``), when given.
  """

  def __init__(self, kind: str, key: str, entries: dict[str, str], attribute: str | None = None):
    self.kind, self.key, self.entries, self.attribute = kind, key, dict(entries), attribute

  def names(self) -> tuple[str, ...]:
    return tuple(sorted(self.entries))

  def __contains__(self, name) -> bool:
    return name in self.entries

  def get(self, name: str) -> type:
    """The class registered as ``name``, or named by its import path (``"module:Class"``,
    ``"file.py:Class"``); UsageError naming the key and the choices if none."""
    from capsjax.common.errors import UsageError

    if not isinstance(name, str) or (name not in self.entries and ":" not in name):
      raise UsageError(f"{self.key}={name!r} is not a registered {self.kind}; use one of "
                       f"{self.names()}, or name your own as 'module:Class' or "
                       f"'path/to/file.py:Class'.")
    module_name, _, attr = self.entries.get(name, name).partition(":")
    module = import_module(module_name, f"{self.key}={name!r}")
    if not hasattr(module, attr):
      raise UsageError(f"{self.key}={name!r}: {module_name} has no {attr!r}.")
    cls = getattr(module, attr)
    if self.attribute:
      setattr(cls, self.attribute, name)
    return cls


def import_module(name: str, what: str) -> types.ModuleType:
  """Module ``name`` (dotted), or the Python file ``name`` (ending in ``.py``, loaded once per
  process); UsageError saying ``what`` asked for it when it cannot be found."""
  from capsjax.common.errors import UsageError

  if not name.endswith(".py"):
    try:
      return importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name and not name.startswith(e.name) and not e.name.startswith(name):
        raise  # The module exists; something it imports is missing.
      raise UsageError(f"{what}: no module {name!r} (looked in the working directory "
                       f"{os.getcwd()} and PYTHONPATH).") from None
  path = os.path.abspath(name)
  if not os.path.isfile(path):
    raise UsageError(f"{what}: no file {path}.")
  key = f"capsjax_user_{os.path.basename(path)[:-3]}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
  if key not in sys.modules:
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # Before running it: dataclasses and pickling look it up.
    try:
      spec.loader.exec_module(module)
    except BaseException:
      del sys.modules[key]
      raise
  return sys.modules[key]
