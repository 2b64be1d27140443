"""The config schema, JAX-free: every built-in router's and optimiser's settings with their
defaults (the paper's or the authors' code's value), the keys a config file declares for them,
and the loss settings of matrix capsules.

The routers (``capsjax/routing/*.py``: ``SETTINGS = ROUTER_SETTINGS[name]``) and the optimisers
(``capsjax/training/optimizers.py``) read their settings from here, so that a new setting is
one edit. ``config.model.routing`` and ``config.optimizer`` hold ``name`` and every key any
router (or optimiser and schedule) has, unset (typed placeholders) so that the chosen one's
defaults apply and the command line can set any of them (``--config.model.routing.iterations=1``).
A config file imports only ``capsjax.common`` (a config is read by tools that never train,
and loads fast). A researcher's router named by import path declares its own settings; a
config adds their keys (examples/config.py).
"""

from __future__ import annotations

from typing import Any

import ml_collections
from ml_collections import config_dict

# Each built-in router's settings and their defaults (``config.model.routing.name`` -> ...).
ROUTER_SETTINGS: dict[str, dict[str, Any]] = {
    "dynamic": {
        "iterations": 3,            # r (paper: 3 for MNIST).
        "softmax_axis": "output",   # Over parents j (paper); "input": over children i.
        "stop_gradient": False,     # Paper: gradients flow through every iteration.
        "leaky": False,             # The official code's extra zero logit; paper: none.
        "squash_epsilon": 0.0,      # Eq. 1 exactly.
    },
    "uniform": {
        "squash_epsilon": 0.0,      # Eq. 1 exactly; see capsjax.routing.squash.
    },
    "random": {
        "logit_scale": 1.0,     # Std of the Gaussian logits (0: uniform coupling).
        "eval_seed": 0,         # The fixed key of the evaluation coupling.
        "squash_epsilon": 0.0,  # Eq. 1 exactly.
    },
    "self_attention": {},
    "inverted_dot_product": {
        "iterations": 2,            # Passes, the uniform first included: reference num_routing=1.
        "agreement_scale": "code",  # "code": a_ij / sqrt(out_dim); "paper": unscaled (Eq. 2).
        "layer_norm_epsilon": 1e-5,  # torch's nn.LayerNorm default.
    },
    "self_routing": {},
    "em": {
        "iterations": 3,                  # The code's routing_iteration.
        "stop_gradient": False,           # The authors: "We do not use stop gradient".
        "inverse_temperature": 0.0025,    # lambda: the code's final_beta 0.01, / 4 (class layer).
        "temperature_growth": 0.95,       # lambda_t = lambda (1 - growth^(t+1)).
        "mean_damping": 0.1,              # mu = 0.9 new + 0.1 previous (code).
        "min_variance": 0.0005,           # The code's min_var.
        "mass_epsilon": 1e-5,             # Added to sum_i R_ij a_i (class layer: 1e-5).
        "activation_bias_scale": 5000.0,  # logit = lambda (cost - 5000 beta_a) (code).
        "beta_u_init": 2.0,               # The class layer's sigma_biases.
        "beta_a_init": 1.0,               # The class layer's activation_biases.
        "gradient": "auto",               # "analytic" | "autodiff" (module docstring).
    },
    "variational_bayes": {
        "iterations": 3,             # The code's routing_iter (its default).
        "stop_gradient": False,      # The code has none.
        "assignments": "code",       # HEAD's; "first_commits" | "textbook" (module docstring).
        "normaliser_floor": 1e-11,   # The code's clamp of sum_j p_ij (HEAD; 9908079: 1e-8).
        "conv_normalisation": "child",  # Over every parent of a child (HEAD) | "patch" (first).
        "prior_alpha": 1.0,          # Dirichlet alpha0.
        "prior_kappa": 1.0,          # Gaussian precision scaling kappa0.
        "prior_nu_offset": 1.0,      # Wishart degrees of freedom nu0 = D + this.
        "prior_psi": 1.0,            # Wishart scale Psi0 = prior_psi x identity.
        "mass_epsilon": 1e-7,        # Added to R_j where the code divides by it (not in the code).
        "beta_u_init": 0.0,
        "beta_a_init": 0.0,
    },
}
DEFAULT_ROUTER = "dynamic"

# Each optimiser's own settings and their defaults (TF's Adam defaults are optax's). Adam's
# eps_hat: eps added to the square root of the uncorrected second moment, as TF1's
# AdamOptimizer (the official CapsNet code's) does: Kingma & Ba's "epsilon hat".
OPTIMIZERS = {
    "adam": {"b1": 0.9, "b2": 0.999, "eps": 1e-8, "eps_hat": False},
    "adamw": {"b1": 0.9, "b2": 0.999, "eps": 1e-8},
    "sgd": {"momentum": 0.9, "nesterov": False},
    "rmsprop": {"decay": 0.9, "eps": 1e-8, "momentum": 0.0, "centered": False},
}
# Each schedule's own settings and their defaults; exponential's are the paper's (0.96 every
# 2000 steps), its end_value a floor (the official code's tf.maximum(lr, 1e-6); 0: none). A
# step count and its epochs twin are alternatives.
SCHEDULES = {
    "exponential": {"decay_rate": 0.96, "decay_steps": 2000, "decay_epochs": None,
                    "staircase": False, "end_value": 0.0},
    "cosine": {"decay_steps": None, "decay_epochs": None, "alpha": 0.0},
    "constant": {},
    "piecewise": {"boundaries": None, "boundary_epochs": None, "scales": None},
}
# Keys a config may leave out, with the value that leaving them out means (a config file of a
# dataset or model without the setting, or one written before the key existed). Code reads them
# with :func:`optional`, never with an inline default; a config.json of an earlier version is
# completed by ``capsjax.runs.migrations`` from the same values.
OPTIONAL_KEYS: dict[str, Any] = {
    "data.test_limit": 0,                  # 0: the whole test set.
    "data.validation_size": 0,             # No validation split.
    "data.validation_split": "random",     # Drawn with the seed; "first": the code's.
    "data.order": "permutation",           # "stream": the code's (datasets/stream_order.py).
    "data.stream_window": 5384,            # "stream"'s shuffle window: the code's queue.
    "data.rotation_degrees": 0.0,          # Rotations the model trained with (affNIST-like).
    "data.viewpoint_split": "",            # smallNORB: every viewpoint.
    "eval.figures": True,
    "eval.num_figure_examples": 8,
    "train.steps_per_dispatch": 1,
    "model.padding": "VALID",              # CapsNet's convolutions (CIFAR-10's code: SAME).
    "model.primary.output_scale": 1.0,     # The official code's PrimaryCaps: 1/32.
    "model.decoder.init_scale": 0.0,       # 0: LeCun normal; the official code's: 0.1.
    "model.decoder.bias_init": 0.0,
    "model.class_capsules.scores": "auto",
    "matmul_precision": "default",         # JAX's default (TF32 on recent GPUs): precision.py.
}


def optional(section: ml_collections.ConfigDict, key: str) -> Any:
  """The value of ``key`` (a dotted path from the config's root, a key of
  :data:`OPTIONAL_KEYS`) in ``section``, the config node that holds its last part, or the
  value leaving it out (or setting it to None) means.
  ``optional(config.data, "data.test_limit")``."""
  if key not in OPTIONAL_KEYS:
    raise KeyError(f"{key!r} is not in config_keys.OPTIONAL_KEYS: declare it there with the "
                   "value that leaving it out means.")
  value = section.get(key.rsplit(".", 1)[-1])
  return OPTIONAL_KEYS[key] if value is None else value


# The types of the settings whose default is None (the others' types are their defaults').
NONE_DEFAULT_TYPES = {"decay_epochs": float, "boundaries": tuple, "boundary_epochs": tuple,
                      "scales": tuple}


def _unset_keys(tables) -> dict[str, Any]:
  """Every key of ``tables`` (dicts of defaults) as a placeholder of its default's type."""
  keys: dict[str, Any] = {}
  for table in tables:
    for key, default in table.items():
      kind = type(default) if default is not None else NONE_DEFAULT_TYPES.get(key, float)
      keys.setdefault(key, config_dict.placeholder(kind))
  return keys


def routing() -> dict[str, Any]:
  """``config.model.routing`` of a config file: ``name`` (dynamic routing, the paper's) and
  every router's settings, unset."""
  return {"name": DEFAULT_ROUTER, **_unset_keys(ROUTER_SETTINGS.values())}


def optimizer() -> dict[str, Any]:
  """``config.optimizer`` of a config file: the paper's Adam at 1e-3 decayed exponentially,
  no warmup, weight decay or clipping; every other optimiser's and schedule's settings
  unset."""
  return {"name": "adam", "learning_rate": 1e-3, "schedule": "exponential", "warmup_steps": 0,
          "warmup_epochs": config_dict.placeholder(float),
          "weight_decay": config_dict.placeholder(float), "clip_norm": 0.0,
          "official_code": False,
          **_unset_keys([*OPTIMIZERS.values(), *SCHEDULES.values()])}


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
