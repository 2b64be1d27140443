"""EM routing (router ``"em"``): Hinton, Sabour & Frosst, ICLR 2018, "Matrix capsules with EM
routing", as the authors' released code has it (google-research/google-research, folder
``capsule_em``, ``em_layers.py``: ``update_em_routing`` and ``update_conv_routing``).

Every parent j is a Gaussian over the votes V_ij (a ``p x p`` pose flattened to D = p^2
numbers, diagonal covariance) whose activation a_j says whether it is present. Each iteration
is an M-step then an E-step (the paper's Procedure 1; what the code computes, with its
constants, for iteration ``t = 0, 1, ...``)::

    lambda_t = lambda (1 - 0.95^(t+1))                        # inverse temperature
    w_ij     = R_ij a_i                                       # R: assignments, a_i: children
    m_j      = sum_i w_ij + eps_mass                          # the parent's "mass"
    mu_j     = 0.9 sum_i w_ij V_ij / m_j + 0.1 mu_j(t-1)      # damped; mu_j(-1) = 0
    var_j    = min_var + sum_i w_ij (V_ij - mu_j)^2 / m_j     # per pose element
    logit_j  = lambda_t (m_j (-sum_h log var_jh - beta_u D (log 2pi + 1)) - 5000 beta_a)
    log p_ij = log sigmoid(logit_j) - (D log 2pi + sum_h log var_jh) / 2
               - sum_h (V_ijh - mu_jh)^2 / (2 var_jh)         # E-step, in log space
    R_ij     = normalise(log p_ij)                            # over the parents of child i

with R starting uniform over the parents (1/out_caps), and a_j = sigmoid(logit_j) of the last
M-step (the last E-step is not needed and not computed). ``normalise`` is a softmax over the
parents for the fully connected class layer; the convolutional layers' grouping is in
:mod:`capsjax.models.conv_capsules`. The paper's text and the code differ; the code is the
default and each difference a setting:

* the paper's cost ``(beta_u + log sigma_h) sum_i r_ij`` becomes ``m_j (beta_u D (log 2pi + 1) +
  sum_h log var_jh)`` (a Gaussian's entropy), and beta_a is scaled by ``activation_bias_scale`` =
  5000 with its sign flipped (``logit = lambda (cost - 5000 beta_a)``);
* lambda grows as ``1 - 0.95^(t+1)`` towards ``inverse_temperature`` (0.01 in the code's
  convolutional layers, 0.01 / 4 at the class layer, this router's default); the paper has none;
* the mean is damped (``mean_damping`` = 0.1 of the previous one, which starts at zero: the
  first mean is 0.9 of the weighted average); the paper has none;
* the variance has a floor ``min_variance`` = 0.0005 (none in the paper), the mass an epsilon
  (``mass_epsilon``: 1e-5 here, 1e-7 in the code's convolutional layers);
* no stop-gradient (the authors: "We do not use stop gradient"); ``stop_gradient`` stops it
  on the assignments between iterations, as many reimplementations do.

The code's ``leaky`` flag calls a ``leaky_routing`` the released code does not define: not offered.

How it runs (one loop, differentiated by JAX; docs/performance.md has the measurements): the
votes are made parent-major, ``(batch, out_caps, positions, children, D)``, and shifted by
their mean over the children, so that every sum over the children and over the pose is a
batched product with the votes or their squares, which XLA runs as a dot forward and, its
transpose, backward (XLA:CPU runs the same sums as strided reductions several times slower,
materialising the broadcast products it reduces)::

    S2 = sum_i w V^2 - 2 mu S1 + mu^2 m0                # S1 = sum_i w V, m0 = sum_i w
    sum_h (V - mu)^2 / (2 var)                           # the E-step's distance, as
       = V^2 . 1/(2 var) - V . mu/var + sum_h mu^2 / (2 var)

with V and mu about the shift (routing is translation-equivariant but for the mass epsilon, which
the mean sees in true coordinates, so the shift is a constant: no gradient); about the shift these
subtract numbers of the spread's size, not the poses'. The autodiff of this loop keeps the votes and
their squares and, per iteration, arrays of 1/D of them. The two forms it replaced (settings
``gradient="autodiff"`` and ``"analytic"`` until 2026-11-29) are ``experiments/em_loop_forms.py``'s.

Numerical safety: the E-step is a log-likelihood, normalised with a softmax, so no density is
exponentiated alone; the variance floor keeps ``log var`` finite for a parent with one child or
identical votes; with all children inactive the mass is ``mass_epsilon`` and the mean 0. Nothing
is clamped beyond the code's floor and epsilons: votes whose spread's squares overflow float32
(above ~1e19) give Inf.

Shapes: the routing runs on votes ``(batch, children, out_caps, positions, D)``: for the class
layer ``positions`` = 1; for a convolutional layer the children are a parent's receptive field
(``in_types x k x k``) and ``positions`` the parents' grid.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from capsjax.config.settings import POSITIVE, Setting, between
from capsjax.routing import em_arithmetic
from capsjax.routing.router import (ConvLayer, ParamSpec, Router, RoutingResult, check_iterations,
                                    iterations_setting)

_FRACTION = between(0, 1, open_high=True)
# ``config.model.routing`` of EM routing: the authors' code's values for the class layer
# (google-research/google-research, capsule_em; the module docstring gives each difference).
SETTINGS = {
    "iterations": iterations_setting(3, "The code's routing_iteration."),
    "stop_gradient": Setting(False, "The authors: \"We do not use stop gradient\"."),
    "inverse_temperature": Setting(0.0025, "lambda: the code's final_beta 0.01, / 4 (the class "
                                   "layer).", check=POSITIVE),
    "temperature_growth": Setting(0.95, "lambda_t = lambda (1 - growth^(t+1)).", check=_FRACTION),
    "mean_damping": Setting(0.1, "mu = 0.9 new + 0.1 previous (the code).", check=_FRACTION),
    "min_variance": Setting(0.0005, "The code's min_var.", check=POSITIVE),
    "mass_epsilon": Setting(1e-5, "Added to sum_i R_ij a_i (the class layer: 1e-5).",
                            check=POSITIVE),
    "activation_bias_scale": Setting(5000.0, "logit = lambda (cost - 5000 beta_a) (the code)."),
    "beta_u_init": Setting(2.0, "The class layer's sigma_biases."),
    "beta_a_init": Setting(1.0, "The class layer's activation_biases."),
}


class MStep(NamedTuple):
  """The parents after an M-step, ``(batch, out_caps, positions[, D])``: ``mean`` and ``Fit``'s."""
  mean: jax.Array
  variance: jax.Array
  logit: jax.Array
  log_normaliser: jax.Array


class EMResult(NamedTuple):
  """EM routing's output: ``poses``, the parents' means ``(batch, out_caps, positions, D)``;
  ``activations`` ``sigmoid(logit)``, ``(batch, out_caps, positions)``; ``diagnostics`` ``{name:
  (batch, iterations)}`` (empty unless asked for): ``activation_mean`` and ``activation_spread``
  (mean and standard deviation of the parents' activations), ``coupling_entropy`` (nats per child,
  of the assignments R the M-step used), ``log_sigma`` (mean ``log sigma`` of the parents)."""
  poses: jax.Array
  activations: jax.Array
  diagnostics: dict


def parent_major(x: jax.Array) -> jax.Array:
  """``(batch, children, out_caps, positions, ...)`` -> ``(batch, out_caps, positions,
  children, ...)``: the layout in which a sum over the children is a batched product."""
  return jnp.moveaxis(x, 1, 3)


def child_major(x: jax.Array) -> jax.Array:
  """The inverse of :func:`parent_major` (the layout of the votes and of ``normalise``)."""
  return jnp.moveaxis(x, 3, 1)


def over_children(weights: jax.Array, votes: jax.Array) -> jax.Array:
  """``sum_n weights[..., n] votes[..., n, :]``: ``(b, o, p, n)``, ``(b, o, p, n, D)`` ->
  ``(b, o, p, D)``."""
  return jnp.einsum("bopn,bopnd->bopd", weights, votes)


def against_parents(votes: jax.Array, parents: jax.Array) -> jax.Array:
  """``sum_h votes[..., n, h] parents[..., h]``: ``(b, o, p, n, D)``, ``(b, o, p, D)`` ->
  ``(b, o, p, n)``."""
  return jnp.einsum("bopnd,bopd->bopn", votes, parents)


class Votes(NamedTuple):
  """The votes as the loop reads them, and their squares: parent-major ``(batch, out_caps,
  positions, children, D)``, about ``shift`` ``(batch, out_caps, positions, D)`` (a constant:
  their mean over the children)."""
  votes: jax.Array
  squares: jax.Array
  shift: jax.Array

  @classmethod
  def of(cls, votes: jax.Array) -> "Votes":
    """From the layer's votes ``(batch, children, out_caps, positions, D)``."""
    shift = jax.lax.stop_gradient(jnp.mean(votes, axis=1))
    shifted = parent_major(votes) - shift[..., None, :]
    return cls(shifted, jnp.square(shifted), shift)


def m_step(votes: Votes, weights: jax.Array, previous_mean: jax.Array, beta_u: jax.Array,
           beta_a: jax.Array, inverse_temperature, settings: dict) -> MStep:
  """The M-step: each parent's Gaussian and activation from its weighted votes (the formulas
  in :mod:`capsjax.routing.em_arithmetic`), ``mean`` in true coordinates. ``weights``: ``R_ij
  a_i``, parent-major ``(batch, out_caps, positions, children)``; ``previous_mean``: the last
  iteration's (zeros), parent-sized; ``beta_u``, ``beta_a``: ``(out_caps,)``;
  ``inverse_temperature``: lambda_t, a scalar; ``settings``: EM's (:data:`SETTINGS`)."""
  m0 = jnp.sum(weights, axis=-1)                                            # (b, o, p)
  s1 = over_children(weights, votes.votes)                                 # about the shift
  mean = em_arithmetic.damped_mean(s1 + votes.shift * m0[..., None], m0, previous_mean, settings)
  centre = mean - votes.shift
  # S2 (module docstring), clamped: rounding can make the difference of a near-zero spread < 0.
  s2 = jnp.maximum(over_children(weights, votes.squares) - 2.0 * centre * s1
                   + jnp.square(centre) * m0[..., None], 0.0)
  return MStep(mean, *em_arithmetic.fit(s2, m0, beta_u, beta_a, inverse_temperature, settings))


def log_likelihood(votes: Votes, parents: MStep) -> jax.Array:
  """The E-step's unnormalised log assignment ``log a_j + log N(V_ij; mu_j, var_j)``, parent-major
  ``(batch, out_caps, positions, children)``, its distance as products (module docstring)."""
  inverse_two_var = 0.5 / parents.variance
  centre = parents.mean - votes.shift
  distance = (against_parents(votes.squares, inverse_two_var)
              - against_parents(votes.votes, 2.0 * centre * inverse_two_var)
              + jnp.sum(jnp.square(centre) * inverse_two_var, axis=-1)[..., None])
  return parents.log_normaliser[..., None] - distance


def assignment_entropy(assignments: jax.Array, num_children: int) -> jax.Array:
  """``-sum R log R`` over every (child slot, parent) per example, divided by the number of
  children: the mean entropy of a child's assignments, ``(batch,)`` (either layout)."""
  r = assignments
  terms = jnp.where(r > 0, r * jnp.log(jnp.where(r > 0, r, 1.0)), 0.0)
  return -jnp.sum(terms.reshape(r.shape[0], -1), axis=1) / num_children


def em_routing(votes: jax.Array, activations: jax.Array, beta_u: jax.Array, beta_a: jax.Array,
               *, settings: dict, normalise: Callable[[jax.Array], jax.Array],
               initial: jax.Array | float | None = None, num_children: int | None = None,
               diagnostics: bool = False) -> EMResult:
  """EM routing of ``votes`` (the module docstring has the equations and the layout).

  Args:
    votes: ``(batch, children, out_caps, positions, D)``.
    activations: the children's a_i, broadcastable to ``(batch, children, out_caps, positions)``
      (e.g. ``(batch, children, 1, positions)``).
    beta_u, beta_a: ``(out_caps,)``.
    settings: the router's (:data:`SETTINGS`).
    normalise: ``log p -> R`` (child-major), the E-step's normalisation over each child's parents.
    initial: the first assignments R (default ``1 / out_caps``, the code's ``softmax`` of zeros
      over output types), in ``normalise``'s layout.
    num_children: the children the assignments cover, for ``coupling_entropy`` (default: all).
    diagnostics: also return the per-iteration diagnostics.
  """
  iterations = settings["iterations"]
  check_iterations(iterations)
  batch, children, out_caps, positions, d = votes.shape
  lambdas = em_arithmetic.schedule(settings, votes.dtype)
  assignments = parent_major(jnp.broadcast_to(
      1.0 / out_caps if initial is None else initial,
      (batch, children, out_caps, positions)).astype(votes.dtype))
  activations = parent_major(jnp.broadcast_to(
      activations, activations.shape[:1] + votes.shape[1:2] + activations.shape[2:]))
  votes = Votes.of(votes)
  mean = jnp.zeros(votes.shift.shape, votes.votes.dtype)
  rows = []

  def measure(assignments, parents):
    # Measurements, not objectives: no gradient (the std's is NaN where all parents agree).
    assignments, parents = jax.lax.stop_gradient((assignments, parents))
    a = jax.nn.sigmoid(parents.logit).reshape(batch, -1)
    rows.append(jnp.stack([jnp.mean(a, axis=1), jnp.std(a, axis=1),
                           assignment_entropy(assignments, num_children or children),
                           0.5 * jnp.mean(jnp.log(parents.variance).reshape(batch, -1), axis=1)]))

  # Unrolled: the iterations are few (what autodiff keeps of each: the module docstring).
  for t in range(iterations):
    parents = m_step(votes, assignments * activations, mean, beta_u, beta_a, lambdas[t], settings)
    if diagnostics:
      measure(assignments, parents)
    if t < iterations - 1:   # The last E-step is not needed.
      assignments = parent_major(normalise(child_major(log_likelihood(votes, parents))))
      if settings["stop_gradient"]:
        assignments = jax.lax.stop_gradient(assignments)
      mean = parents.mean
  found = {}
  if diagnostics:
    names = ("activation_mean", "activation_spread", "coupling_entropy", "log_sigma")
    found = {name: jnp.stack([row[k] for row in rows], axis=1) for k, name in enumerate(names)}
  return EMResult(parents.mean, jax.nn.sigmoid(parents.logit), found)


def parameters(in_caps: int, in_dim: int, out_caps: int, out_dim: int, settings: dict) -> dict:
  """beta_u and beta_a, one per parent capsule (the code's sigma_biases, activation_biases),
  from ``settings["beta_u_init"]`` and ``["beta_a_init"]`` (also VB routing's)."""
  del in_caps, in_dim, out_dim
  return {"beta_u": ParamSpec((out_caps,), float(settings["beta_u_init"])),
          "beta_a": ParamSpec((out_caps,), float(settings["beta_a_init"]))}


def route(votes, *, inputs=None, activations, params, rng=None, settings, train=False,
          diagnostics=False) -> RoutingResult:
  """The router interface (:mod:`capsjax.routing`): fully connected EM routing, the assignments
  of each child a softmax over the parents (the code's ``update_em_routing``), the parents' poses
  their means. A vote's D numbers are a pose's (16 for 4x4; vector capsules' votes route the same
  way, each element a Gaussian dimension, their lengths the a_i); ``params``: beta_u, beta_a."""
  del inputs, rng, train
  result = em_routing(votes[:, :, :, None, :], activations[:, :, None, None], params["beta_u"],
                      params["beta_a"], settings=settings, diagnostics=diagnostics,
                      normalise=lambda log_p: jax.nn.softmax(log_p, axis=2))
  return RoutingResult(result.poses[:, :, 0], result.activations[:, :, 0], result.diagnostics)


def route_layer(votes, *, activations, params, settings, layer: ConvLayer,
                diagnostics=False) -> RoutingResult:
  """A convolutional layer routed as a whole (:attr:`capsjax.routing.Router.route_layer`):
  the E-step normalised over each child's parents as ``layer.normalisation`` says (the code's
  ``"code"``, with its ``mass_epsilon`` in the denominator); with ``"child"`` the first
  assignments too, as the code starts from."""
  normalise = layer.normaliser(layer.normalisation, settings["mass_epsilon"])
  initial = (normalise(jnp.zeros(votes.shape[:4], votes.dtype))
             if layer.normalisation == "child" else None)
  result = em_routing(votes, activations, params["beta_u"], params["beta_a"], settings=settings,
                      normalise=normalise, initial=initial, num_children=layer.num_children,
                      diagnostics=diagnostics)
  return RoutingResult(result.poses, result.activations, result.diagnostics)


ROUTER = Router(name="em", settings=SETTINGS, route=route, parameters=parameters,
                yields_activations=True, squashes=False, route_layer=route_layer,
                conv_layer_settings=("inverse_temperature", "mass_epsilon", "beta_u_init",
                                     "beta_a_init"))
