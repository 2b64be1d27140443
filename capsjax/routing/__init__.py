"""Routing algorithms behind one interface; ``config.model.routing.name`` picks one.

Every router is a pure JAX function (no Flax), registered by name in :data:`ROUTERS`::

    route(votes, *, inputs, activations, params, rng, settings, train, diagnostics)
        -> RoutingResult(capsules, activations, diagnostics)

* ``votes``: u_hat_{j|i} = W_ij u_i, ``(batch, in_caps, out_caps, out_dim)``
  (:func:`capsule_votes`; W is the layer's, the same for every router).
* ``inputs``: the child capsules u_i, ``(batch, in_caps, in_dim)``; ``activations``: theirs,
  ``(batch, in_caps)`` (their lengths, for vector capsules). Most routers ignore both.
* ``params``: the router's own learned parameters, ``{name: array}``, created by the layer from
  the shapes it declares (:class:`ParamSpec`); the bias on s_j (``model.class_capsules.use_bias``)
  comes as ``params["bias"]`` for the routers that form s_j as a weighted sum and squash it.
* ``rng``: a key for routers that draw (``random``) in training; None at evaluation.
* ``settings``: the router's settings, every one filled in (:func:`resolve`).
* ``train``: training or evaluation; ``diagnostics``: also measure, per example and per iteration,
  what the router can (coupling entropy and largest coefficient, logit or pose change, agreement,
  |s_j|): ``{name: (batch, iterations)}`` (where runs log them: docs/routers.md).
* Returns a :class:`RoutingResult`: the parents ``(batch, out_caps, out_dim)``, their
  activations or None, the diagnostics (``{}`` unless asked for) and maybe activation logits.

A router that routes a convolutional capsule layer as a whole (a child shared by every receptive
field it is in: EM, VB) also declares ``route_layer``; the layer hands it a :class:`ConvLayer` (its
sums over each child's parents). The layers never branch on a router's name.

The routers, with their papers, settings and parameter counts: docs/routers.md's table. Each
module's docstring has its paper's equations and every place where its reference code and the paper
differ.

Settings: each router declares its own (``SETTINGS``, beside its code: default, meaning, range);
:func:`resolve` fills in the chosen router's defaults, and refuses a setting that is misspelled
or set for a router that does not have it, so ``--config.model.routing.name=uniform`` alone
switches router. To add a router: docs/extending.md (a module ``capsjax/routing/NAME.py`` with
``ROUTER = Router(name="NAME", ...)``, found by :data:`ROUTERS`, or one named by import path).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from capsjax.common import public_names
from capsjax.config import schema
from capsjax.config import settings as settings_lib
from capsjax.common.errors import UsageError
from capsjax.config import registries
from capsjax.routing.core import (capsule_votes, coupled_parents, coupling_statistics, exp_squash,
                                  matrix_votes, safe_norm, squash)
from capsjax.routing.router import ConvLayer, ParamSpec, Router, RoutingResult
from capsjax.routing.dynamic import SOFTMAX_AXES, coupling_coefficients, dynamic_routing
from capsjax.routing.dynamic_trace import (RoutingTrace, routing_diagnostics,
                                           routing_diagnostics_per_example)

ROUTERS = registries.ROUTERS  # The table: capsjax/config/registries.py
DEFAULT = schema.DEFAULT_ROUTER   # The paper's: dynamic routing.


def get(name: str) -> Router:
  """The router registered as ``name``, or a researcher's own named by import path
  (``"my_routers:ROUTER"``, ``"path/to/file.py:ROUTER"``; its ``name`` becomes that path, so
  that a run's config.json names it); UsageError naming the choices if none."""
  router = schema.router(name)
  if not isinstance(router, Router):
    raise UsageError(f"config.model.routing.name={name!r} is not a capsjax.routing.Router "
                     f"(got {type(router).__name__}).")
  return router


def resolve(config, *, allow_unusual: bool = False) -> tuple[Router, dict[str, Any]]:
  """The router of ``config`` (``config.model.routing``, a ConfigDict or dict) and its
  settings with the defaults filled in: :func:`capsjax.config.schema.resolve_routing`, which
  resolving a run's config does (a model reads its resolved section, and resolves nothing)."""
  return schema.resolve_routing(config, allow_unusual=allow_unusual)


def chosen(section, router: Router | None = None) -> tuple[Router, dict[str, Any]]:
  """The router of a routing section (``config.model.routing``) and its settings: a resolved
  config's section (frozen: :class:`capsjax.config.schema.ResolvedConfig`) as it is, every
  setting in effect, with ``router``, the one resolving chose for it (:func:`chosen_router`;
  None: looked up by its name); any other section resolved first (:func:`resolve`)."""
  if not settings_lib.in_effect(section):
    return resolve(section)
  if router is not None and router.name != section.name:
    raise ValueError(f"router {router.name!r} was handed with a section of {section.name!r}.")
  return router or get(section.name), {k: section[k] for k in section if k != "name"}


def chosen_router(config, path: str = "model.routing") -> Router | None:
  """The router resolving a run's ``config`` chose for its section ``path``
  (:attr:`capsjax.config.schema.ResolvedConfig.choices`), so that a model built from the
  resolved config looks no name up; None for a config that is not resolved (or a path it
  does not route)."""
  return config.choices.routers.get(path) if isinstance(config, schema.ResolvedConfig) else None


def fill(config: ml_collections.ConfigDict) -> tuple[Router, dict[str, Any]]:
  """:func:`resolve`, and writes the settings in effect into ``config`` (``name`` too), so that
  the run's ``config.json`` records them."""
  router, settings = resolve(config)
  with config.unlocked():
    config.name = router.name
    for key, value in settings.items():
      config[key] = value
  return router, settings


__all__ = [
    "DEFAULT", "ROUTERS", "SOFTMAX_AXES", "ConvLayer", "ParamSpec", "Router", "RoutingResult",
    "RoutingTrace", "capsule_votes", "chosen", "chosen_router", "coupled_parents",
    "coupling_coefficients", "coupling_statistics", "dynamic_routing", "exp_squash", "fill", "get",
    "matrix_votes", "resolve", "routing_diagnostics", "routing_diagnostics_per_example",
    "safe_norm", "squash",
]

__getattr__ = public_names.module_getattr(__name__)
