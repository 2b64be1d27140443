"""Routing algorithms behind one interface; ``config.model.routing.name`` picks one.

Every router is a pure JAX function (no Flax), registered by name in :data:`ROUTERS`::

    route(votes, *, inputs, activations, params, rng, settings, train, diagnostics)
        -> RoutingResult(capsules, activations, diagnostics)

* ``votes``: u_hat_{j|i} = W_ij u_i, ``(batch, in_caps, out_caps, out_dim)``
  (:func:`capsule_votes`; W is the layer's, the same for every router).
* ``inputs``: the child capsules u_i, ``(batch, in_caps, in_dim)``; ``activations``: theirs,
  ``(batch, in_caps)`` (their lengths, for vector capsules). Most routers ignore both.
* ``params``: the router's own learned parameters, ``{name: array}``, created by the layer
  from the shapes the router declares (:class:`ParamSpec`); the bias on s_j
  (``model.class_capsules.use_bias``) comes as ``params["bias"]`` for the routers that form
  s_j as a weighted sum and squash it.
* ``rng``: a key for routers that draw (``random``) in training; None at evaluation.
* ``settings``: the router's settings, every one filled in (:func:`resolve`).
* ``train``: training or evaluation; ``diagnostics``: also measure, per example and per
  iteration, what the router can (coupling entropy and largest coefficient, logit or pose
  change, agreement, |s_j|): ``{name: (batch, iterations)}``. Runs log them under these
  names; the routing figure draws whatever a router supplies.
* Returns the parents ``(batch, out_caps, out_dim)``, their activations ``(batch, out_caps)``
  for routers that compute them (else None: the capsule lengths are the scores), and the
  diagnostics (``{}`` unless asked for); routers that say so (``Router.activation_logits``)
  also the activations' logits, for a layer's batch norms.

A router that routes a convolutional capsule layer as a whole (a child shared by every
receptive field it is in: EM, VB) also declares ``route_layer``; the layer hands it a
:class:`ConvLayer` (its sums over each child's parents). The layers never branch on a
router's name.

The routers (each module's docstring has its paper's equations and every place where the
reference code and the paper differ):

================================  =========================================================
``dynamic`` (default)             Procedure 1 of Sabour et al. 2017, with its switches.
``uniform``                       c_ij = 1/out_caps, no iteration (the "no routing" control).
``random``                        c_i = softmax of Gaussian logits (Paik et al. 2019's control).
``self_attention``                Efficient-CapsNet (Mazzia et al. 2021), one pass.
``inverted_dot_product``          Tsai et al. 2020, LayerNorm'd poses, no squash.
``self_routing``                  Hahn et al. 2019, a learned routing matrix per child.
``em``                            Hinton et al. 2018, EM routing (Gaussian parents).
``variational_bayes``             Ribeiro et al. 2020, a variational Gaussian mixture.
================================  =========================================================

Settings: ``config.model.routing`` holds ``name`` and every router's settings
(:func:`config_keys`), unset (None) in the config files so that each takes the chosen
router's default (the paper's value), as ``config.optimizer`` does; the run fills them in, so
``config.json`` shows what ran. A setting that is misspelled, or set for a router that does
not have it, is refused naming it and the router's settings. So
``--config.model.routing.name=uniform`` alone switches router, and
``--config.model.routing.iterations=1`` keeps its meaning.

To add a router: a module with ``ROUTER = Router(...)`` (:class:`Router`) and one line in
:data:`ROUTERS`; or, without touching capsjax, name it by import path in the config
(``--config.model.routing.name=examples/my_router.py:ROUTER``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
from ml_collections import config_dict

from capsjax.common import config_keys as schema
from capsjax.common.errors import UsageError
from capsjax.common.registry import Registry
from capsjax.routing.core import (ConvLayer, ParamSpec, Router, RoutingResult, capsule_votes,
                                  coupled_parents, coupling_statistics, exp_squash,
                                  matrix_votes, safe_norm, squash)
from capsjax.routing.dynamic import (SOFTMAX_AXES, RoutingTrace, coupling_coefficients,
                                     dynamic_routing, routing_diagnostics,
                                     routing_diagnostics_per_example)

# name -> "module:ROUTER": one line per router.
ROUTERS = Registry("router", "config.model.routing.name", {
    "dynamic": "capsjax.routing.dynamic:ROUTER",
    "uniform": "capsjax.routing.uniform:ROUTER",
    "random": "capsjax.routing.random_coupling:ROUTER",
    "self_attention": "capsjax.routing.self_attention:ROUTER",
    "inverted_dot_product": "capsjax.routing.inverted_dot_product:ROUTER",
    "self_routing": "capsjax.routing.self_routing:ROUTER",
    "em": "capsjax.routing.em:ROUTER",
    "variational_bayes": "capsjax.routing.variational_bayes:ROUTER",
})
DEFAULT = schema.DEFAULT_ROUTER   # The paper's; declared in the schema.


def get(name: str) -> Router:
  """The router registered as ``name``, or a researcher's own named by import path
  (``"my_routers:ROUTER"``, ``"path/to/file.py:ROUTER"``; its ``name`` becomes that path, so
  that a run's config.json names it); UsageError naming the choices if none."""
  router = ROUTERS.get(name)
  if not isinstance(router, Router):
    raise UsageError(f"config.model.routing.name={name!r} is not a capsjax.routing.Router "
                     f"(got {type(router).__name__}).")
  return router if router.name == name else dataclasses.replace(router, name=name)


def all_settings() -> dict[str, list[str]]:
  """Every setting any router has -> the routers that have it."""
  table: dict[str, list[str]] = {}
  for name in ROUTERS.names():
    for key in get(name).settings:
      table.setdefault(key, []).append(name)
  return table


def config_keys() -> dict[str, Any]:
  """What ``config.model.routing`` holds in a config file: ``name`` and every router's
  settings, unset (the chosen router's default). Unset keys are placeholders typed by their
  defaults, so that the command line can set them."""
  keys: dict[str, Any] = {"name": DEFAULT}
  for key, routers in all_settings().items():
    keys[key] = config_dict.placeholder(type(get(routers[0]).settings[key]))
  return keys


def resolve(config) -> tuple[Router, dict[str, Any]]:
  """The router of ``config`` (``config.model.routing``, a ConfigDict or dict) and its
  settings with the defaults filled in.

  Raises UsageError naming the key for an unknown router, a misspelled setting, a setting the
  chosen router does not have (set, i.e. not None), and values the router cannot use. An
  unset ``name`` is the default router (dynamic routing); old runs' config.json files are
  brought to this form by :mod:`capsjax.runs.migrations`.
  """
  given = {k: config[k] for k in config}
  name = given.pop("name", None) or DEFAULT
  router = get(name)
  known = all_settings()
  for key in router.settings:  # A researcher's own router (by import path) brings its own.
    known.setdefault(key, [name])
  own = sorted(router.settings) or "none"
  for key, value in given.items():
    if key not in known:
      raise UsageError(f"config.model.routing.{key} is not a routing setting; router {name!r} "
                       f"has {own} (every router's: {sorted(known)}).")
    if value is not None and key not in router.settings:
      raise UsageError(f"config.model.routing.{key}={value!r} is not a setting of router "
                       f"{name!r} (it is {', '.join(known[key])}'s); {name!r} has {own}. Leave "
                       f"it unset.")
  settings = {key: given[key] if given.get(key) is not None else default
              for key, default in router.settings.items()}
  router.check(settings)
  return router, settings


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
    "RoutingTrace", "all_settings", "capsule_votes", "config_keys", "coupled_parents",
    "coupling_coefficients", "coupling_statistics", "dynamic_routing", "exp_squash", "fill",
    "get", "matrix_votes", "resolve", "routing_diagnostics", "routing_diagnostics_per_example",
    "safe_norm", "squash",
]
