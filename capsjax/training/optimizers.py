"""The optimiser and its learning-rate schedule, from ``config.optimizer``, through optax.

Built once per run (:func:`build`) and used by the train step, the learning-rate log and the
restore. Its settings, their defaults, ranges and resolution are
:mod:`capsjax.config.optimizer`'s (``name`` picks the optimiser, ``schedule`` the schedule). The
peak ``learning_rate`` is held in the optimiser state (``optax.inject_hyperparams``) so that the
runs of one vectorised program may differ in it (:data:`PER_RUN_KEYS`).
"""

from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp
import ml_collections
import optax

from capsjax.common.errors import UsageError
from capsjax.config import settings as settings_lib
# The settings' tables and resolver, where the config's schema reads them (re-exported).
from capsjax.config.optimizer import (COMMON, EPOCH_TWINS, OPTIMIZERS,  # noqa: F401
                                      SCHEDULES, declared, resolve)


def _steps(settings: dict, key: str, steps_per_epoch: int | None):
  """``settings[key]`` in steps, from it or from its epochs twin (None if neither is set)."""
  epochs = next((e for e, s in EPOCH_TWINS.items() if s == key), None)
  if epochs is not None and settings.get(epochs) is not None:
    if not steps_per_epoch:
      raise UsageError(f"config.optimizer.{epochs} needs the number of steps per epoch, "
                       "which this command does not know; give config.optimizer."
                       f"{key} in steps.")
    value = settings[epochs]
    if isinstance(value, (tuple, list)):
      return tuple(int(round(v * steps_per_epoch)) for v in value)
    return max(1, int(round(value * steps_per_epoch)))
  return settings.get(key)


def make_schedule(settings: dict, steps_per_epoch: int | None = None,
                  num_steps: int | None = None) -> optax.Schedule:
  """The learning rate at each step, from :func:`resolve`'s settings."""
  lr = settings["learning_rate"]
  warmup = _steps(settings, "warmup_steps", steps_per_epoch) or 0
  name = settings["schedule"]
  if name == "exponential":
    schedule = optax.exponential_decay(lr, _steps(settings, "decay_steps", steps_per_epoch),
                                       settings["decay_rate"], staircase=settings["staircase"],
                                       end_value=settings["end_value"] or None)  # 0: none.
  elif name == "cosine":
    length = _steps(settings, "decay_steps", steps_per_epoch)
    if length is None:
      if num_steps is None:
        raise UsageError("The cosine schedule decays over the whole run by default, whose "
                         "length this command does not know; set config.optimizer.decay_steps.")
      length = max(1, num_steps - warmup)
    schedule = optax.cosine_decay_schedule(lr, length, alpha=settings["alpha"])
  elif name == "piecewise":
    bounds = _steps(settings, "boundaries", steps_per_epoch)
    schedule = optax.piecewise_constant_schedule(
        lr, {int(b): float(s) for b, s in zip(bounds, settings["scales"])})
  else:
    schedule = optax.constant_schedule(lr)
  if warmup:
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), schedule], [warmup])
  return schedule


def scale_by_adam_eps_hat(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam's scaling as TF1's ``AdamOptimizer`` computes it (the official CapsNet code's):
  ``sqrt(1 - b2^t) / (1 - b1^t) * m_t / (sqrt(v_t) + eps)``, eps added to the root of the
  uncorrected second moment (Kingma & Ba's "epsilon hat"); optax's ``scale_by_adam`` adds it to
  the corrected one, ``m_hat / (sqrt(v_hat) + eps)``. The two differ by eps / sqrt(1 - b2^t)
  against eps: most in the first steps, and not at all with eps 0. Its state is optax's
  ``ScaleByAdamState``, so checkpoints of either form restore in the other."""
  adam = optax.scale_by_adam(b1, b2, eps)

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    scale = jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    updates = jax.tree.map(lambda m, v: scale * m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(adam.init, update)


def _transform(settings: dict, schedule: optax.Schedule) -> optax.GradientTransformation:
  s = settings
  if s["name"] == "adam" and s.get("eps_hat"):
    return optax.chain(scale_by_adam_eps_hat(s["b1"], s["b2"], s["eps"]),
                       optax.scale_by_learning_rate(schedule))
  if s["name"] == "adam":
    return optax.adam(schedule, b1=s["b1"], b2=s["b2"], eps=s["eps"])
  if s["name"] == "adamw":
    return optax.adamw(schedule, b1=s["b1"], b2=s["b2"], eps=s["eps"],
                       weight_decay=s["weight_decay"])
  if s["name"] == "sgd":
    return optax.sgd(schedule, momentum=s["momentum"] or None, nesterov=s["nesterov"])
  return optax.rmsprop(schedule, decay=s["decay"], eps=s["eps"], momentum=s["momentum"] or None,
                       centered=s["centered"])


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """What :func:`build` makes: the optax transformation ``tx``, its per-run numbers in its state
  (:data:`PER_RUN_KEYS`: runs stacked for one program each carry their own); its ``schedule``,
  the learning rate at each step at the config's peak (the training log's); the ``settings`` in
  effect (:func:`resolve`'s; ``summary.json`` records them); and ``uninjected``, the same
  transformation with the peak compiled in, as runs before 2026-11-28 held their optimiser state:
  only to read their checkpoints (:mod:`capsjax.runs.checkpoint_forms`)."""
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  settings: dict
  uninjected: optax.GradientTransformation = dataclasses.field(
      default=None, compare=False, repr=False)

  def per_run_numbers(self) -> dict[str, float]:
    """``{hyperparameter: value}`` of :data:`PER_RUN_KEYS` in this config."""
    return {name: self.settings[key.split(".", 1)[1]] for name, key in PER_RUN_KEYS.items()}

  def with_config_numbers(self, opt_state):
    """``opt_state`` (of :attr:`tx`) with the config's per-run numbers: a resumed run may
    change its learning rate (:mod:`capsjax.config.history` records it)."""
    numbers = {k: jnp.asarray(v, opt_state.hyperparams[k].dtype)
               for k, v in self.per_run_numbers().items()}
    return opt_state._replace(hyperparams={**opt_state.hyperparams, **numbers})


# The optimiser's numbers the runs of one program may differ in (the module docstring), by config
# key; not the schedule's shape (decay, warmup, floor): it is the program's.
PER_RUN_KEYS = {"learning_rate": "optimizer.learning_rate"}


def build(config: ml_collections.ConfigDict, steps_per_epoch: int | None = None,
          num_steps: int | None = None) -> Optimizer:
  """The optimiser of ``config`` (``config.optimizer``): clipping, L2 decay (not for adamw, which
  decays its own way), then the optimiser on the schedule, its peak learning rate in its state
  (the module docstring). A resolved config's section (frozen) holds every setting in effect;
  any other is resolved first."""
  settings = dict(config) if settings_lib.in_effect(config) else resolve(config)

  def at(learning_rate) -> optax.GradientTransformation:
    # The schedule of this peak; the same arithmetic whether the peak is a number or state.
    schedule = make_schedule({**settings, "learning_rate": learning_rate}, steps_per_epoch,
                             num_steps)
    parts = []
    if settings["clip_norm"] > 0:
      parts.append(optax.clip_by_global_norm(settings["clip_norm"]))
    if settings["weight_decay"] > 0 and settings["name"] != "adamw":
      parts.append(optax.add_decayed_weights(settings["weight_decay"]))
    tx = _transform(settings, schedule)
    return optax.chain(*parts, tx) if parts else tx

  tx = optax.inject_hyperparams(at)(learning_rate=settings["learning_rate"])
  return Optimizer(tx, make_schedule(settings, steps_per_epoch, num_steps), settings,
                   uninjected=at(settings["learning_rate"]))
