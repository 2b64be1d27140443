"""Models registered by name: ``config.model.name`` picks one (or names a researcher's own
class by import path, ``"my_models:TinyCapsNet"`` or ``"path/to/file.py:TinyCapsNet"``).

A model is a Flax NNX module that owns its loss and its metrics. The trainer, the evaluators and
the figures call only this interface (:func:`capsjax.training.tasks.forward` composes the first
four), checked when a run starts (:func:`check_class`, :func:`check_forward`):

  ``Model.from_config(config, *, rngs)``
      builds it from the whole run config (``config.model``, and e.g. ``config.loss``); raises
      UsageError, naming the key, for settings that cannot work (no config is written);
  ``model.apply(batch, *, train, rng=None) -> Outputs``
      the forward pass on a batch dict (``images`` floats, ``labels``, and
      ``reconstruction_targets`` for models that reconstruct); ``rng`` drives dropout and other
      training noise; returns :class:`Outputs`;
  ``model.loss(outputs, batch, *, step=None) -> (per_example, {name: per_example})``
      the training objective of each example and its named parts; ``step`` is the training step
      (schedules such as a margin that grows), None at evaluation;
  ``model.metrics(outputs, batch) -> {name: per_example}``
      ``(batch,)`` or ``(batch, k)`` values that evaluators average, at least ``accuracy``.

Optional, declared by the model and checked at the start of a run:

  ``Model.SETTINGS``, ``Model.RULES`` and ``Model.router_sections``
      the config keys it reads (``{"model.conv1.features": Setting(...), "loss.m_plus": ...}``,
      full dotted keys: :mod:`capsjax.config.settings`), the rules between them, and the
      sections that name a router (``("model.routing",)``, each resolved against the chosen
      router's own settings). A run refuses a key of ``config.model`` (and ``config.loss``) the
      model does not declare, fills in the defaults and checks every value before anything is
      compiled; a model without ``SETTINGS`` gets its keys unchecked, as given;
  ``model.capabilities() -> frozenset``
      of :data:`CAPABILITIES`: ``reconstruction`` (``model.decode(class_capsules, class_ids)``
      and ``outputs.reconstructions``), ``routing_diagnostics`` (``outputs.diagnostics`` at
      evaluation), ``saturation`` (a ``saturated_fraction`` metric), ``votes``
      (``model.vote_scores(batch) -> (batch, num_classes)``, the class scores of the class
      layer's votes combined without routing, what the vote attack differentiates:
      :meth:`capsjax.models.capsnet.CapsuleModel.vote_scores`); none if absent;
  ``Model.resolve_config(model_config)``
      fills in what the model derives from its settings in the run's resolved ``config.model``
      (CapsNet: the class capsules' bias where left unset), so that ``config.json`` records it;
  ``model.monitors(config, chance) -> [watch]``
      watches over the per-step train metrics, each with ``update(steps, metrics) -> str | None``
      (a warning to print), e.g. :class:`capsjax.models.saturation_watch.SaturationWatch`;
  ``Model.draw_figures(model, batch, workdir, writer, step)``
      the model's own figures of a test batch after training (``model``: a jitted
      :class:`capsjax.training.run_figures.JittedModel`: ``apply``, ``decode``, ``capabilities``);
  ``Model.per_run_numbers`` (and ``Setting(init_only=True)``)
      what a vectorised sweep's runs may differ in and still share one program
      (:mod:`capsjax.training.vectorize`): the settings declared initialisation-only (read only
      to draw the initial parameters; a model without ``SETTINGS`` may list their keys as
      ``init_only_settings``, ``*`` matching one part), and a dataclass of the numbers its loss
      reads (:mod:`capsjax.config.per_run`): a model that declares one takes ``loss(...,
      numbers=None)``, one run's instance in a vectorised step (None elsewhere: the config's).
      Runs that differ in any undeclared setting train apart.

Variables that are not ``nnx.Param`` (BatchNorm statistics) are the model's state: the train
step keeps what ``apply(train=True)`` writes to them (:mod:`capsjax.training.train_step`), and
evaluation merges them back with the parameters.

To add a model: docs/extending.md (a module ``capsjax/models/NAME.py`` with ``MODEL =
TheClass``, found by :data:`MODELS`, or one named by import path, as ``examples/tiny_capsnet.py``).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from capsjax.common import public_names
from capsjax.common.errors import UsageError
from capsjax.config import registries, schema
from capsjax.config.settings import POSITIVE, Setting
from capsjax.models.outputs import SCORE_KINDS, Outputs

# The data's shape, which every model reads: unset, the dataset's (filled in when a run's config
# is resolved); set, it must be the dataset's.
SHAPE_SETTINGS = {
    "model.image_shape": Setting(None, "(H, W, C); unset: the dataset's.", kind=tuple | None),
    "model.num_classes": Setting(None, "Unset: the dataset's.", kind=int | None, check=POSITIVE),
}

# What a model may declare in ``capabilities()``.
CAPABILITIES = ("reconstruction", "routing_diagnostics", "saturation", "votes")

MODELS = registries.MODELS  # The table: capsjax/config/registries.py


def get(config: ml_collections.ConfigDict) -> type[nnx.Module]:
  """The model class ``config.model.name`` names: the one resolving found
  (:attr:`capsjax.config.schema.ResolvedConfig.choices`), else registered or by import path."""
  if isinstance(config, schema.ResolvedConfig):
    return config.choices.model
  return MODELS.get(config.model.name)


# The keywords each method of the interface is called with.
KEYWORDS = {"apply": ("train", "rng"), "loss": ("step",)}


def check_class(model_class: type, name: str) -> None:
  """UsageError naming the model and what it lacks, for a class without the interface (a
  method missing, or one that does not take the keywords it is called with)."""
  missing = [m for m in ("from_config", "apply", "loss", "metrics")
             if not callable(getattr(model_class, m, None))]
  if missing:
    raise UsageError(f"config.model.name={name!r}: {model_class.__name__} lacks "
                     f"{', '.join(missing)} (the model interface: capsjax/models/__init__.py).")
  for method, keywords in KEYWORDS.items():
    parameters = inspect.signature(getattr(model_class, method)).parameters
    if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
      continue
    if method == "loss" and getattr(model_class, "per_run_numbers", None) is not None:
      keywords = (*keywords, "numbers")  # It declares per-run numbers: it takes them.
    if absent := [k for k in keywords if k not in parameters]:
      raise UsageError(f"config.model.name={name!r}: {model_class.__name__}.{method} takes no "
                       f"{', '.join(k + '=' for k in absent)} keyword (the model interface: "
                       f"{method}(..., {', '.join(k + '=...' for k in keywords)}); "
                       "capsjax/models/__init__.py).")


def capabilities(model: nnx.Module) -> frozenset[str]:
  """What ``model`` declares (none without ``capabilities()``); UsageError for unknown ones."""
  hook = getattr(model, "capabilities", None)
  declared = frozenset(hook()) if hook else frozenset()
  if unknown := declared - set(CAPABILITIES):
    raise UsageError(f"{type(model).__name__}.capabilities() declares {sorted(unknown)}; "
                     f"known: {CAPABILITIES}.")
  if "votes" in declared and not callable(getattr(model, "vote_scores", None)):
    raise UsageError(f"{type(model).__name__}.capabilities() declares 'votes' but the model "
                     "has no vote_scores(batch) method.")
  return declared


def check_forward(result, name: str, declared: frozenset[str], num_classes: int,
                  train: bool, vote_scores=None) -> None:
  """UsageError naming the model and the broken promise, for a traced (shapes)
  :class:`capsjax.training.tasks.Forward` of a batch of 2 that does not keep the contract;
  ``vote_scores``: the traced ``model.vote_scores`` of one that declares ``votes`` (evaluation)."""
  mode = "training" if train else "evaluation"
  problems = []
  out = result.outputs
  if not isinstance(out, Outputs):
    problems.append(f"apply returned {type(out).__name__}, not capsjax.models.Outputs")
  else:
    for field in ("scores", "log_probabilities"):
      if getattr(out, field).shape != (2, num_classes):
        problems.append(f"outputs.{field} has shape {getattr(out, field).shape}, not "
                        f"(batch, num_classes) = (2, {num_classes})")
    if out.predictions.shape[:1] != (2,):
      problems.append(f"outputs.predictions has shape {out.predictions.shape}")
    if not jnp.issubdtype(out.predictions.dtype, jnp.integer):
      problems.append(f"outputs.predictions has dtype {out.predictions.dtype}, not integer "
                      "class ids")
    if out.score_kind not in SCORE_KINDS:
      problems.append(f"outputs.score_kind={out.score_kind!r} is not one of {SCORE_KINDS}")
    if "reconstruction" in declared and out.reconstructions is None:
      problems.append("it declares 'reconstruction' but outputs.reconstructions is None")
    if "routing_diagnostics" in declared and not train and out.diagnostics is None:
      problems.append("it declares 'routing_diagnostics' but outputs.diagnostics is None")
  if getattr(result.loss, "shape", None) != (2,):
    problems.append(f"loss has shape {getattr(result.loss, 'shape', None)}, not (batch,) = (2,)")
  for kind, values in (("loss", result.loss_parts), ("metrics", result.metrics)):
    if not isinstance(values, dict):
      what = "its parts" if kind == "loss" else "metrics"
      problems.append(f"{kind} returned {what} as {type(values).__name__}, not a dict "
                      "{name: per-example values}")
      continue
    problems += [f"{'loss part' if kind == 'loss' else 'metric'} {k!r} has shape "
                 f"{getattr(v, 'shape', None)}, not (batch, ...)"
                 for k, v in values.items() if getattr(v, "shape", (None,))[:1] != (2,)]
  if isinstance(result.metrics, dict) and "accuracy" not in result.metrics:
    problems.append("metrics has no 'accuracy'")
  if vote_scores is not None and vote_scores.shape != (2, num_classes):
    problems.append(f"vote_scores has shape {vote_scores.shape}, not (batch, num_classes) = "
                    f"(2, {num_classes})")
  if "saturation" in declared and train and "saturated_fraction" not in result.metrics:
    problems.append("it declares 'saturation' but reports no 'saturated_fraction' metric")
  if problems:
    raise UsageError(f"config.model.name={name!r} does not keep the model interface "
                     f"(capsjax/models/__init__.py) in {mode}: {'; '.join(problems)}.")


def create(config: ml_collections.ConfigDict, *, rngs: nnx.Rngs) -> nnx.Module:
  """The model of ``config``, with fresh parameters from ``rngs``."""
  return get(config).from_config(config, rngs=rngs)


def count_params(model: nnx.Module) -> int:
  """Number of trainable scalars in ``model``."""
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


__all__ = ["CAPABILITIES", "MODELS", "Outputs", "SCORE_KINDS", "capabilities", "check_class",
           "check_forward", "count_params", "create", "get"]

# Forward and forward moved to capsjax.training.tasks in 0.2.0 (served, deprecated, for a release).
__getattr__ = public_names.module_getattr(__name__)
