"""Evaluations listed in the config, each a small class that yields named metrics.

In the manner of big_vision: ``config.evals`` maps an evaluation's name to its
settings, and ``type`` picks the registered :class:`Evaluator`::

    c.evals.test = dict(type="split", split="test")
    c.evals.affine_mnist = dict(type="affine_mnist", transforms_per_digit=4, seed=0)

Each evaluator builds its examples once (on the host, then on the devices), and
:meth:`Evaluator.run` returns ``{"accuracy": ..., "loss": ..., ...}``: the averages of the model's
own per-example loss and metrics, computed on the devices in batches of ``config.eval.batch_size``
by a :class:`capsjax.training.evaluation.BatchedEval` (``self.batched``: ``eval_set``, ``evaluate``,
and ``mean`` / ``collect`` of any pure function of the variables and a batch, e.g. one that
differentiates ``self.batched.task.forward`` with respect to the images). The run writes them to
metrics.jsonl, TensorBoard and ``summary.json["evaluations"]`` under the evaluation's name.
``config.data.test_limit`` limits every set.

Each evaluator class declares its settings as ``SETTINGS`` (``{key: Setting}``: default,
meaning, range; :mod:`capsjax.config.settings`), beside its code; a key it does not declare is
refused, naming the nearest one, and :meth:`Evaluator.setting` reads the value in effect.

To add an evaluation (registered, or named by import path in ``type``: a runnable example is
``examples/input_gradients.py``): docs/extending.md.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, ClassVar

import ml_collections

from capsjax import datasets
from capsjax.common import checks
from capsjax.common.errors import UsageError
from capsjax.config import registries, schema
from capsjax.config import settings as settings_lib
from capsjax.runs import predictions


def limit(split: datasets.Split, config) -> datasets.Split:
  """``split`` cut to ``config.data.test_limit`` examples (0: all), a fair sample of it:
  :meth:`capsjax.datasets.Split.sample`."""
  return split.sample(int(config.data.test_limit))


class SkipEvaluation(Exception):
  """Raised by an evaluator's constructor when its data is not available (says why)."""


class Evaluator:
  """Base class: one named evaluation. Subclasses build their sets in ``__init__``
  (through ``self.batched.eval_set``) and implement :meth:`run`."""
  type_name: ClassVar[str] = ""
  # Its settings besides ``type`` (module docstring; ``{key: default}`` also serves): a misspelled
  # one is refused, never run at its default. None: undeclared (nothing checked or filled in).
  SETTINGS: ClassVar[dict[str, Any] | None] = None
  # How many examples a sample of this evaluation holds (:meth:`sampled`); None: not a sample.
  examples: int | None = None

  def __init__(self, name: str, settings: ml_collections.ConfigDict, config, builder,
               splits: dict, batched):
    """``settings``: ``config.evals[name]`` or other settings (frozen: in effect); ``config``
    the run config; ``builder`` the dataset builder; ``splits`` its host splits; ``batched`` a
    :class:`capsjax.training.evaluation.BatchedEval`."""
    self.name, self.settings, self.config = name, settings, config
    self.builder, self.splits, self.batched = builder, splits, batched
    # A resolved config's evaluations (frozen) hold every setting in effect already.
    self._values = ({k: settings[k] for k in settings if k != "type"} if settings_lib.in_effect(
        settings) else schema.resolve_evaluation(type(self), name, settings))

  @property
  def runner(self):
    """Deprecated (0.2.0): :attr:`batched`, the same object (``runner`` named several things)."""
    warnings.warn(f"{type(self).__name__}.runner is deprecated: use .batched (the same "
                  "capsjax.training.evaluation.BatchedEval; CHANGELOG.md).", DeprecationWarning,
                  stacklevel=2)
    return self.batched

  def limited(self, split: datasets.Split) -> datasets.Split:
    """``split`` limited as :func:`limit` does."""
    return limit(split, self.config)

  def _chosen_split(self) -> datasets.Split:
    """The split its setting ``split`` names; UsageError naming those the dataset has."""
    name = self.setting("split")
    if name not in self.splits:
      raise UsageError(f"config.evals.{self.name}.split={name!r}: the dataset has the splits "
                       f"{tuple(self.splits)}.")
    return self.splits[name]

  def setting(self, key: str) -> Any:
    """The setting ``key`` of this evaluation in effect: the config's, or its declared default
    (:attr:`SETTINGS`) where the config leaves it out or sets None."""
    if self.SETTINGS is not None and key not in self.SETTINGS:
      raise KeyError(f"{type(self).__name__} reads the setting {key!r} but does not declare "
                     "it: add it with its default to its SETTINGS.")
    return self._values.get(key)

  def count(self, key: str, *, minimum: int = 0) -> int:
    """The setting ``key`` as an integer >= ``minimum`` (e.g. ``limit``), or UsageError
    naming ``config.evals.NAME.key``."""
    return checks.count(self.setting(key), f"config.evals.{self.name}.{key}", minimum)

  def run(self, params) -> dict:
    """The named metrics of the model with ``params``: every variable of the model, parameters
    and state (``TrainState.variables``), as ``nnx.merge`` takes them."""
    raise NotImplementedError

  def run_and_predict(self, params) -> tuple[dict, "predictions.Predictions | None"]:
    """:meth:`run`'s metrics and, for evaluations of examples as they are, which class the
    model predicted for each (:class:`capsjax.runs.predictions.Predictions`); None here."""
    return self.run(params), None

  def sampled(self, n: int) -> "Evaluator":
    """This evaluation on at most ``n`` of its examples, for the evaluations during training
    (``config.eval.during_limit``): here itself; an evaluator of a split's examples gives a
    fixed sample of them (:meth:`capsjax.datasets.Split.sample`)."""
    del n
    return self

  def draw(self, model, workdir: str, writer, step: int) -> None:
    """Optional figures of this evaluation (after training)."""


EVALUATORS = registries.EVALUATORS  # The table: capsjax/config/registries.py


def types() -> tuple[str, ...]:
  return EVALUATORS.names()


def eval_settings(config) -> dict[str, ml_collections.ConfigDict]:
  """``config.evals`` as ``{name: settings}``; the default is the test split alone."""
  evals = config.get("evals")
  if evals is None:
    return {"test": ml_collections.ConfigDict({"type": "split", "split": "test"})}
  return {name: evals[name] for name in evals}


def check_types(settings: dict, where: str = "config.evals") -> tuple[dict, dict[str, type]]:
  """Raises UsageError for an evaluation whose ``type`` names no evaluator class, or whose
  settings it does not declare or cannot take. Returns ``settings`` with each one's in effect,
  frozen, so that they are not resolved again (those of a resolved config, checked already, as
  they are), and ``{type: class}`` of those it checked."""
  checked, classes = {}, {}
  for name, s in settings.items():
    if settings_lib.in_effect(s):
      checked[name] = s
      continue
    cls = classes[s["type"]] = schema.evaluator_class(s.get("type"), where, name)
    if not issubclass(cls, Evaluator):
      raise UsageError(f"{where}.{name}.type={s.get('type')!r} is not a subclass of "
                       f"capsjax.evaluators.Evaluator.")
    checked[name] = ml_collections.FrozenConfigDict(
        {"type": s["type"], **schema.resolve_evaluation(cls, name, s, where)})
  return checked, classes


def build(settings: dict, config, builder, splits: dict, batched,
          log: Callable[[str], None] = print, classes: dict | None = None
          ) -> dict[str, Evaluator]:
  """The evaluators of ``settings`` (``{name: settings}``), skipping (and logging) those whose
  data are missing (:class:`SkipEvaluation`). Their classes: ``classes`` (``{type: class}``,
  as :func:`check_types` gives them), those resolving a resolved ``config`` found
  (:attr:`capsjax.config.schema.ResolvedConfig.choices`), else looked up."""
  settings, checked = check_types(settings)
  found = config.choices.evaluators if isinstance(config, schema.ResolvedConfig) else {}
  classes = {**found, **checked, **(classes or {})}
  built = {}
  for name, s in settings.items():
    try:
      cls = classes[s.type] if s.type in classes else EVALUATORS.get(s.type)
      built[name] = cls(name, s, config, builder, splits, batched)
    except SkipEvaluation as e:
      log(f"Skipping evaluation {name!r}: {e}")
  return built


def build_all(config, builder, splits: dict, batched,
              log: Callable[[str], None] = print) -> dict[str, Evaluator]:
  """The evaluators of ``config.evals`` (``config`` resolved first:
  :func:`capsjax.config.schema.as_resolved`), plus ``validation`` when the data hold one out
  (:attr:`capsjax.config.schema.Choices.held_out`)."""
  config = schema.as_resolved(config)
  settings = eval_settings(config)
  if len(splits.get("validation", ())) and "validation" not in settings:
    settings["validation"] = config.choices.held_out
  return build(settings, config, builder, splits, batched, log)
