"""The router interface: what a router is (:class:`Router`), what it returns
(:class:`RoutingResult`), the parameters it may declare (:class:`ParamSpec`), how a
convolutional layer looks to one that routes it whole (:class:`ConvLayer`), and the settings
routers share. The arithmetic they share is :mod:`capsjax.routing.core`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from capsjax.config.settings import NON_NEGATIVE, Setting, at_least, declared
from capsjax.common import checks


def iterations_setting(default: int, meaning: str) -> Setting:
  """A router's ``iterations``: an integer >= 1."""
  return Setting(default, meaning, check=at_least(1))


# Eq. 1's epsilon, of every router that squashes (and of CapsNet's primary capsules).
SQUASH_EPSILON = Setting(0.0, "Eq. 1's epsilon: 0 is Eq. 1 exactly; public code often uses "
                         "1e-7..1e-9.", check=NON_NEGATIVE)


def check_iterations(value) -> None:
  """UsageError unless ``config.model.routing.iterations`` is an integer >= 1."""
  checks.count(value, "config.model.routing.iterations", minimum=1)


def per_iteration(rows: list[dict[str, jax.Array]]) -> dict[str, jax.Array]:
  """``[{name: (batch,)}, ...]``, one dict per iteration, as ``{name: (batch, iterations)}``."""
  return {k: jnp.stack([row[k] for row in rows], axis=1) for k in rows[0]}


class RoutingResult(NamedTuple):
  """What a router returns.

  Attributes:
    capsules: the parent capsules (poses), ``(batch, out_caps, out_dim)``.
    activations: the parents' activations ``(batch, out_caps)`` for routers that compute them
      (``self_routing``), else None (the model then scores by capsule lengths).
    diagnostics: ``{name: (batch, iterations)}`` if asked for (:mod:`capsjax.routing`), else ``{}``.
    activation_logits: for routers that say so (:attr:`Router.activation_logits`), the logits of
      their sigmoid activations (same shape) that a layer's VB batch norms normalise; else None.
  """
  capsules: jax.Array
  activations: jax.Array | None
  diagnostics: dict[str, jax.Array]
  activation_logits: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class ConvLayer:
  """What a router that routes a convolutional layer whole sees of it (:attr:`Router.route_layer`),
  built by ``capsjax.models.conv_capsules`` so that the router needs nothing from the models.

  Attributes:
    num_children: the layer's true children (input types x height x width); each is a child
      of several receptive fields.
    normalisation: the E-step's normalisation the layer is configured with
      (``model.conv_caps.normalisation``: EM's ``"code"``, ``"child"`` or ``"patch"``).
    normaliser: ``normaliser(mode, epsilon)`` -> ``log p -> assignments`` over each child's
      parents in that mode, ``log p`` ``(batch, children, out_caps, positions)``.
    child_sum: ``values (batch, children, out_caps, positions)`` -> each entry replaced by
      the sum over every parent of its true child.
  """
  num_children: int
  normalisation: str
  normaliser: Callable[[str, float], Callable[[jax.Array], jax.Array]]
  child_sum: Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  """A learned parameter a router declares; the layer creates it.

  Attributes:
    shape: its shape.
    init: ``"zeros"``, ``"ones"``, a number (every entry that constant), or a callable ``(key,
      shape) -> array``. A layer draws a key for each parameter but a number's (so that EM's and
      VB's constant betas in a convolutional capsule layer leave the later layers' draws as they
      were).
  """
  shape: tuple[int, ...]
  init: Any = "zeros"

  @property
  def needs_key(self) -> bool:
    return not isinstance(self.init, (int, float))

  def create(self, key: jax.Array | None) -> jax.Array:
    if self.init == "zeros":
      return jnp.zeros(self.shape, jnp.float32)
    if self.init == "ones":
      return jnp.ones(self.shape, jnp.float32)
    if not self.needs_key:
      return jnp.full(self.shape, self.init, jnp.float32)
    return self.init(key, self.shape)


@dataclasses.dataclass(frozen=True, eq=False)
class Router:
  """A routing algorithm, as registered in :data:`capsjax.routing.ROUTERS`.

  Its ``name`` is what it is: two routers of one name are equal and hash alike, so that a layer
  holds its router itself, static in NNX's graph definition (its ``settings`` are unhashable).

  Attributes:
    name: its registered name (``config.model.routing.name``).
    settings: each setting it reads, declared (``{key: capsjax.config.settings.Setting}``:
      default, meaning, range; a plain value is taken as the default): what
      ``config.model.routing`` may set for it.
    route: the routing function (its interface: :mod:`capsjax.routing`).
    parameters: ``parameters(in_caps, in_dim, out_caps, out_dim, settings) ->
      {name: ParamSpec}``, the learned parameters it needs (most need none).
    check: ``check(settings)`` raises UsageError naming a setting whose value cannot work
      with the others (each setting's own range is its declaration's).
    uses_parent_bias: whether a bias on s_j (``model.class_capsules.use_bias``) means anything.
    yields_activations: whether it computes the parents' activations (else lengths score them).
    squashes: whether the parents' lengths are squashed into [0, 1) (their saturation is watched).
    route_layer: for routers that route a convolutional layer as a whole (a child shared by
      the receptive fields it is in: EM, VB), ``route_layer(votes, *, activations, params,
      settings, layer, diagnostics) -> RoutingResult``: ``votes`` ``(batch, children,
      out_caps, positions, D)`` (children: the receptive field's), ``activations`` ``(batch,
      children, 1, positions)``, ``layer`` a :class:`ConvLayer`; parents ``(batch, out_caps,
      positions, D)``, activations ``(batch, out_caps, positions)``. None: the layer routes
      each receptive field on its own with ``route``.
    activation_logits: whether its results carry ``activation_logits`` (:class:`RoutingResult`).
    parent_batch_norms: whether its authors' matrix-capsule network batch-normalises each
      routed layer's parents (activation logits and poses), which ``em_capsnet`` then does
      (the VB code's; needs ``activation_logits``).
    conv_layer_settings: the settings the convolutional capsule layers of ``em_capsnet`` take
      from ``config.model.conv_caps`` rather than from ``config.model.routing`` (their own
      values in the authors' code: EM's inverse temperature, mass epsilon and beta inits).
  """
  name: str
  settings: dict[str, Any]
  route: Callable[..., RoutingResult]
  parameters: Callable[..., dict[str, ParamSpec]] = lambda *args: {}
  check: Callable[[dict], None] = lambda settings: None
  uses_parent_bias: bool = False
  yields_activations: bool = False
  squashes: bool = True
  route_layer: Callable[..., RoutingResult] | None = None
  activation_logits: bool = False
  parent_batch_norms: bool = False
  conv_layer_settings: tuple[str, ...] = ()

  def __eq__(self, other) -> bool:
    return isinstance(other, Router) and other.name == self.name

  def __hash__(self) -> int:
    return hash(("Router", self.name))

  @property
  def declared(self) -> dict[str, Setting]:
    """:attr:`settings` as declarations."""
    return declared(self.settings)

  @property
  def defaults(self) -> dict[str, Any]:
    """Each setting's default: the router with its paper's (or authors' code's) values."""
    return {key: s.default for key, s in self.declared.items()}
