"""What a config file declares, without importing JAX: the keys of the sections whose settings
belong to a component chosen by name, and the loss settings of matrix capsules.

``config.model.routing`` and ``config.optimizer`` hold ``name`` and every key any router (or
optimiser and schedule) has, unset (typed placeholders) so that the chosen one's defaults
apply and the command line can set any of them (``--config.model.routing.iterations=1``).
The components themselves (:func:`capsjax.routing.config_keys`,
:func:`capsjax.training.optimizers.config_keys`) import JAX; these tables let a config file
import only ``capsjax.common`` (a config is read by tools that never train, and loads fast).
A test checks that each table equals what the components declare, so a new router setting
that is missing here fails by name.
"""

from __future__ import annotations

from typing import Any

import ml_collections
from ml_collections import config_dict

# Every router's settings and their types (capsjax/routing/*.py, each module's SETTINGS).
ROUTING = {
    "iterations": int, "softmax_axis": str, "stop_gradient": bool, "leaky": bool,
    "squash_epsilon": float,                                            # dynamic, ...
    "inverse_temperature": float, "temperature_growth": float, "mean_damping": float,
    "min_variance": float, "mass_epsilon": float, "activation_bias_scale": float,
    "beta_u_init": float, "beta_a_init": float,                         # em, VB
    "gradient": str,                                                    # dynamic, em
    "agreement_scale": str, "layer_norm_epsilon": float,                # self_attention, IDPA
    "logit_scale": float, "eval_seed": int,                             # random
    "assignments": str, "normaliser_floor": float, "conv_normalisation": str,
    "prior_alpha": float, "prior_kappa": float, "prior_nu_offset": float,
    "prior_psi": float,                                                 # variational_bayes
}
DEFAULT_ROUTER = "dynamic"

# Every optimiser's and schedule's own settings and their types
# (capsjax/training/optimizers.py, OPTIMIZERS and SCHEDULES).
OPTIMIZER = {
    "b1": float, "b2": float, "eps": float, "eps_hat": bool, "momentum": float,
    "nesterov": bool,
    "decay": float, "centered": bool,                                   # optimisers
    "decay_rate": float, "decay_steps": int, "decay_epochs": float, "staircase": bool,
    "end_value": float,
    "alpha": float, "boundaries": tuple, "boundary_epochs": tuple, "scales": tuple,
}


def routing() -> dict[str, Any]:
  """``config.model.routing`` of a config file: ``name`` (dynamic routing, the paper's) and
  every router's settings, unset."""
  return {"name": DEFAULT_ROUTER,
          **{key: config_dict.placeholder(kind) for key, kind in ROUTING.items()}}


def optimizer() -> dict[str, Any]:
  """``config.optimizer`` of a config file: the paper's Adam at 1e-3 decayed exponentially,
  no warmup, weight decay or clipping; every other optimiser's and schedule's settings
  unset."""
  return {"name": "adam", "learning_rate": 1e-3, "schedule": "exponential", "warmup_steps": 0,
          "warmup_epochs": config_dict.placeholder(float),
          "weight_decay": config_dict.placeholder(float), "clip_norm": 0.0,
          **{key: config_dict.placeholder(kind) for key, kind in OPTIMIZER.items()}}


def em_loss() -> ml_collections.ConfigDict:
  """``config.loss`` of matrix capsules (``em_capsnet``): the code's margin schedule, mean over
  classes, 2e-7 (checked by :func:`capsjax.models.em_capsnet.check_loss`)."""
  return ml_collections.ConfigDict(dict(
      kind="spread",            # Or "cross_entropy": softmax over the activations (VB code).
      margin_schedule="code",   # Or "linear" (the paper's text).
      margin_steps=400_000,     # For "linear": steps from 0.2 to 0.9.
      reduction="mean",         # The code's mean over classes; "sum": Eq. 3.
      weight_decay=2e-7,        # x l2_loss of the weights (code's utils.weight_variable).
  ))
