"""Deprecated (2026-11-28): one run's settings of a vectorised program as ``{dotted key: scalar}``.

The numbers that may differ between the runs of one program are now typed pytrees
(:mod:`capsjax.common.per_run`): a model's loss takes an instance of its class's
``per_run_numbers`` (``loss(..., numbers=...)``), and the learning rate is in the optimiser
state. These two helpers stay for a release for models written against the dict; nothing in
capsjax passes one any more.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

_MOVED = ("capsjax.common.traced_settings is deprecated: a model's per-run numbers are the "
          "fields of its per_run_numbers class (capsjax.common.per_run), given to its loss as "
          "numbers=; this module goes in the next release.")


def value(settings: Mapping[str, Any] | None, key: str, default):
  """The run's value of ``key`` (a dotted config key, e.g. ``loss.m_plus``) in ``settings``,
  or ``default`` (the config's number) where it is not passed. Deprecated."""
  warnings.warn(_MOVED, DeprecationWarning, stacklevel=2)
  if settings is None or key not in settings:
    return default
  return settings[key]


def is_traced(settings: Mapping[str, Any] | None, key: str) -> bool:
  """Whether ``key`` is passed as a traced value. Deprecated."""
  warnings.warn(_MOVED, DeprecationWarning, stacklevel=2)
  return settings is not None and key in settings
