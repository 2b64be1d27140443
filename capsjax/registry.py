"""Registries: a table of names to classes, the same for models, datasets and evaluators.

Each package keeps one table in its ``__init__.py``, name -> ``"module:Class"``, e.g.::

    MODELS = Registry("model", "config.model.name", {
        "capsnet": "capsjax.models.capsnet:CapsNet",
        "baseline_cnn": "capsjax.models.baseline_cnn:BaselineCNN",
    })

Adding one is one file (the class) plus one line in that table. A class is imported when
it is first asked for, so a module that fails to import breaks only the configs that use it,
and the command lines start without importing every model and dataset.
"""

from __future__ import annotations

import importlib


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
    """The class registered as ``name``; UsageError naming the key and the choices if none."""
    if name not in self.entries:
      from capsjax.errors import UsageError

      raise UsageError(f"{self.key}={name!r} is not a registered {self.kind}; use one of "
                       f"{self.names()}.")
    module, _, attr = self.entries[name].partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if self.attribute:
      setattr(cls, self.attribute, name)
    return cls
