"""What every router shares: norms, the two squashes, the votes, the router interface.

Pure JAX, no Flax. Shapes: votes ``(batch, in_caps, out_caps, out_dim)``, coupling
``(batch, in_caps, out_caps)``, parent capsules ``(batch, out_caps, out_dim)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from capsjax.config.settings import NON_NEGATIVE, Setting, at_least, declared
from capsjax.common import checks


def safe_norm(x: jax.Array, axis: int = -1, epsilon: float = 0.0,
              keepdims: bool = False) -> jax.Array:
  """Euclidean norm ``sqrt(sum(x**2) + epsilon)`` with a finite gradient at 0.

  ``jnp.linalg.norm`` has a NaN gradient at the zero vector (0/0). Here the
  square root only ever sees positive numbers, and the zero vector gets norm
  ``sqrt(epsilon)`` and gradient 0 (the subgradient of minimum norm).

  Args:
    x: any array.
    axis: the vector axis.
    epsilon: added under the square root; 0 gives the exact norm.
    keepdims: keep the reduced axis with size 1.

  Returns:
    The norms, ``x``'s shape without ``axis`` (or with size 1 there).
  """
  squared = jnp.sum(jnp.square(x), axis=axis, keepdims=keepdims) + epsilon
  positive = squared > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def squash(s: jax.Array, axis: int = -1, epsilon: float = 0.0) -> jax.Array:
  """The squashing non-linearity, Eq. 1: ``v = |s|^2/(1+|s|^2) * s/|s|``.

  Short vectors shrink to almost zero length and long vectors to a length
  just below 1; the direction is kept.

  Args:
    s: capsule pre-activations, vectors along ``axis``.
    axis: the capsule-vector axis.
    epsilon: added under the square root of ``|s|`` in the denominator, as many
      public implementations do (1e-7, 1e-8, 1e-9 are common). The paper's
      Eq. 1 has none, which is the default 0; the gradient is finite at the
      zero vector either way.

  Returns:
    ``v`` with the shape of ``s``; ``|v| < 1``.
  """
  squared = jnp.sum(jnp.square(s), axis=axis, keepdims=True)
  norm = safe_norm(s, axis=axis, epsilon=epsilon, keepdims=True)
  scale = squared / (1.0 + squared) / jnp.where(norm > 0, norm, 1.0)
  return scale * s


def exp_squash(s: jax.Array, axis: int = -1) -> jax.Array:
  """Efficient-CapsNet's squash (Mazzia et al. 2021, Eq. 5): ``v = (1 - e^{-|s|}) s/|s|``.

  Steeper near zero than Eq. 1. Written as ``-expm1(-|s|)/|s| * s``, whose factor tends to 1 at
  the zero vector, so value and gradient are finite there without the reference code's fuzz
  factor (``eps = 1e-20`` in ``(1 - 1/(e^{|s|} + eps)) s/(|s| + eps)``).

  Returns:
    ``v`` with the shape of ``s``; ``|v| < 1``.
  """
  norm = safe_norm(s, axis=axis, keepdims=True)
  positive = norm > 0
  safe = jnp.where(positive, norm, 1.0)
  return jnp.where(positive, -jnp.expm1(-safe) / safe, 1.0) * s


@jax.custom_vjp
def capsule_votes(capsules: jax.Array, weights: jax.Array) -> jax.Array:
  """Prediction vectors u_hat_{j|i} = W_ij u_i (paper, Eq. 2), W not tiled over the batch.

  Args:
    capsules: child capsules u_i, ``(batch, in_caps, in_dim)``.
    weights: W_ij, ``(in_caps, out_caps, out_dim, in_dim)``.

  Returns:
    votes, ``(batch, in_caps, out_caps, out_dim)``.
  """
  return jnp.einsum("bik,ijdk->bijd", capsules, weights)


def _capsule_votes_fwd(capsules, weights):
  return capsule_votes(capsules, weights), (capsules, weights)


def _capsule_votes_bwd(residuals, votes_grad):
  # Both gradients are matmuls batched over children i. Written with the vote
  # gradient child-major, (in_caps, batch, out_caps*out_dim), XLA:CPU transposes
  # it once; from autodiff of the einsum it made two transposed copies
  # (docs/performance.md has the timings).
  capsules, weights = residuals
  in_caps, out_caps, out_dim, in_dim = weights.shape
  grad = jnp.transpose(votes_grad, (1, 0, 2, 3)).reshape(in_caps, -1, out_caps * out_dim)
  capsules_grad = jnp.einsum("ibe,iek->bik", grad,
                             weights.reshape(in_caps, out_caps * out_dim, in_dim))
  weights_grad = jnp.einsum("ibk,ibe->iek", jnp.transpose(capsules, (1, 0, 2)), grad)
  return capsules_grad, weights_grad.reshape(weights.shape)


capsule_votes.defvjp(_capsule_votes_fwd, _capsule_votes_bwd)


def matrix_votes(poses: jax.Array, weights: jax.Array) -> jax.Array:
  """Votes of matrix capsules, V_ij = M_i W_ij (Hinton, Sabour & Frosst 2018, Sec. 2): each
  child's ``p x p`` pose matrix times a learned ``p x p`` transform per (child, parent).

  Args:
    poses: child poses M_i flattened, ``(batch, in_caps, p * p)`` (p = 4 in the paper).
    weights: W_ij, ``(in_caps, out_caps, p, p)``.

  Returns:
    votes flattened, ``(batch, in_caps, out_caps, p * p)``: every router takes them as it
    takes vector votes.
  """
  batch, in_caps, _ = poses.shape
  _, out_caps, p, _ = weights.shape
  matrices = poses.reshape(batch, in_caps, p, p)
  votes = jnp.einsum("bipq,ijqr->bijpr", matrices, weights)
  return votes.reshape(batch, in_caps, out_caps, p * p)


def coupling_statistics(coupling: jax.Array, axis: int = 2) -> dict[str, jax.Array]:
  """Per example: the mean entropy (nats) of the coupling distributions along ``axis`` and
  the mean of their largest coefficient.

  Args:
    coupling: ``(batch, in_caps, out_caps)``, each distribution along ``axis``.

  Returns:
    A dict, ``{"coupling_entropy": (batch,), "coupling_max": (batch,)}``. Uniform over n
    parents gives ``log n`` and ``1/n``; a one-hot coupling 0 and 1.
  """
  c = coupling
  entropy = -jnp.sum(jnp.where(c > 0, c * jnp.log(jnp.where(c > 0, c, 1.0)), 0.0), axis=axis)
  peak = jnp.max(c, axis=axis)
  return {"coupling_entropy": jnp.mean(entropy.reshape(c.shape[0], -1), axis=1),
          "coupling_max": jnp.mean(peak.reshape(c.shape[0], -1), axis=1)}


def coupled_parents(votes: jax.Array, coupling: jax.Array, *, bias: jax.Array | None = None,
                    squash_epsilon: float = 0.0, diagnostics: bool = False):
  """One pass without agreement: ``v_j = squash(sum_i c_ij u_hat_{j|i} + bias)`` (Eq. 1-2).

  Args:
    votes: ``(batch, in_caps, out_caps, out_dim)``; coupling ``(batch, in_caps, out_caps)``.
    bias: optional ``(out_caps, out_dim)`` on s_j.

  Returns:
    A :class:`RoutingResult`; its diagnostics (one iteration, when asked for):
    ``coupling_entropy``, ``coupling_max``, ``preactivation_norm`` (mean |s_j|).
  """
  preactivation = jnp.einsum("bijd,bij->bjd", votes, coupling)
  if bias is not None:
    preactivation = preactivation + bias
  capsules = squash(preactivation, epsilon=squash_epsilon)
  if not diagnostics:
    return RoutingResult(capsules, None, {})
  measured = coupling_statistics(coupling)
  measured["preactivation_norm"] = jnp.mean(safe_norm(preactivation), axis=1)
  return RoutingResult(capsules, None, {k: v[:, None] for k, v in measured.items()})


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
    diagnostics: ``{name: (batch, iterations)}`` per-example, per-iteration measurements
      (coupling entropy, logit or pose change, ...), only when asked for; else ``{}``.
    activation_logits: for routers whose activations are ``sigmoid`` of logits and that say
      so (:attr:`Router.activation_logits`), the logits (``activations``' shape), which a
      layer's batch norms (VB's authors' code) normalise before the sigmoid; else None.
  """
  capsules: jax.Array
  activations: jax.Array | None
  diagnostics: dict[str, jax.Array]
  activation_logits: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class ConvLayer:
  """A convolutional capsule layer as a router that routes it as a whole sees it
  (:attr:`Router.route_layer`); built by the layer (``capsjax.models.conv_capsules``), so that
  the router needs nothing from the models.

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
    init: ``"zeros"``, ``"ones"``, a number (every entry that constant), or a callable
      ``(key, shape) -> array``. A layer draws a key for each parameter but a number's (so
      that EM's and VB's constant betas in a convolutional capsule layer leave the draws of
      the layers after it as they were).
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

  Its ``name`` is what it is: two routers of one name are equal and hash alike, so that a
  layer holds its router itself, static in NNX's graph definition (its ``settings`` table is
  not hashable).

  Attributes:
    name: its registered name (``config.model.routing.name``).
    settings: each setting it reads, declared (``{key: capsjax.config.settings.Setting}``:
      default, meaning, range; a plain value is taken as the default): what
      ``config.model.routing`` may set for it.
    route: ``route(votes, *, inputs, activations, params, rng, settings, train,
      diagnostics) -> RoutingResult``; see :mod:`capsjax.routing`.
    parameters: ``parameters(in_caps, in_dim, out_caps, out_dim, settings) ->
      {name: ParamSpec}``, the learned parameters it needs (most need none).
    check: ``check(settings)`` raises UsageError naming a setting whose value cannot work
      with the others (each setting's own range is its declaration's).
    uses_parent_bias: whether a bias on the parents' s_j (``model.class_capsules.use_bias``)
      means anything to it.
    yields_activations: whether it computes the parents' activations (else their lengths
      are the class scores).
    squashes: whether the parents' lengths are squashed into [0, 1) (then their saturation is
      measured and watched).
    route_layer: for routers that route a convolutional layer as a whole (a child shared by
      the receptive fields it is in: EM, VB), ``route_layer(votes, *, activations, params,
      settings, layer, diagnostics) -> RoutingResult``: ``votes`` ``(batch, children,
      out_caps, positions, D)`` (children: the receptive field's), ``activations`` ``(batch,
      children, 1, positions)``, ``layer`` a :class:`ConvLayer`; parents ``(batch, out_caps,
      positions, D)``, activations ``(batch, out_caps, positions)``. None: the layer routes
      each receptive field on its own with ``route``.
    activation_logits: whether its results carry ``activation_logits``, so that a layer may
      batch-normalise them before the sigmoid (``routing_norms``).
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
