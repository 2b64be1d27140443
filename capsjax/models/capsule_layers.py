"""The capsule layers every capsule model is built from, vector and matrix capsules alike.

A layer of capsules is :class:`Capsules`: poses ``(batch, ..., dim)`` (vectors, or ``p x p``
pose matrices flattened to ``p * p``) and activations ``(batch, ...)``. The stack:

* primary capsules: :class:`PrimaryCapsules` (a convolution grouped into squashed vectors,
  Sabour et al. 2017) or, for matrix capsules, :mod:`capsjax.models.matrix_capsules`'
  ``MatrixPrimaryCapsules`` (a 1x1 convolution to pose matrices and logistic activations,
  Hinton et al. 2018);
* :class:`~capsjax.models.conv_capsules.ConvCapsules`: capsules over receptive fields, one
  transform per (input type, kernel offset, output type);
* :class:`ClassCapsules`: fully connected, one transform per (child, class), or per (child
  type, class) shared over positions with coordinate addition
  (:class:`capsjax.models.matrix_capsules.GridMatrixVotes`).

Every routed layer takes any router of :mod:`capsjax.routing` (``routing=(router, settings)``), so
the capsule type and the routing are independent choices: dynamic routing on matrix capsules, EM on
vector capsules. The routers' own parameters are created in the layer (``router_params``). A router
without activations (``dynamic``, ``uniform``, ...) gives its parents their lengths as activations.

How a convolutional layer routes: :mod:`capsjax.models.conv_capsules`. Under variational Bayes
a layer can batch-normalise its parents' activation logits and poses (``routing_norms``,
:class:`capsjax.models.matrix_capsules.RoutingNorms`), as the VB authors' code does.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from capsjax import routing as routing_lib
from capsjax.common.errors import UsageError
from capsjax.models import layers
# Matrix capsules' parts, public here too (their home until 0.2.0).
from capsjax.models.matrix_capsules import (GridMatrixVotes, MatrixPrimaryCapsules,  # noqa: F401
                                            RoutingNorms, check_routing_norms,
                                            matrix_vote_weights)

PRIMARY_LAYOUTS = ("code", "split")


class Capsules(NamedTuple):
  """A layer of capsules: what primary capsule layers return and class capsules take.

  Attributes:
    poses: ``(batch, num_capsules, dim)``: vectors (Sabour et al. 2017), or ``p x p`` pose
      matrices flattened to ``p * p`` (Hinton et al. 2018).
    activations: ``(batch, num_capsules)``: the vectors' lengths, or a matrix capsule's
      logistic activation.
  """
  poses: jax.Array
  activations: jax.Array


def vector_capsules(poses: jax.Array) -> Capsules:
  """Vector capsules, their lengths as activations."""
  return Capsules(poses, routing_lib.safe_norm(poses))


def vector_vote_weights(in_caps: int, in_dim: int, out_caps: int, out_dim: int) -> tuple:
  """The shape of W_ij for :func:`capsjax.routing.capsule_votes` (u_hat = W_ij u_i)."""
  return (in_caps, out_caps, out_dim, in_dim)


# How votes are formed: name -> (the shape of W from the layer's sizes, the vote function).
VOTES: dict[str, tuple[Callable, Callable]] = {
    "vector": (vector_vote_weights, routing_lib.capsule_votes),
    "matrix": (matrix_vote_weights, routing_lib.matrix_votes),
}


def router_parameters(router: routing_lib.Router, in_caps: int, in_dim: int, out_caps: int,
                      out_dim: int, settings: dict, rngs: nnx.Rngs):
  """The router's own learned parameters for a layer of these sizes, as an ``nnx.Dict`` (None
  when it has none, so that the parameter trees of dynamic routing stay as they were)."""
  specs = router.parameters(in_caps, in_dim, out_caps, out_dim, settings)
  if not specs:
    return None
  return nnx.Dict({name: nnx.Param(spec.create(rngs.params() if spec.needs_key else None))
                   for name, spec in specs.items()})


def parameter_values(router_params) -> dict:
  return {} if router_params is None else {k: p[...] for k, p in router_params.items()}


def split_routing(routing) -> tuple[routing_lib.Router, tuple]:
  """``(router, settings)`` (as :func:`capsjax.routing.chosen` gives them), or ``{"name": ...,
  **settings}`` (the router then looked up by name) -> the router and its settings as sorted
  pairs (hashable, static in NNX's graph definition)."""
  if isinstance(routing, tuple):
    router, settings = routing
  else:
    settings = dict(routing)
    router = routing_lib.get(settings.pop("name"))
  return router, tuple(sorted(settings.items()))


class PrimaryCapsules(nnx.Module):
  """A convolution whose channels are grouped into capsules, then squashed: with the paper's
  settings the 256 channels of a 9x9 stride-2 convolution are 32 capsule types of 8 dimensions;
  on a 6x6 grid that is 1152 capsules.

  ``output_scale`` multiplies the convolution (before its bias) ahead of the squash: 1 in the
  paper; the official code's PrimaryCaps (``conv_slim_capsule`` with one input capsule and one
  routing iteration) couples it with softmax(0) = 1/num_types over the types, i.e. 1/32.
  """

  def __init__(self, in_features: int, num_types: int, dim: int, kernel_size: int,
               stride: int, *, squash_epsilon: float = 0.0, impl: str = "auto",
               compute_dtype=jnp.float32, init_scale: float = 0.0, bias_init: float = 0.0,
               padding: str = "VALID", output_scale: float = 1.0, rngs: nnx.Rngs):
    self.conv = layers.Conv2D(in_features, num_types * dim, kernel_size, stride, impl=impl,
                              compute_dtype=compute_dtype, init_scale=init_scale,
                              bias_init=bias_init, padding=padding, rngs=rngs)
    self.num_types = num_types
    self.dim = dim
    self.squash_epsilon = squash_epsilon
    self.output_scale = output_scale

  def __call__(self, features: jax.Array) -> Capsules:
    """``(batch, h, w, in_features)`` -> vector capsules: poses ``(batch, h'*w'*num_types,
    dim)``, squashed, and their lengths."""
    x = self.conv(features)
    if self.output_scale != 1.0:  # Official code: coupling x conv + bias.
      bias = self.conv.bias[...]
      x = (x - bias) * self.output_scale + bias
    capsules = x.reshape(x.shape[0], -1, self.dim)
    return vector_capsules(routing_lib.squash(capsules, epsilon=self.squash_epsilon))


class ClassCapsules(nnx.Module):
  """Fully connected capsule layer ("DigitCaps"): votes by W_ij, then a router.

  ``votes`` says how a child votes for a parent: ``"vector"``, u_hat_{j|i} = W_ij u_i (Sabour
  et al., Eq. 2; one ``(out_dim, in_dim)`` matrix per (child i, parent j)), or ``"matrix"``,
  V_ij = M_i W_ij (Hinton et al. 2018; one ``p x p`` transform per pair, poses of ``p * p``);
  or a pair ``(weight_shape, vote_fn)`` as in :data:`VOTES` (:class:`GridMatrixVotes`: one
  transform per child type shared over positions, with coordinate addition). Votes are formed
  without tiling W over the batch; the router (:mod:`capsjax.routing`) turns them into parents.

  ``routing``, the one way to choose and configure the router: ``(router, settings)`` or
  ``{"name": ..., **settings}``, with every setting of that router filled in
  (:func:`capsjax.routing.chosen`); None: dynamic routing with the paper's settings.
  """

  def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int, *,
               init_scale: float = 0.1, use_bias: bool = False, bias_init: float = 0.1,
               routing: tuple | dict | None = None, initializer: nnx.Initializer | None = None,
               votes: str | tuple[Callable, Callable] = "vector", routing_norms: bool = False,
               rngs: nnx.Rngs):
    """``initializer``, if given, draws W (shape ``(in_caps, out_caps, out_dim, in_dim)`` for
    vector votes) instead of the truncated normal of std ``init_scale``. ``routing_norms``:
    batch-normalise the parents' activation logits and poses (for routers that give them,
    as variational Bayes routing's authors' code; :class:`RoutingNorms`)."""
    if isinstance(votes, str) and votes not in VOTES:
      raise ValueError(f"ClassCapsules votes must be one of {tuple(VOTES)} or a pair "
                       f"(weight_shape, vote_fn), got {votes!r}.")
    weight_shape, self.vote_fn = VOTES[votes] if isinstance(votes, str) else votes
    if routing is None:
      routing = {"name": "dynamic", **routing_lib.get("dynamic").defaults}
    self.router, self.routing_items = split_routing(routing)  # Static: the graph holds both.
    router = self.router
    if use_bias and not router.uses_parent_bias:
      raise UsageError(f"config.model.class_capsules.use_bias adds a bias to s_j, which router "
                       f"{router.name!r} does not form; leave it False.")
    init = initializer or nnx.initializers.truncated_normal(stddev=init_scale)
    self.weights = nnx.Param(init(rngs.params(), weight_shape(in_caps, in_dim, out_caps, out_dim)))
    self.bias = nnx.data(nnx.Param(jnp.full((out_caps, out_dim), bias_init)) if use_bias else None)
    self.router_params = nnx.data(router_parameters(
        router, in_caps, in_dim, out_caps, out_dim, self.routing_settings, rngs))
    check_routing_norms(routing_norms, router)
    self.norms = nnx.data(RoutingNorms(out_caps, rngs=rngs) if routing_norms else None)

  @property
  def routing_settings(self) -> dict:
    return dict(self.routing_items)

  def votes(self, poses: jax.Array) -> jax.Array:
    """``(batch, in_caps, in_dim)`` -> ``(batch, in_caps, out_caps, out_dim)``."""
    return self.vote_fn(poses, self.weights[...])

  def route(self, capsules: Capsules | jax.Array, *, train: bool = False,
            rng: jax.Array | None = None, diagnostics: bool = False) -> routing_lib.RoutingResult:
    """Child :class:`Capsules` (or bare vector poses ``(batch, in_caps, in_dim)``, their
    lengths the activations) -> :class:`capsjax.routing.RoutingResult` (parents
    ``(batch, out_caps, out_dim)``, their activations or None, diagnostics)."""
    if not isinstance(capsules, Capsules):
      capsules = vector_capsules(capsules)
    params = parameter_values(self.router_params)
    if self.bias is not None:
      params["bias"] = self.bias[...]
    result = self.router.route(
        self.votes(capsules.poses), inputs=capsules.poses, activations=capsules.activations,
        params=params, rng=rng, settings=self.routing_settings, train=train,
        diagnostics=diagnostics)
    if self.norms is None:
      return result
    # The logits batch-normalised before the sigmoid (VB's code).
    activations, poses = self.norms(result.activation_logits, result.capsules, train=train)
    return routing_lib.RoutingResult(poses, activations, result.diagnostics)

  def __call__(self, capsules: Capsules | jax.Array) -> jax.Array:
    """Child capsules -> parents ``(batch, out_caps, out_dim)`` (evaluation)."""
    return self.route(capsules).capsules
