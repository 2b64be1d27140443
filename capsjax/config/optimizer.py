"""``config.optimizer``'s settings and their resolution: which optimiser and schedule, and
each one's own settings (JAX-free; the optimiser itself is built from them by
:func:`capsjax.training.optimizers.build`).

:data:`COMMON` holds every optimiser's settings, :data:`OPTIMIZERS` each optimiser's own and
:data:`SCHEDULES` each schedule's own, each with its default, meaning and range. ``name`` picks
the optimiser (``adam``, the paper's), ``schedule`` the schedule (``exponential``, the paper's
0.96 every 2000 steps). A setting of another optimiser or schedule is refused, naming it, so
``--config.optimizer.name=sgd`` alone switches to SGD with its defaults. Steps may be given in
epochs (``decay_epochs``, ``warmup_epochs``, ``boundary_epochs``), as the later capsule papers
state them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from capsjax.common.errors import UsageError
from capsjax.config import settings as settings_lib
from capsjax.config.settings import NON_NEGATIVE, POSITIVE, Setting, between, each, one_of

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
_L2 = Setting(0.0, "weight_decay x params added to the gradient (L2; 0: none).", check=NON_NEGATIVE)
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
      for key in own.keys() - table.keys():
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
