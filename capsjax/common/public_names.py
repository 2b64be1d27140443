"""The names README and docs tell users to import, and the names that moved.

:data:`PUBLIC` lists, per module, what a researcher's code may import: the extension points
(datasets, models, routers, evaluators), their building blocks and the config helpers.
``tests/test_public_names.py`` checks that each resolves and that README.md, docs/ and examples/
name no other ``capsjax`` attribute. Renaming or moving one of these is a change for users: the old
name keeps a deprecated alias for a release (:data:`MOVED`) and CHANGELOG.md says so.

:data:`MOVED` maps ``(old module, old name)`` to ``"new.module:Name"``. The old module's
``__getattr__`` (:func:`module_getattr`) returns the object at its new place with a
DeprecationWarning naming it, so a model written to an older README still runs.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Callable

PUBLIC: dict[str, tuple[str, ...]] = {
    "capsjax.datasets": ("Builder", "DatasetInfo", "Split", "DATASETS", "get", "names",
                         "to_float"),
    "capsjax.datasets.sources": ("load", "read_idx"),
    "capsjax.models": ("CAPABILITIES", "MODELS", "Outputs", "SCORE_KINDS", "SHAPE_SETTINGS",
                       "count_params", "create", "get"),
    "capsjax.training.tasks": ("Forward", "Task", "forward"),
    "capsjax.models.layers": ("Conv2D", "Decoder", "conv2d", "depthwise_conv2d",
                              "kernel_init", "same_padding"),
    "capsjax.models.capsule_layers": ("Capsules", "ClassCapsules", "MatrixPrimaryCapsules",
                                      "PrimaryCapsules", "RoutingNorms", "vector_capsules",
                                      "vector_vote_weights", "matrix_vote_weights"),
    "capsjax.models.conv_capsules": ("ConvCapsules",),
    "capsjax.models.capsnet": ("CapsuleModel", "capsule_loss"),
    "capsjax.models.head_settings": ("LossSettings",),
    "capsjax.models.losses": ("margin_loss", "margin_loss_per_example", "reconstruction_loss",
                              "spread_loss_per_example"),
    "capsjax.routing": ("ConvLayer", "DEFAULT", "ROUTERS", "Router", "RoutingResult",
                        "capsule_votes", "chosen", "chosen_router", "coupled_parents",
                        "coupling_statistics", "fill", "get", "resolve", "safe_norm", "squash"),
    "capsjax.routing.core": ("coupled_parents",),
    "capsjax.evaluators": ("EVALUATORS", "Evaluator", "SkipEvaluation", "types"),
    "capsjax.common.errors": ("UsageError",),
    "capsjax.common.config_args": ("parse_arg",),
    "capsjax.config.settings": ("Setting", "REQUIRED", "Rule", "POSITIVE", "NON_NEGATIVE",
                                "at_least", "above", "between", "one_of", "each", "usually"),
    "capsjax.config.per_run": ("declare", "config_keys", "of_config", "stacked"),
    "capsjax.common.platform": ("building_for", "target"),  # Exporting a GPU's or TPU's program.
    "capsjax.config.runconfig": ("import_config_file", "load"),
    "capsjax.training.vectorize": ("default_min_runs",),
    "capsjax.config.schema": ("resolve_config",),
    "capsjax.training.evaluation": ("BatchedEval",),   # What Evaluator.batched is.
}

# (old module, old name) -> "new.module:Name", kept for a release after the move.
MOVED: dict[tuple[str, str], str] = {
    # Renamed in 0.2.0 so that "run" names a run: what maps functions over evaluation sets.
    ("capsjax.training.evaluation", "EvalRunner"): "capsjax.training.evaluation:BatchedEval",
    # Moved in 0.2.0 into capsjax.config, the package below everything that reads a config.
    ("capsjax.common.settings", "Setting"): "capsjax.config.settings:Setting",
    ("capsjax.common.settings", "REQUIRED"): "capsjax.config.settings:REQUIRED",
    ("capsjax.common.settings", "Rule"): "capsjax.config.settings:Rule",
    ("capsjax.common.settings", "POSITIVE"): "capsjax.config.settings:POSITIVE",
    ("capsjax.common.settings", "NON_NEGATIVE"): "capsjax.config.settings:NON_NEGATIVE",
    ("capsjax.common.settings", "at_least"): "capsjax.config.settings:at_least",
    ("capsjax.common.settings", "above"): "capsjax.config.settings:above",
    ("capsjax.common.settings", "between"): "capsjax.config.settings:between",
    ("capsjax.common.settings", "one_of"): "capsjax.config.settings:one_of",
    ("capsjax.common.settings", "each"): "capsjax.config.settings:each",
    ("capsjax.common.settings", "usually"): "capsjax.config.settings:usually",
    ("capsjax.runs.runconfig", "import_config_file"): "capsjax.config.runconfig:import_config_file",
    ("capsjax.runs.runconfig", "load"): "capsjax.config.runconfig:load",
    ("capsjax.training.schema", "resolve_config"): "capsjax.config.schema:resolve_config",
    ("capsjax.models.capsule_model", "CapsuleModel"): "capsjax.models.capsnet:CapsuleModel",
    # Moved in 0.2.0: the capsule head beside the paper's model, its settings in their module.
    # Moved in 0.2.0 beside the task that completes the batch it takes.
    ("capsjax.models", "Forward"): "capsjax.training.tasks:Forward",
    ("capsjax.models", "forward"): "capsjax.training.tasks:forward",
    ("capsjax.models.capsule_head", "CapsuleModel"): "capsjax.models.capsnet:CapsuleModel",
    ("capsjax.models.capsule_head", "LossSettings"): "capsjax.models.head_settings:LossSettings",
    ("capsjax.common.per_run", "declare"): "capsjax.config.per_run:declare",
    ("capsjax.common.per_run", "config_keys"): "capsjax.config.per_run:config_keys",
    ("capsjax.common.per_run", "of_config"): "capsjax.config.per_run:of_config",
    ("capsjax.common.per_run", "stacked"): "capsjax.config.per_run:stacked",
    # Moved in 0.2.0: the table of every router's settings is the schema's, which resolves by it.
    ("capsjax.routing", "all_settings"): "capsjax.config.schema:router_settings",
}


# (old module, old name) -> ("new.module:Name", the release that removed it): names whose
# deprecated alias has expired. Importing one raises :class:`RemovedName`, naming the new place
# (as NumPy's expired aliases do), not a bare "cannot import name".
REMOVED: dict[tuple[str, str], tuple[str, str]] = {
    **{("capsjax.models.layers", name): (f"capsjax.models.capsule_layers:{name}", "0.2.0")
       for name in ("Capsules", "PrimaryCapsules", "ClassCapsules", "vector_capsules",
                    "vector_vote_weights", "matrix_vote_weights")},
    ("capsjax.training.evaluation", "Runner"): ("capsjax.training.evaluation:BatchedEval",
                                                "0.2.0"),
}


class RemovedName(ImportError):
  """A name whose deprecated alias has expired (:data:`REMOVED`). An ImportError, so that
  ``from module import Name`` shows this message rather than Python's own."""


def resolve(target: str):
  """The object ``"module:Name"`` names."""
  module, name = target.split(":")
  return getattr(importlib.import_module(module), name)


def module_getattr(module: str) -> Callable[[str], object]:
  """A module-level ``__getattr__`` for ``module`` that serves its moved names (with a
  DeprecationWarning naming the new place), refuses its removed ones naming the new place
  (:class:`RemovedName`) and raises AttributeError for any other."""

  def __getattr__(name: str):
    if (module, name) in REMOVED:
      target, release = REMOVED[(module, name)]
      new_module, new_name = target.split(":")
      raise RemovedName(f"{module}.{name} was removed in {release}: import {new_name} from "
                        f"{new_module} (CHANGELOG.md).", name=name, path=None)
    target = MOVED.get((module, name))
    if target is None:
      raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new_module, new_name = target.split(":")
    warnings.warn(f"{module}.{name} moved to {new_module}.{new_name}; the old name will be "
                  "removed in a later release (CHANGELOG.md).", DeprecationWarning, stacklevel=2)
    return resolve(target)

  return __getattr__
