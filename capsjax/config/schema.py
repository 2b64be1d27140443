"""Every setting a config may hold, gathered from where it is declared, and the one pass that
resolves a config before anything runs.

Each key is declared once (:mod:`capsjax.config.settings`):

* the run's own: :data:`capsjax.config.run_settings.RUN` (which dataset and model, the seed,
  the data order, the matmul precision, ``config.train``, ``config.eval``);
* the dataset builder's ``SETTINGS`` (``config.data``) and the model class's (``config.model``
  and the model's ``config.loss``), each with its ``RULES``;
* the router's, for each section the model routes with (``config.model.routing``);
* the optimiser's and schedule's (``config.optimizer``: :mod:`capsjax.config.optimizer`) and
  each evaluation's (``config.evals.NAME``: its evaluator class's).

The classes are found by name through :mod:`capsjax.config.registries` (imported when first
asked for), so this module imports none of the packages that read a config.

:func:`resolve_config` is what every command does to its config before it builds anything (a
problem: exit 2, before anything is compiled); ``config.json`` records the result, every setting
in effect. A dataset or model named by import path that declares no ``SETTINGS`` gets its
section (``config.data``; ``config.model`` and ``config.loss``) as given. The result is a
:class:`ResolvedConfig`: frozen, so that nothing after the command's entry fills in a default or
changes a value.

``python -m capsjax.config.schema`` prints every table as Markdown (docs/config_keys.md).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import ml_collections

from capsjax.common.errors import UsageError
from capsjax.config import optimizer as optimizer_settings
from capsjax.config import registries, run_settings as run_settings_lib
from capsjax.config import settings as settings_lib
from capsjax.config.settings import Setting

TOP = run_settings_lib.TOP
# The sections resolved as a whole against a table that one of their keys chooses.
OPTIMIZER, EVALS = "optimizer", "evals"


@dataclasses.dataclass(frozen=True)
class Choices:
  """What resolving a config found by name, so that nothing after it looks a name up again:
  the ``dataset`` builder and ``model`` classes; ``routers``, ``{path: Router}`` of each section
  the model routes with (``"model.routing"``); ``evaluators``, ``{type: class}``; ``held_out``,
  the settings in effect (frozen) of the evaluation a run adds on a validation split (where its
  data hold one) when ``config.evals`` names no ``validation``, else None."""
  dataset: type
  model: type
  routers: dict[str, Any]
  evaluators: dict[str, type]
  held_out: ml_collections.FrozenConfigDict | None


class ResolvedConfig(ml_collections.FrozenConfigDict):
  """A config as :func:`resolve_config` made it: every setting in effect, checked, frozen, and
  what it names found (:attr:`choices`).

  Only :func:`resolve_config` makes one. Functions handed one use it as it is; handed any other
  config, they resolve it first (:func:`as_resolved`). ``as_configdict()`` gives a mutable copy
  (which is no longer resolved)."""

  @property
  def choices(self) -> Choices:
    """The classes and routers the config names (:class:`Choices`)."""
    return self.__dict__["_choices"]

  # Frozen, so a copy is the config itself; pickled (the choices hold functions), it is its
  # values, resolved again where it is loaded.
  def __deepcopy__(self, memo=None) -> "ResolvedConfig":
    return self

  __copy__ = copy_and_resolve_references = __deepcopy__

  def __reduce__(self):
    return resolve_config, (self.as_configdict(),)


def as_resolved(config) -> ResolvedConfig:
  """``config`` itself when :func:`resolve_config` made it, else :func:`resolve_config` of it:
  what a function that may be called with a user's config does first."""
  return config if isinstance(config, ResolvedConfig) else resolve_config(config)


def run_settings() -> dict[str, Setting]:
  """The run's own settings (:data:`capsjax.config.run_settings.RUN`), a copy."""
  return dict(run_settings_lib.RUN)


def router(name: str):
  """The router registered as ``name`` or named by import path (its ``name`` then that path, so
  that config.json names it): :data:`capsjax.config.registries.ROUTERS`. UsageError when the
  object found is not a router (it declares no ``settings`` and ``route``)."""
  found = registries.ROUTERS.get(name)
  if not all(hasattr(found, a) for a in ("name", "settings", "route", "check")):
    raise UsageError(f"config.model.routing.name={name!r} is not a capsjax.routing.Router "
                     f"(got {type(found).__name__}).")
  return found if found.name == name else dataclasses.replace(found, name=name)


def resolve_routing(section, *, allow_unusual: bool = False):
  """``(router, settings)`` of a routing section (``config.model.routing``, a dict or
  ConfigDict): the router and every one of its settings in effect.

  Raises UsageError naming the key for an unknown router, a misspelled setting, a setting the
  chosen router does not have (set, i.e. not None: another router's unset one is let be), and
  values out of a setting's range or that the router cannot use with the others. An unset
  ``name`` is the default router (dynamic routing)."""
  given = {k: section[k] for k in section}
  name = given.pop("name", None) or DEFAULT_ROUTER
  chosen = router(name)
  elsewhere = {key: f"router {', '.join(map(repr, names))}"
               for key, names in router_settings().items() if key not in chosen.settings}
  settings = settings_lib.resolve(given, chosen.settings, "config.model.routing",
                                  owner=f"router {name!r}", elsewhere=elsewhere,
                                  allow_unusual=allow_unusual)
  chosen.check(settings)
  return chosen, settings


DEFAULT_ROUTER = "dynamic"  # The paper's.


def router_settings() -> dict[str, list[str]]:
  """Every setting any registered router has -> the routers that have it."""
  owners: dict[str, list[str]] = {}
  for name in registries.ROUTERS.names():
    for key in router(name).settings:
      owners.setdefault(key, []).append(name)
  return owners


def evaluator_class(kind, where: str = "config.evals", name: str = "NAME") -> type:
  """The evaluator class ``config.evals.NAME.type`` names (:data:`registries.EVALUATORS`);
  UsageError naming the key when none."""
  if kind not in registries.EVALUATORS and not (isinstance(kind, str) and ":" in kind):
    raise UsageError(f"{where}.{name}.type={kind!r} is not a registered evaluator; use one of "
                     f"{registries.EVALUATORS.names()}, or name your own as 'module:Class' or "
                     "'path/to/file.py:Class'.")
  cls = registries.EVALUATORS.get(kind)
  if not (isinstance(cls, type) and hasattr(cls, "run") and hasattr(cls, "SETTINGS")):
    raise UsageError(f"{where}.{name}.type={kind!r} is not a subclass of "
                     "capsjax.evaluators.Evaluator.")
  return cls


def resolve_evaluation(cls: type, name: str, section, where: str = "config.evals",
                       allow_unusual: bool = False) -> dict[str, Any]:
  """The settings of evaluation ``name`` of evaluator class ``cls`` in effect
  (:func:`capsjax.config.settings.resolve` against its ``SETTINGS``; a class that declares
  none gets them as given). UsageError naming a key it does not declare or a bad value."""
  given = {k: section[k] for k in section if k != "type"}
  if cls.SETTINGS is None:
    return given
  return settings_lib.resolve(given, cls.SETTINGS, f"{where}.{name}",
                              owner=f"evaluator type {section.get('type')!r}",
                              allow_unusual=allow_unusual)


def _section(tree: dict, path: str, pop: bool = False):
  """The node at dotted ``path`` of a nested dict (None if absent); ``pop`` removes it."""
  *parents, leaf = path.split(".")
  node = tree
  for part in parents:
    node = node.get(part)
    if not isinstance(node, dict):
      return None
  return node.pop(leaf, None) if pop else node.get(leaf)


def unflatten(flat: dict[str, Any]) -> dict:
  """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
  tree: dict = {}
  for key, value in flat.items():
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def _owner(key: str, dataset: str, model: str) -> str:
  first = key.split(".", 1)[0]
  if first == "data":
    return f"dataset {dataset!r} (or the run's data order)"
  if first in ("model", "loss"):
    return f"model {model!r}"
  return f"config.{first}" if first in ("train", "eval") else "a config"


def declared(dataset_class: type, model_class: type) -> tuple[dict[str, Setting], tuple]:
  """``(settings, rules)`` of a run of this dataset builder and model class: the run's own and
  their ``SETTINGS`` (full dotted keys) and ``RULES``."""
  table = run_settings()
  table.update(settings_lib.declared(getattr(dataset_class, "SETTINGS", None) or {}))
  table.update(settings_lib.declared(getattr(model_class, "SETTINGS", None) or {}))
  rules = (*getattr(dataset_class, "RULES", ()), *getattr(model_class, "RULES", ()))
  return table, rules


def resolve_config(config: ml_collections.ConfigDict) -> ResolvedConfig:
  """A resolved copy of ``config`` (``config`` itself is not written), frozen: every setting in
  effect, the model's ``image_shape`` and ``num_classes`` from the dataset, and what the model
  derives (its ``resolve_config``). Raises UsageError, one line naming the key, for a key nobody
  declared (naming the nearest declared one), a required key left unset, a value of the wrong
  type, out of range or against a rule, and settings the dataset, model, router, optimiser or an
  evaluation cannot use together. Resolving a resolved config gives an equal one."""
  raw = copy.deepcopy(config.to_dict() if hasattr(config, "to_dict") else dict(config))
  top = {key: settings_lib.check_value(f"config.{key}", TOP[key],
                                       _section(raw, key)) for key in TOP}
  allow_unusual = top["allow_unusual"]
  dataset_class = registries.DATASETS.get(top["dataset"])
  model_class = registries.MODELS.get(top["model.name"])
  router_sections = tuple(getattr(model_class, "router_sections", ()))
  routed = {path: _section(raw, path, pop=True) for path in router_sections}
  optimizer = raw.pop(OPTIMIZER, None) or {}
  evals = raw.pop(EVALS, None)

  table, rules = declared(dataset_class, model_class)
  unchecked = tuple(prefix for prefix, cls in (("data.", dataset_class),
                                               ("model.", model_class), ("loss.", model_class))
                    if getattr(cls, "SETTINGS", None) is None)
  flat = settings_lib.flatten(raw)
  owner_of = lambda key: _owner(key, top["dataset"], top["model.name"])
  values = settings_lib.resolve(flat, table, "config", allow_unusual=allow_unusual,
                                owner_of=owner_of, unchecked=unchecked)
  values.update(top)
  settings_lib.check_rules(rules, values, allow_unusual)

  resolved = unflatten(values)
  resolved[OPTIMIZER] = optimizer_settings.resolve(optimizer, allow_unusual=allow_unusual)
  routers = {}
  for path, section in routed.items():
    routers[path], settings = resolve_routing(section or {}, allow_unusual=allow_unusual)
    node = _section(resolved, path.rsplit(".", 1)[0]) if "." in path else resolved
    node[path.rsplit(".", 1)[-1]] = {"name": routers[path].name, **settings}
  resolved[EVALS], evaluators = resolved_evals(evals, allow_unusual)
  held_out = None
  if "validation" not in resolved[EVALS]:
    added, classes = resolved_evals({"validation": HELD_OUT}, allow_unusual, test=False)
    held_out = ml_collections.FrozenConfigDict(added["validation"])
    evaluators.update(classes)
  out = ml_collections.ConfigDict(resolved)
  fill_model_shapes(out, dataset_class)
  hook = getattr(model_class, "resolve_config", None)
  if hook is not None:
    hook(out.model)
  result = ResolvedConfig(out)
  object.__setattr__(result, "_choices", Choices(dataset_class, model_class, routers,
                                                  evaluators, held_out))
  return result


# The evaluation a run adds where its data hold a validation split and config.evals names none.
HELD_OUT = {"type": "split", "split": "validation"}


def resolved_evals(evals, allow_unusual: bool = False, test: bool = True
                   ) -> tuple[dict, dict[str, type]]:
  """``config.evals`` (None: the test split alone) with each evaluation's settings in effect,
  and ``{type: evaluator class}``. ``test``: refuse evaluations without one named 'test'."""
  if evals is None:
    evals = {"test": {"type": "split", "split": "test"}}
  out, classes = {}, {}
  for name, section in evals.items():
    cls = classes[section.get("type")] = evaluator_class(section.get("type"), name=name)
    out[name] = {"type": section["type"],
                 **resolve_evaluation(cls, name, section, allow_unusual=allow_unusual)}
  if test and "test" not in out:
    raise UsageError("config.evals needs an evaluation named 'test' (the main test set, "
                     "e.g. dict(type='split', split='test')).")
  return out, classes


def fill_model_shapes(config: ml_collections.ConfigDict, dataset_class: type) -> None:
  """Sets ``config.model.image_shape`` and ``num_classes`` from the dataset builder of
  ``config`` (``dataset_class``, built on ``config``, whose ``config.data`` is in effect) where
  they are None. A value the config sets must equal the dataset's (UsageError naming the key
  and the right value)."""
  info = dataset_class(config).info
  if config.model.get("image_shape") is None:  # A model of one's own may leave both out.
    config.model.image_shape = tuple(info.image_shape)
  elif tuple(config.model.image_shape) != tuple(info.image_shape):
    raise UsageError(f"config.model.image_shape={tuple(config.model.image_shape)} but the "
                     f"dataset {config.dataset!r} makes images of shape "
                     f"{tuple(info.image_shape)} (with these config.data settings); leave "
                     "config.model.image_shape unset (it follows the data) or set it to "
                     f"'{tuple(info.image_shape)}'.")
  if config.model.get("num_classes") is None:
    config.model.num_classes = int(info.num_classes)
  elif config.model.num_classes != info.num_classes:
    raise UsageError(f"config.model.num_classes={config.model.num_classes} but the dataset "
                     f"{config.dataset!r} has {info.num_classes} classes; leave it unset.")


def neutral_keys(config) -> tuple[str, ...]:
  """The keys of ``config``'s settings that a resumed run may change without changing what it
  computes (declared ``neutral``), and the sections of them (``evals``)."""
  raw = config.to_dict() if hasattr(config, "to_dict") else config
  dataset_class = registries.DATASETS.get(_section(raw, "dataset") or TOP["dataset"].default)
  model_class = registries.MODELS.get(_section(raw, "model.name") or TOP["model.name"].default)
  table, _ = declared(dataset_class, model_class)
  return (*sorted(k for k, s in table.items() if s.neutral), EVALS)


# --- The listing -------------------------------------------------------------------------

def listing() -> str:
  """Every declared setting, by the code that declares it, as Markdown: the run's own, each
  registered dataset's and model's, the optimisers' and schedules', each router's and each
  evaluator's. docs/config_keys.md is its output (a test keeps it so)."""
  lines = ["# Every config key capsjax reads", "",
           "Generated by `python -m capsjax.config.schema` from each key's one declaration (a",
           "router's, model's, dataset's or evaluator's beside its code; the run's own in",
           "`capsjax/config/run_settings.py`; `capsjax/config/settings.py` says how;",
           "tests/test_schema.py checks that this file is its output). A key left out, or set to",
           "None, takes its default; `required`: every config sets it. Values out of range are",
           "refused before anything runs, naming the key; those marked `else allow_unusual` run",
           "with `--config.allow_unusual=True`.", ""]

  def section(title: str, table: dict, prefix: str = "", note: str = "") -> None:
    lines.extend([title, ""] + ([note, ""] if note else []))
    if table:
      lines.extend(["| key | default | type, range | meaning |", "|---|---|---|---|",
                    *settings_lib.markdown_rows(table, prefix)])
    else:
      lines.append("No settings.")
    lines.append("")

  section("## Every run", run_settings())
  lines.extend(["## `config.data`: each dataset's (`config.dataset`)", ""])
  for name in registries.DATASETS.names():
    section(f"### `{name}`", registries.DATASETS.get(name).SETTINGS or {})
  lines.extend(["## `config.model`, `config.loss`: each model's (`config.model.name`)", ""])
  for name in registries.MODELS.names():
    cls = registries.MODELS.get(name)
    routed = ", ".join(f"`{p}`" for p in getattr(cls, "router_sections", ()))
    section(f"### `{name}`", cls.SETTINGS or {},
            note=f"Routes with the router of {routed} (below)." if routed else "")
  lines.extend(["## `config.optimizer`", ""])
  section("### Every optimiser's", optimizer_settings.COMMON, "optimizer.")
  for name, table in optimizer_settings.OPTIMIZERS.items():
    section(f"### `optimizer.name = \"{name}\"`", table, "optimizer.")
  for name, table in optimizer_settings.SCHEDULES.items():
    section(f"### `optimizer.schedule = \"{name}\"`", table, "optimizer.")
  lines.extend(["## `config.model.routing`: each router's (`name`)", ""])
  for name in registries.ROUTERS.names():
    section(f"### `{name}`", router(name).settings, "model.routing.")
  lines.extend(["## `config.evals.NAME`: each evaluator's (`type`)", ""])
  for name in registries.EVALUATORS.names():
    section(f"### `{name}`", registries.EVALUATORS.get(name).SETTINGS or {}, "evals.NAME.")
  return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
  print(listing(), end="")
