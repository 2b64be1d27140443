"""A name -> class table filled by a class decorator (datasets, evaluators)."""

from __future__ import annotations

from typing import Callable


class Registry:
  """``@registry.register("name")`` records a class and sets ``cls.<attribute> = name``."""

  def __init__(self, kind: str, attribute: str):
    self.kind, self.attribute = kind, attribute
    self.classes: dict[str, type] = {}

  def register(self, name: str) -> Callable[[type], type]:
    def wrap(cls):
      if name in self.classes:
        raise ValueError(f"{self.kind} {name!r} is registered twice.")
      setattr(cls, self.attribute, name)
      self.classes[name] = cls
      return cls
    return wrap

  def names(self) -> tuple[str, ...]:
    return tuple(sorted(self.classes))
