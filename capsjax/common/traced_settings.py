"""Settings that differ between the runs of one vectorised program, passed as data.

``python -m capsjax.sweep ... --vectorize`` trains the points of a sweep that differ only in
numbers as one jitted program: ``jax.vmap`` over the runs of the ordinary train step
(:mod:`capsjax.training.vectorize`). The numbers that may differ are the step's argument
``settings``, ``{dotted config key: scalar}`` (each run's value, a traced scalar of the run
axis under vmap; empty in every ordinary run), handed explicitly to what reads them: the
optimiser (:meth:`capsjax.training.optimizers.Optimizer.transform`: the schedule's peak
``optimizer.learning_rate``) and the model's loss (``model.loss(..., settings=...)``: the
capsule head's ``loss.m_plus``, ``loss.m_minus``, ``loss.lam``, ``loss.reconstruction_weight``,
``loss.margin_weight``). Which keys may be passed is declared
(:data:`capsjax.training.vectorize.TRACED_KEYS` and a model class's ``traced_settings``); the
sweep checks that the step reads each declared one (:class:`Recording`), and one it does not
read keeps its runs apart. Settings a model declares initialisation-only
(``init_only_settings``) and ``seed`` need none: each run is initialised on its own.
"""

from __future__ import annotations

from typing import Any, Mapping


def value(settings: Mapping[str, Any] | None, key: str, default):
  """The run's value of ``key`` (a dotted config key, e.g. ``loss.m_plus``) in ``settings``,
  or ``default`` (the config's number) where it is not passed."""
  if settings is None or key not in settings:
    return default
  return settings[key]


def is_traced(settings: Mapping[str, Any] | None, key: str) -> bool:
  """Whether ``key`` is passed as a traced value (its value cannot steer Python control flow)."""
  return settings is not None and key in settings


class Recording(dict):
  """A settings dict that records which keys were read (``reads``)."""

  def __init__(self, values: Mapping[str, Any]):
    super().__init__(values)
    self.reads: set[str] = set()

  def __contains__(self, key) -> bool:
    found = super().__contains__(key)
    if found:
      self.reads.add(key)
    return found

  def __getitem__(self, key):
    self.reads.add(key)
    return super().__getitem__(key)

  def get(self, key, default=None):
    if super().__contains__(key):
      self.reads.add(key)
    return super().get(key, default)
