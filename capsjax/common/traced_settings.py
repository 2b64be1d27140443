"""Settings that differ between the runs of one vectorised program.

``python -m capsjax.sweep ... --vectorize`` trains the points of a sweep that differ only in
numbers as one jitted program: ``jax.vmap`` over the runs of the ordinary train step
(:mod:`capsjax.training.vectorize`). A number that the step reads from the config at trace
time would be the same constant for every run, so the places that read a setting that may
differ between runs ask this module for it::

    weight = traced_settings.value("loss.reconstruction_weight", settings.reconstruction_weight)

Outside a vectorised step (every ordinary run) ``value`` returns the config's number, so
nothing changes. Inside one it returns the run's own value, a traced scalar of the run axis.
The settings read this way are declared (:data:`capsjax.training.vectorize.TRACED_KEYS`
and a model class's ``traced_settings``); each read is recorded, so the sweep checks that the
step really reads each declared one this way (one it does not splits the group: see
:func:`capsjax.training.vectorize.plan_groups`).

Settings read this way: ``optimizer.learning_rate`` (the schedule's peak), and the capsule
head's loss (``loss.m_plus``, ``loss.m_minus``, ``loss.lam``, ``loss.reconstruction_weight``).
Settings a model declares initialisation-only (``init_only_settings``) and ``seed`` need none:
each run is initialised on its own.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator


class _Traced:
  def __init__(self, values: dict[str, Any]):
    self.values = dict(values)
    self.reads: set[str] = set()


_active: contextvars.ContextVar[_Traced | None] = contextvars.ContextVar(
    "capsjax_traced_settings", default=None)


@contextlib.contextmanager
def traced(values: dict[str, Any]) -> Iterator[set[str]]:
  """While active, :func:`value` returns ``values[key]`` for each dotted config key of
  ``values``. Yields the set of keys read so far (filled as the step is traced)."""
  token = _active.set(_Traced(values))
  try:
    yield _active.get().reads
  finally:
    _active.reset(token)


def value(key: str, default):
  """The setting ``key`` (a dotted config key, e.g. ``loss.m_plus``) of the run being traced,
  or ``default`` (the config's value) outside a vectorised step or when ``key`` does not
  differ between its runs."""
  active = _active.get()
  if active is None or key not in active.values:
    return default
  active.reads.add(key)
  return active.values[key]


def is_traced(key: str) -> bool:
  """Whether ``key`` is a traced value here (its value cannot steer Python control flow)."""
  active = _active.get()
  return active is not None and key in active.values
