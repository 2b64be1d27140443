"""The config schema, JAX-free: every built-in router's and optimiser's settings with their
defaults (the paper's or the authors' code's value), the keys a config file declares for them,
and the loss settings of matrix capsules. The keys that every config of a dataset or model
sets, whose values are the config files', are declared (type and meaning, no default) in
:mod:`capsjax.common.config_file_keys`; :func:`listing` shows both.

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

from typing import Any, NamedTuple

import ml_collections
from ml_collections import config_dict

from capsjax.common import config_file_keys, defaults

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
class Key(NamedTuple):
  """A key a config may leave out: the value leaving it out means, and what it is."""
  default: Any
  meaning: str


# Keys a config may leave out, with the value that leaving them out means (a config file of a
# dataset or model without the setting, or one written before the key existed) and what the
# key does. Code reads them with :func:`optional`, never with an inline default; a config.json
# of an earlier version is completed by ``capsjax.runs.migrations`` from the same values.
# ``python -m capsjax.common.config_keys`` lists them with every registry's settings.
DECLARED: dict[str, Key] = {
    "dataset": Key(defaults.DATASET, "The registered dataset builder (capsjax.datasets)."),
    "model.name": Key(defaults.MODEL, "The registered model (capsjax.models)."),
    "seed": Key(0, "The run's seed: initialisation, data order, augmentation."),
    "data.test_limit": Key(0, "Evaluate a fixed random sample of N examples (0: all)."),
    "data.validation_size": Key(0, "Examples held out of train for validation (0: none)."),
    "data.validation_split": Key("random", "Drawn with the seed; \"first\": the code's."),
    "data.order": Key("permutation", "\"stream\": the code's order (datasets/stream_order.py)."),
    "data.stream_window": Key(5384, "\"stream\"'s shuffle window: the code's queue."),
    "data.pad": Key(0, "Digits centred on a canvas this many px larger per side."),
    "data.resize": Key(0, "Image datasets: resize to this many px square first (0: stored)."),
    "data.rotation_degrees": Key(0.0, "Random rotations up to this angle in training."),
    "data.rotation_probability": Key(0.5, "The share of images rotated (reference: 1/2)."),
    "data.rotation_distribution": Key("normal", "The reference's; \"uniform\": any angle."),
    "data.margin_shift": Key(False, "Shifts within each digit's own empty margins."),
    "data.squeeze": Key(False, "Width shrunk by 1..7 px (Lanczos-3)."),
    "data.erase_size": Key(0, "One square patch of this side set to zero (0: none)."),
    "data.viewpoint_split": Key("", "smallNORB: train and test on these viewpoints (\"\": all)."),
    "eval.figures": Key(True, "Draw the run's figures after training."),
    "eval.num_figure_examples": Key(8, "Examples in each figure of examples."),
    "train.steps_per_dispatch": Key(1, ">1: lax.scan over this many steps per call."),
    "train.saturation_warning.fraction": Key(
        0.9, "Warn when this share of the class capsules is longer than 0.95 ..."),
    "train.saturation_warning.steps": Key(
        100, "... for this many consecutive steps (0: never)."),
    "model.padding": Key("VALID", "CapsNet's convolutions (CIFAR-10's code: SAME)."),
    "model.primary.output_scale": Key(1.0, "The official code's PrimaryCaps: 1/32."),
    "model.decoder.init_scale": Key(0.0, "0: LeCun normal; the official code's: 0.1."),
    "model.decoder.bias_init": Key(0.0, "The decoder's biases' initial value."),
    "model.routing.squash_epsilon": Key(
        0.0, "Eq. 1's epsilon of the routers that squash, and the primary capsules'."),
    "model.class_capsules.scores": Key(
        "auto", "Class scores: the router's own; or \"lengths\", \"activations\"."),
    "loss.m_plus": Key(0.9, "Eq. 4's m+."),
    "loss.m_minus": Key(0.1, "Eq. 4's m-."),
    "loss.lam": Key(0.5, "Eq. 4's lambda, the absent classes' weight."),
    "loss.reconstruction_weight": Key(0.0005, "Times the SUM of squared pixel errors."),
    "loss.margin_weight": Key(1.0, "Times Eq. 4 summed over the classes (code: 0.05)."),
    "matmul_precision": Key("default", "JAX's default (TF32 on recent GPUs): precision.py."),
}
OPTIONAL_KEYS: dict[str, Any] = {key: declared.default for key, declared in DECLARED.items()}


def optional(section, key: str) -> Any:
  """The value of ``key`` (a dotted path from the config's root, a key of
  :data:`OPTIONAL_KEYS`) in ``section``, the config node (or dict, or None: absent) that holds
  its last part, or the value leaving it out (or setting it to None) means.
  ``optional(config.data, "data.test_limit")``."""
  if key not in OPTIONAL_KEYS:
    raise KeyError(f"{key!r} is not in config_keys.OPTIONAL_KEYS: declare it there with the "
                   "value that leaving it out means.")
  value = None if section is None else section.get(key.rsplit(".", 1)[-1])
  return OPTIONAL_KEYS[key] if value is None else value


def defaults_of(prefix: str) -> ml_collections.ConfigDict:
  """The declared keys under ``prefix`` (e.g. ``"loss"``) with their defaults, as the config
  node a config file starts from (``configs/mnist.py``'s ``config.loss``)."""
  node = ml_collections.ConfigDict()
  for key, default in OPTIONAL_KEYS.items():
    if key.startswith(prefix + "."):
      *parents, leaf = key[len(prefix) + 1:].split(".")
      at = node
      for parent in parents:
        if parent not in at:
          at[parent] = ml_collections.ConfigDict()
        at = at[parent]
      at[leaf] = default
  return node


# The settings every optimiser takes (``config.optimizer.*``), with their defaults: the paper's
# Adam at 1e-3, decayed exponentially, no warmup, weight decay or clipping. ``weight_decay``
# unset is :data:`DEFAULT_WEIGHT_DECAY` of the optimiser (0 if it has none).
OPTIMIZER_COMMON = {"name": "adam", "learning_rate": 1e-3, "schedule": "exponential",
                    "warmup_steps": 0, "warmup_epochs": None, "weight_decay": None,
                    "clip_norm": 0.0, "official_code": False}
DEFAULT_WEIGHT_DECAY = {"adamw": 1e-4}   # optax's.

# Each built-in evaluator's settings (``config.evals.NAME.*`` besides ``type``) and their
# defaults; the evaluator classes declare ``SETTINGS = EVALUATOR_SETTINGS[type]``.
# The code's 13 crops of smallNORB's test images: the centre, then 4 diagonal moves of 1, 2, 3 px.
CODE_OFFSETS = ((0, 0),) + tuple((k * dy, k * dx) for k in (1, 2, 3)
                                 for dy, dx in ((1, 1), (1, -1), (-1, 1), (-1, -1)))
_ATTACK = {
    "attacks": ("fgsm", "pgd"),                # capsjax's, or "foolbox:Name".
    "epsilons": (0.0, 0.05, 0.1, 0.2, 0.3),    # L-infinity budgets in the images' units.
    "steps": 10,                               # PGD/BIM iterations.
    "step_size": None,                         # None: pgd 2.5 epsilon / steps, bim eps/steps.
    "random_start": True,                      # PGD's uniform start in the ball.
    "targeted": False,                         # Towards (y + 1) mod K.
    "loss": "cross_entropy",                   # Or "model": the model's own loss.
    "value_range": (0.0, 1.0),                 # The images' valid pixel values.
    "seed": 0,
    "split": "test",
    "limit": 1000,                             # Examples attacked (0: all).
    "foolbox_kwargs": None,                    # {"Name": {...}}: a foolbox attack's arguments.
}
EVALUATOR_SETTINGS: dict[str, dict[str, Any]] = {
    "split": {"split": "test"},
    "shifted": {"split": "test", "max_shift": 2},
    # max_shift None: the run's config.data.shift_pixels.
    "randomly_shifted": {"split": "test", "max_shift": None, "seed": 0},
    "affine_mnist": {"transforms_per_digit": 1, "rotation_degrees": 20.0, "shear": 0.2,
                     "scale_min": 0.8, "scale_max": 1.2, "seed": 0},
    "affnist": {"path": ""},                   # test.mat or its folder; "": skipped.
    "adversarial": _ATTACK,
    # The threshold's percentile of the validation distances, and how many (0: all).
    "reconstruction_detection": {**_ATTACK, "percentile": 95.0, "validation_limit": 0},
    # familiar_degrees None: the run's config.data.rotation_degrees, or 30 if it has none.
    "transforms": {"rotations": tuple(float(d) for d in range(-90, 91, 15)),
                   "scales": tuple(round(0.6 + 0.1 * k, 1) for k in range(9)),
                   "shears": tuple(round(-0.4 + 0.1 * k, 1) for k in range(9)),
                   "translations": tuple(float(t) for t in range(-6, 7, 2)),
                   "familiar_degrees": None, "split": "test", "limit": 1000},
    "crop_average": {"offsets": CODE_OFFSETS, "split": "test", "limit": 0},
}


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
  common = {key: config_dict.placeholder(float) if default is None else default
            for key, default in OPTIMIZER_COMMON.items()}
  return {**common, **_unset_keys([*OPTIMIZERS.values(), *SCHEDULES.values()])}


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


def _value(value: Any) -> str:
  return "unset" if value is None else repr(value)


def _cell(text: str) -> str:
  """``text`` in a Markdown table's cell (its ``|`` escaped)."""
  return text.replace("|", "\\|")


def listing() -> str:
  """Every declared key with its default (and meaning or type), as Markdown: the keys a
  config may leave out, then each registry's settings (``config.optimizer``, its schedules,
  ``config.model.routing`` per router, ``config.evals.NAME`` per evaluator type).
  ``python -m capsjax.common.config_keys`` prints it; docs/config_keys.md is its output."""
  lines = ["# Every config key capsjax reads", "",
           "Generated by `python -m capsjax.common.config_keys` from "
           "`capsjax/common/config_keys.py` and",
           "`config_file_keys.py` (tests/test_config_keys.py checks that this file is its "
           "output, and every config file against it). A key a config may leave out, left out "
           "or set to None, takes its default.", "",
           "## Keys a config may leave out", "", "| key | default | meaning |", "|---|---|---|"]
  lines += [f"| `{key}` | `{_value(k.default)}` | {_cell(k.meaning)} |"
            for key, k in DECLARED.items()]

  def required(title: str, keys: dict) -> None:
    lines.extend(["", title, "", "| key | type | meaning |", "|---|---|---|"])
    lines.extend(f"| `{key}` | {_cell(k.kind)} | {_cell(k.meaning)} |"
                 for key, k in keys.items())

  lines.extend(["", "## Keys every config sets", "",
                "No default: each config file sets them (`configs/mnist.py`'s base config "
                "holds the paper's values; capsjax/common/config_file_keys.py)."])
  required("### Every config", config_file_keys.COMMON)
  for name, keys in config_file_keys.DATASET_KEYS.items():
    required(f"### `config.dataset = \"{name}\"`", keys)
  for name, keys in config_file_keys.MODEL_KEYS.items():
    required(f"### `config.model.name = \"{name}\"`", keys)

  def tables(title: str, prefix: str, groups: dict) -> None:
    lines.extend(["", f"## {title}", ""])
    for group, settings in groups.items():
      shown = ", ".join(f"`{key}` {_value(default)}" for key, default in settings.items())
      lines.append(f"- {prefix}`{group}`: {shown or 'no settings'}")

  tables("`config.optimizer`: every optimiser's settings", "", {"(all)": OPTIMIZER_COMMON})
  tables("`config.optimizer.name`: each optimiser's own", "", OPTIMIZERS)
  tables("`config.optimizer.schedule`: each schedule's own", "", SCHEDULES)
  tables("`config.model.routing.name`: each router's settings", "", ROUTER_SETTINGS)
  tables("`config.evals.NAME.type`: each evaluator's settings", "", EVALUATOR_SETTINGS)
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(listing(), end="")
