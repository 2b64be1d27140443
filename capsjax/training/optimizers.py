"""The optimiser and its learning-rate schedule, from ``config.optimizer``, through optax.

Built once per run (:func:`build`) and used by the train step, the learning-rate log and the
restore. ``config.optimizer``:

Every setting is declared here, beside the code that reads it: :data:`COMMON` (every
optimiser's), :data:`OPTIMIZERS` (each optimiser's own) and :data:`SCHEDULES` (each schedule's
own), each with its default, meaning and range. ``name`` picks the optimiser (``adam``, the
paper's), ``schedule`` the schedule (``exponential``, the paper's 0.96 every 2000 steps); the
peak ``learning_rate`` is held in the optimiser state (``optax.inject_hyperparams``) so that
the runs of one vectorised program may differ in it (:data:`PER_RUN_KEYS`). A setting of
another optimiser or schedule is refused, naming it, so ``--config.optimizer.name=sgd`` alone
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

from capsjax.common import settings as settings_lib
from capsjax.common.errors import UsageError
from capsjax.common.settings import NON_NEGATIVE, POSITIVE, Setting, between, each, one_of

_STEPS = int | None
_EPOCHS = float | None

# Every optimiser's settings (``config.optimizer.*``): the paper's Adam at 1e-3, decayed
# exponentially, no warmup or clipping.
COMMON = {
    "name": Setting("adam", "The optimiser: adam (the paper's) | adamw | sgd | rmsprop."),
    "learning_rate": Setting(1e-3, "The schedule's peak (the paper's 1e-3); each run's, in "
                             "its optimiser state.", check=POSITIVE),
    "schedule": Setting("exponential", "exponential (the paper's) | cosine | constant | "
                        "piecewise."),
    "warmup_steps": Setting(0, "A linear warmup from 0 over this many steps first (0: none).",
                            check=NON_NEGATIVE),
    "warmup_epochs": Setting(None, "The warmup in epochs (instead of warmup_steps).",
                             kind=_EPOCHS, check=NON_NEGATIVE),
    "clip_norm": Setting(0.0, "Clip the gradients to this global norm first (0: none).",
                         check=NON_NEGATIVE),
    "official_code": Setting(False, "The authors' code's Adam and floor where left unset: "
                             "Adam's eps_hat True, the exponential schedule's end_value 1e-6."),
}
_L2 = Setting(0.0, "weight_decay x params added to the gradient (L2; 0: none).",
              check=NON_NEGATIVE)
_ADAM = {"b1": Setting(0.9, "Adam's beta1 (TF's and optax's).", check=between(0, 1)),
         "b2": Setting(0.999, "Adam's beta2.", check=between(0, 1, open_low=True)),
         "eps": Setting(1e-8, "Adam's epsilon.", check=POSITIVE)}
# Each optimiser's own settings.
OPTIMIZERS = {
    "adam": {**_ADAM,
             "eps_hat": Setting(None, "eps added to the root of the uncorrected second moment, "
                                "as TF1's AdamOptimizer (the official code's; Kingma & Ba's "
                                "epsilon hat); unset: optimizer.official_code.",
                                kind=bool | None),
             "weight_decay": _L2},
    "adamw": {**_ADAM, "weight_decay": Setting(1e-4, "AdamW's decoupled weight decay "
                                               "(optax's default).", check=NON_NEGATIVE)},
    "sgd": {"momentum": Setting(0.9, "Momentum (0: none).", check=NON_NEGATIVE),
            "nesterov": Setting(False, "Nesterov momentum."), "weight_decay": _L2},
    "rmsprop": {"decay": Setting(0.9, "RMSprop's decay.", check=between(0, 1)),
                "eps": Setting(1e-8, "RMSprop's epsilon.", check=POSITIVE),
                "momentum": Setting(0.0, "Momentum (0: none).", check=NON_NEGATIVE),
                "centered": Setting(False, "Centred RMSprop."), "weight_decay": _L2},
}
# Each schedule's own settings; a step count and its epochs twin are alternatives.
SCHEDULES = {
    "exponential": {
        "decay_rate": Setting(0.96, "lr x decay_rate ^ (step / decay_steps) (the paper's "
                              "0.96).", check=POSITIVE),
        "decay_steps": Setting(2000, "The paper's 2000.", kind=_STEPS, check=POSITIVE),
        "decay_epochs": Setting(None, "decay_steps in epochs.", kind=_EPOCHS, check=POSITIVE),
        "staircase": Setting(False, "Decay in whole steps of decay_steps."),
        "end_value": Setting(None, "A floor (0: none); unset: 1e-6 with official_code (the "
                             "code's tf.maximum(lr, 1e-6)), else 0.", kind=float | None,
                             check=NON_NEGATIVE)},
    "cosine": {
        "decay_steps": Setting(None, "Its length (unset: the whole run after the warmup).",
                               kind=_STEPS, check=POSITIVE),
        "decay_epochs": Setting(None, "decay_steps in epochs.", kind=_EPOCHS, check=POSITIVE),
        "alpha": Setting(0.0, "The final rate as a fraction of the peak.", check=NON_NEGATIVE)},
    "constant": {},
    "piecewise": {
        "boundaries": Setting(None, "The steps at which the rate is scaled.",
                              kind=tuple | None, check=each(NON_NEGATIVE)),
        "boundary_epochs": Setting(None, "The boundaries in epochs.", kind=tuple | None,
                                   check=each(NON_NEGATIVE)),
        "scales": Setting(None, "The rate times each, from its boundary on, cumulatively (as "
                          "optax).", kind=tuple | None)},
}
COMMON["name"] = dataclasses.replace(COMMON["name"], check=one_of(*OPTIMIZERS))
COMMON["schedule"] = dataclasses.replace(COMMON["schedule"], check=one_of(*SCHEDULES))
EPOCH_TWINS = {"decay_epochs": "decay_steps", "warmup_epochs": "warmup_steps",
               "boundary_epochs": "boundaries"}


def declared(name: str, schedule: str) -> dict[str, Setting]:
  """The settings of optimiser ``name`` with ``schedule``: :data:`COMMON` and their own."""
  return {**COMMON, **OPTIMIZERS[name], **SCHEDULES[schedule]}


def resolve(config, *, allow_unusual: bool = False) -> dict[str, Any]:
  """The settings in effect: the chosen optimiser's and schedule's defaults filled in.

  Raises UsageError naming the key for an unknown name or schedule, a setting the chosen
  optimiser or schedule does not have (set; another one's unset setting is let be), a step
  count given twice (in steps and in epochs) and values out of range. ``official_code=True``
  (the default of ``configs/mnist.py``) fills Adam's unset ``eps_hat`` and the exponential
  schedule's unset ``end_value`` as the authors' code has them, so that another optimiser or
  schedule named alone still works.
  """
  given = {k: config[k] for k in config}
  head = settings_lib.resolve({k: given.get(k) for k in ("name", "schedule")},
                              {k: COMMON[k] for k in ("name", "schedule")}, "config.optimizer")
  name, schedule = head["name"], head["schedule"]
  table = declared(name, schedule)
  others = {}
  for kind, tables in (("optimiser", OPTIMIZERS), ("schedule", SCHEDULES)):
    for other, own in tables.items():
      for key in own:
        if key not in table:
          others.setdefault(key, []).append(f"{kind} {other!r}")
  settings = settings_lib.resolve(
      given, table, "config.optimizer", owner=f"optimiser {name!r} with schedule {schedule!r}",
      elsewhere={k: ", ".join(v) for k, v in others.items()}, allow_unusual=allow_unusual)
  # Unset, these two are the authors' code's where official_code says so (declared above).
  if name == "adam" and settings["eps_hat"] is None:
    settings["eps_hat"] = settings["official_code"]
  if schedule == "exponential" and settings["end_value"] is None:
    settings["end_value"] = 1e-6 if settings["official_code"] else 0.0
  for epochs, steps in EPOCH_TWINS.items():
    if settings.get(epochs) is None:
      continue
    if given.get(steps) not in (None, 0):
      raise UsageError(f"config.optimizer.{steps} and config.optimizer.{epochs} are both set; "
                       "give the one or the other.")
    settings[steps] = None  # Given in epochs: the step count's default is not in effect.
  _check_values(settings)
  return settings


def _check_values(s: dict) -> None:
  """The rules between settings (each one's range is its declaration's)."""
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
  """What :func:`build` makes: the optax transformation, its schedule and the settings in
  effect (``summary.json`` records them).

  Attributes:
    tx: the transformation, its per-run numbers in its state (:data:`PER_RUN_KEYS`): runs
      stacked for one program each carry their own.
    schedule: the learning rate at each step, at the config's peak (the training log's).
    settings: :func:`resolve`'s.
    uninjected: the same transformation with the peak compiled in, as runs before 2026-11-28
      held their optimiser state: only to read their checkpoints
      (:mod:`capsjax.runs.checkpoint_forms`).
  """
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
