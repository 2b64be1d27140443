"""The optimiser and its learning-rate schedule, from ``config.optimizer``, through optax.

Built once per run (:func:`build`) and used by the train step, the learning-rate log and the
restore. ``config.optimizer``:

``name``
    ``adam`` (default; the paper's), ``adamw`` (decoupled weight decay), ``sgd`` (with
    momentum, optionally Nesterov) or ``rmsprop``.
``learning_rate``
    the peak rate of the schedule, held in the optimiser state (``optax.inject_hyperparams``)
    so that the runs of one vectorised program may differ in it (:data:`PER_RUN_KEYS`).
``schedule``
    ``exponential`` (default; the paper's ``lr * decay_rate ** (step / decay_steps)``),
    ``cosine`` (from the peak to ``alpha * lr`` over ``decay_steps``, by default the whole run
    after the warmup), ``constant``, or ``piecewise`` (the rate times each of ``scales`` from
    the matching entry of ``boundaries`` on, cumulatively, as optax).
``warmup_steps`` / ``warmup_epochs``
    a linear warmup from 0 before any schedule (default none).
``weight_decay``
    ``adamw``: its decoupled decay (default optax's 1e-4); the others: ``weight_decay *
    params`` added to the gradient (L2), default 0.
``clip_norm``
    clip the gradients to this global norm first (0: no clipping, the default).

Every other key belongs to one optimiser or schedule and is left unset (None) to take that
one's default (:data:`OPTIMIZERS`, :data:`SCHEDULES`); a key set for an optimiser or schedule
that does not have it is refused, naming it. So ``--config.optimizer.name=sgd`` alone
switches to SGD with its defaults. Steps may be given in epochs (``decay_epochs``,
``warmup_epochs``, ``boundary_epochs``), as the later capsule papers state them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from capsjax.common import config_keys as schema
from capsjax.common.errors import UsageError

# Each optimiser's and schedule's own settings and their defaults: the JAX-free schema's.
OPTIMIZERS, SCHEDULES = schema.OPTIMIZERS, schema.SCHEDULES
COMMON = tuple(schema.OPTIMIZER_COMMON)
# What ``official_code=True`` makes of the chosen optimiser's and schedule's unset settings: the
# authors' code's tf.train.AdamOptimizer and its exponential decay's floor (models/model.py:63-70);
# an optimiser or schedule not named here keeps its own defaults.
OFFICIAL_CODE = {"adam": {"eps_hat": True}, "exponential": {"end_value": 1e-6}}
EPOCH_TWINS = {"decay_epochs": "decay_steps", "warmup_epochs": "warmup_steps",
               "boundary_epochs": "boundaries"}


def config_keys() -> dict[str, Any]:
  """Every key ``config.optimizer`` may hold, unset for those of one optimiser or schedule
  (what a config file writes): :func:`capsjax.common.config_keys.optimizer`."""
  return schema.optimizer()


def resolve(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The settings in effect: the chosen optimiser's and schedule's defaults filled in.

  Raises UsageError naming the key for an unknown name or schedule, a setting the chosen
  optimiser or schedule does not have, a step count given twice (in steps and in epochs) and
  values that cannot work. An unset ``name`` is Adam and an unset ``schedule`` the
  exponential one (old runs' config.json files: :mod:`capsjax.runs.migrations`). ``official_code=True`` (the default of ``configs/mnist.py``)
  fills the unset settings that :data:`OFFICIAL_CODE` names as the authors' code has them
  (Adam's epsilon hat, the exponential decay's floor of 1e-6), so that another optimiser or
  schedule named alone still works.
  """
  given = {k: config[k] for k in config}
  # The common settings, each unset one its declared default (config_keys.OPTIMIZER_COMMON).
  common = {k: default if given.get(k) is None else given[k]
            for k, default in schema.OPTIMIZER_COMMON.items()}
  name, schedule = common["name"], common["schedule"]
  if name not in OPTIMIZERS:
    raise UsageError(f"config.optimizer.name={name!r} is not an optimiser here; use one of "
                     f"{tuple(OPTIMIZERS)}.")
  if schedule not in SCHEDULES:
    raise UsageError(f"config.optimizer.schedule={schedule!r} is not a schedule here; use one "
                     f"of {tuple(SCHEDULES)}.")
  own = {**OPTIMIZERS[name], **SCHEDULES[schedule]}
  known = set(COMMON) | {k for t in (*OPTIMIZERS.values(), *SCHEDULES.values()) for k in t}
  for key, value in given.items():
    if key not in known:
      raise UsageError(f"config.optimizer.{key} is not an optimiser setting; the settings are "
                       f"{sorted(known)}.")
    if value is not None and key not in COMMON and key not in own:
      raise UsageError(
          f"config.optimizer.{key}={value!r} is not a setting of optimiser {name!r} with "
          f"schedule {schedule!r}; theirs are {sorted(own) or 'none'}. Leave it unset.")
  settings = {**common, "learning_rate": float(common["learning_rate"]),
              "warmup_steps": int(common["warmup_steps"]),
              "clip_norm": float(common["clip_norm"]),
              "official_code": bool(common["official_code"])}
  if settings["weight_decay"] is None:
    settings["weight_decay"] = schema.DEFAULT_WEIGHT_DECAY.get(name, 0.0)
  if settings["official_code"]:
    own = {**own, **OFFICIAL_CODE.get(name, {}), **OFFICIAL_CODE.get(schedule, {})}
  for key, default in own.items():
    settings[key] = given[key] if given.get(key) is not None else default
  for epochs, steps in EPOCH_TWINS.items():
    if settings.get(epochs) is not None and given.get(steps) not in (None, 0):
      raise UsageError(f"config.optimizer.{steps} and config.optimizer.{epochs} are both set; "
                       "give the one or the other.")
  _check_values(settings)
  return settings


def _check_values(s: dict) -> None:
  positive = [("learning_rate", s["learning_rate"])] + [
      (k, s[k]) for k in ("decay_steps", "decay_epochs", "b2", "eps") if s.get(k) is not None]
  for key, value in positive:
    if not value > 0:
      raise UsageError(f"config.optimizer.{key} must be > 0, got {value!r}.")
  for key in ("warmup_steps", "weight_decay", "clip_norm", "warmup_epochs", "momentum", "alpha",
              "end_value"):
    if s.get(key) is not None and s[key] < 0:
      raise UsageError(f"config.optimizer.{key} must be >= 0, got {s[key]!r}.")
  if s["schedule"] == "piecewise":
    bounds = s["boundaries"] if s["boundaries"] is not None else s["boundary_epochs"]
    if bounds is None or s["scales"] is None or len(tuple(bounds)) != len(tuple(s["scales"])):
      raise UsageError("The piecewise schedule needs config.optimizer.boundaries (steps) or "
                       "boundary_epochs, and as many config.optimizer.scales, e.g. "
                       "boundaries=(10000, 20000) scales=(0.1, 0.1).")


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
                                       end_value=settings.get("end_value") or None)
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
  """What :func:`build` makes: the optax transformation, its schedule and the settings in
  effect (``summary.json`` records them).

  Attributes:
    tx: the transformation, its per-run numbers in its state (:data:`PER_RUN_KEYS`): runs
      stacked for one program each carry their own.
    schedule: the learning rate at each step, at the config's peak (the training log's).
    settings: :func:`resolve`'s.
    uninjected: the same transformation with the peak compiled in, as runs before 2026-11-28
      held their optimiser state: only to read their checkpoints (:meth:`with_injected`).
  """
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  settings: dict
  uninjected: optax.GradientTransformation = dataclasses.field(
      default=None, compare=False, repr=False)

  def per_run_numbers(self) -> dict[str, float]:
    """``{hyperparameter: value}`` of :data:`PER_RUN_KEYS` in this config."""
    return {name: self.settings[key.split(".", 1)[1]] for name, key in PER_RUN_KEYS.items()}

  def with_injected(self, opt_state):
    """An optimiser state of :attr:`uninjected`'s form (a checkpoint written before the peak
    was state) in :attr:`tx`'s form, its peak the config's."""
    numbers = {k: jnp.asarray(v, jnp.float32) for k, v in self.per_run_numbers().items()}
    count = jnp.zeros((), jnp.int32)  # Counts nothing we read: the peak is no schedule.
    return optax.InjectStatefulHyperparamsState(count=count, hyperparams=numbers,
                                                hyperparams_states={}, inner_state=opt_state)

  def with_config_numbers(self, opt_state):
    """``opt_state`` (of :attr:`tx`) with the config's per-run numbers: a resumed run may
    change its learning rate (:mod:`capsjax.training.config_history` records it)."""
    numbers = {k: jnp.asarray(v, opt_state.hyperparams[k].dtype)
               for k, v in self.per_run_numbers().items()}
    return opt_state._replace(hyperparams={**opt_state.hyperparams, **numbers})


# The optimiser's numbers that may differ between the runs of one program: hyperparameters of
# its state (``optax.inject_hyperparams``), by the config key each comes from. The schedule's
# shape (decay, warmup, floor) is not among them: it is the program's.
PER_RUN_KEYS = {"learning_rate": "optimizer.learning_rate"}


def build(config: ml_collections.ConfigDict, steps_per_epoch: int | None = None,
          num_steps: int | None = None) -> Optimizer:
  """The optimiser of ``config`` (``config.optimizer``): clipping, L2 decay (not for adamw,
  which decays its own way), then the optimiser on the schedule, its peak learning rate held
  in the optimiser state (``optax.inject_hyperparams``), so that runs of one program may
  differ in it."""
  settings = resolve(config)

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
