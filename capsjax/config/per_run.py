"""The numbers that may differ between the runs of one program, declared as typed pytrees.

``python -m capsjax.sweep ... --vectorize`` trains the points of a sweep that differ only in numbers
as one jitted program: ``jax.vmap`` over the runs of the ordinary train step
(:mod:`capsjax.training.vectorize`). What may differ is declared in two places, and nowhere else:

* **the optimiser's** numbers are hyperparameters of its state (``optax.inject_hyperparams``;
  :data:`capsjax.training.optimizers.PER_RUN_KEYS`, the peak learning rate): each run's train
  state carries its own, so the step takes nothing for them;
* **a model's** are the fields of the class it names as ``per_run_numbers``: a frozen
  dataclass made by :func:`declare`, every field a float and a leaf of the pytree, read from
  the config key ``<section>.<field>``. The model's loss takes an instance,
  ``loss(..., numbers=...)``: in a vectorised step each run's (its fields traced scalars of
  the run axis), in an ordinary run None (the loss then uses the config's, compiled in). The
  capsule models' is :class:`capsjax.models.head_settings.LossSettings`.

A vectorised group's runs may differ in exactly these keys (:func:`config_keys`) and in the
initialisation-only settings; any other difference gives its runs a program of their own. A
number the loss reads is a field, so it cannot be read without being declared.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from capsjax.config import settings


def declare(section: str):
  """Class decorator: ``cls`` as a frozen dataclass of per-run numbers, each field the config
  key ``<section>.<field>`` (a field's default is the key's; one without a default is a key
  every config sets), registered as a JAX pytree whose leaves are the fields."""

  def wrap(cls):
    cls = dataclasses.dataclass(frozen=True)(cls)
    jax.tree_util.register_dataclass(
        cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])
    cls.section = section
    return cls

  return wrap


def config_keys(numbers_class: type | None) -> tuple[str, ...]:
  """The dotted config keys of ``numbers_class``' fields (none for None)."""
  if numbers_class is None:
    return ()
  return tuple(f"{numbers_class.section}.{f.name}" for f in dataclasses.fields(numbers_class))


def of_config(numbers_class: type, section: ml_collections.ConfigDict | None):
  """The numbers of one config's ``section`` (e.g. ``config.loss``; None: the config has
  none): each field's value there, or where it is unset the field's default. UsageError
  (:func:`capsjax.config.settings.read`) for an unset field without one, or a value that is
  not a number."""
  table = {f.name: settings.Setting(settings.REQUIRED if f.default is dataclasses.MISSING
                                    else f.default, f"{numbers_class.__name__}.{f.name}",
                                    kind=float) for f in dataclasses.fields(numbers_class)}
  values = settings.read(section, table, f"config.{numbers_class.section}")
  return numbers_class(**{name: float(value) for name, value in values.items()})


def stacked(numbers_class: type | None, configs: Sequence[ml_collections.ConfigDict]):
  """One instance whose fields are ``(runs,)`` float32 arrays, each config's value in its row:
  what a vectorised step maps over. None for a model that declares none."""
  if numbers_class is None:
    return None
  each = [of_config(numbers_class, c.get(numbers_class.section)) for c in configs]
  return jax.tree.map(lambda *values: jnp.asarray(np.array(values, np.float32)), *each)
