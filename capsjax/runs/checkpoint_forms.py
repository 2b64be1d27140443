"""Every earlier layout of a checkpoint's train state, and how each becomes this version's, in
one place beside the config.json chain (:mod:`capsjax.config.migrations`).

A checkpoint is restored in this version's layout first; where that fails,
:meth:`capsjax.runs.checkpointing.Checkpointer.restore` tries the layouts of :func:`older_forms`
in turn, each with the function that upgrades it. The layouts so far:

* before 2026-11-28 the peak learning rate was compiled into the optimiser, not held in its
  state (``optax.inject_hyperparams``): the optimiser state is the inner one, wrapped here with
  the config's peak (:func:`with_injected`);
* before the model state existed (BatchNorm's statistics; 2026-11-25), the train state had four
  fields (:class:`StatelessTrainState`), for stateless models only.

Add one: a form here, with a real checkpoint of it under ``tests/data/`` and a test that
resumes it (tests/test_migrations.py holds the two above).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class StatelessTrainState:
  """The train state as checkpoints written before ``model_state`` existed hold it."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def with_injected(opt_state, numbers: dict[str, float]):
  """An optimiser state of the form before the peak was state (the inner transformation's) wrapped
  as ``optax.inject_hyperparams`` holds it, its hyperparameters ``numbers`` (the config's peak)."""
  hyperparams = {k: jnp.asarray(v, jnp.float32) for k, v in numbers.items()}
  count = jnp.zeros((), jnp.int32)  # Counts nothing read: the peak is no schedule.
  return optax.InjectStatefulHyperparamsState(count=count, hyperparams=hyperparams,
                                              hyperparams_states={}, inner_state=opt_state)


def older_forms(abstract, optimizer) -> list[tuple[Any, Callable]]:
  """``[(abstract, upgrade)]``: the earlier layouts a checkpoint of the train state ``abstract``
  (its shapes and placement) may have, each with the function that turns it into this version's.

  ``optimizer`` (:class:`capsjax.training.optimizers.Optimizer`) gives the inner transformation
  (``uninjected``, the peak compiled in) and the config's peak (``per_run_numbers``)."""
  sharding = jax.tree.leaves(abstract.step)[0].sharding
  plain = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                       jax.eval_shape(optimizer.uninjected.init, abstract.params))
  inject = lambda opt_state: with_injected(opt_state, optimizer.per_run_numbers())
  forms = [(abstract.replace(opt_state=plain), lambda s: s.replace(opt_state=inject(s.opt_state)))]
  if not jax.tree.leaves(abstract.model_state):
    old = StatelessTrainState(abstract.step, abstract.params, plain, abstract.rng)
    forms.append((old, lambda s: type(abstract)(s.step, s.params, inject(s.opt_state), s.rng, {})))
  return forms
