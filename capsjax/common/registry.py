"""Registries: names to classes (or routers), the same for models, datasets, routers and
evaluators (:mod:`capsjax.config.registries`).

A registry reads its entries from its package's files, without importing them: a module of
the package registers by a top-level assignment to the registry's export name, under the
module's own name, or to the plural for several under names of their own::

    MODEL = CapsNet                                  # capsjax/models/capsnet.py: "capsnet"
    DATASETS = {"cifar10": CIFAR10, "svhn": SVHN}    # capsjax/datasets/images.py

So adding one is one file: nothing else to edit. An entry is imported when it is first asked
for, so a module that fails to import breaks only the configs that use it, and the command
lines start without importing every model and dataset.

A researcher's own class needs no line in a table: the config names it by import path,
``"package.module:Class"`` (importable from the working directory or ``PYTHONPATH``) or
``"path/to/file.py:Class"`` (a file, relative to the working directory), e.g.
``config.model.name = "examples/tiny_capsnet.py:TinyCapsNet"``; it then works exactly as a
registered one.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import os
import pathlib
import sys
import types
from capsjax.common.errors import UsageError


class Registry:
  """Names to classes, read from a package's files and imported on first use.

  Args:
    kind: what the entries are ("model"), for messages.
    key: the config key that names one ("config.model.name"), for messages.
    package: the package whose modules register (``"capsjax.models"``).
    export: the name a module assigns to register one entry under its own name (``"MODEL"``);
      the plural (``"MODELS"``), a dict literal, registers several under its keys.
    attribute: set on each class as it is loaded to the name it is registered under (e.g.
      a dataset builder's ``name``), when given.
  """

  def __init__(self, kind: str, key: str, package: str, export: str, attribute: str | None = None):
    self.kind, self.key, self.package, self.export = kind, key, package, export
    self.attribute = attribute
    self._entries: dict[str, str] | None = None

  @property
  def entries(self) -> dict[str, str]:
    """name -> ``"package.module:EXPORT"`` (or ``"...:EXPORTS[name]"``), read once."""
    if self._entries is None:
      self._entries = registered(self.package, self.export)
    return self._entries

  def names(self) -> tuple[str, ...]:
    return tuple(sorted(self.entries))

  def __contains__(self, name) -> bool:
    return name in self.entries

  def get(self, name: str) -> type:
    """The class registered as ``name``, or named by its import path (``"module:Class"``,
    ``"file.py:Class"``); UsageError naming the key and the choices if none."""
    if not isinstance(name, str) or (name not in self.entries and ":" not in name):
      raise UsageError(f"{self.key}={name!r} is not a registered {self.kind}; use one of "
                       f"{self.names()}, or name your own as 'module:Class' or "
                       f"'path/to/file.py:Class'.")
    module_name, _, attr = self.entries.get(name, name).partition(":")
    attr, _, item = attr.partition("[")
    module = import_module(module_name, f"{self.key}={name!r}")
    if not hasattr(module, attr):
      raise UsageError(f"{self.key}={name!r}: {module_name} has no {attr!r}.")
    cls = getattr(module, attr)
    if item:
      cls = cls[item.rstrip("]")]
    if self.attribute:
      setattr(cls, self.attribute, name)
    return cls


def registered(package: str, export: str) -> dict[str, str]:
  """The entries the modules of ``package`` register (see the module docstring), read from
  their source (nothing is imported but the package's parent)."""
  spec = importlib.util.find_spec(package)
  entries = {}
  for folder in spec.submodule_search_locations:
    for path in sorted(p for p in pathlib.Path(folder).glob("*.py") if p.name != "__init__.py"):
      module = f"{package}.{path.stem}"
      for node in ast.parse(path.read_text(), str(path)).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 \
            else None
        if not isinstance(target, ast.Name):
          continue
        if target.id == export:
          entries[path.stem] = f"{module}:{export}"
        elif target.id == export + "S" and isinstance(node.value, ast.Dict):
          for key in node.value.keys:
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
              entries[key.value] = f"{module}:{export}S[{key.value}]"
  return entries


def import_module(name: str, what: str) -> types.ModuleType:
  """Module ``name`` (dotted), or the Python file ``name`` (ending in ``.py``, loaded once per
  process); UsageError saying ``what`` asked for it when it cannot be found."""
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
