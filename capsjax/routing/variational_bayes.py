"""Variational Bayes routing: Ribeiro, Leontidis & Kollias, AAAI 2020, "Capsule routing via
variational Bayes" (arXiv 1905.11455), as the authors' released code has it
(github.com/fabio-deep/Variational-Capsule-Routing, ``src/vb_routing.py``,
``VariationalBayesRouting2d`` with ``cov='diag'``).

The parents are a variational Gaussian mixture over the votes (Bishop, PRML Sec. 10.2): a
Dirichlet over the mixing weights pi, a Normal-Wishart (diagonal) over each parent's mean mu_j
and precision Lambda_j. Unlike EM routing's point estimates, the precision has a posterior, so a
parent with few or identical votes does not collapse to zero variance. With priors alpha0,
kappa0, nu0, Psi0 = psi0 I (mean prior m0 = 0), iteration ``t`` is an update of the
parameters' posteriors then of the assignments::

    w_ij      = R_ij a_i ;  R_j = sum_i w_ij                   # R starts at 1 / out_caps
    alpha_j   = alpha0 + R_j ; kappa_j = kappa0 + R_j ; nu_j = nu0 + R_j
    mu_j      = sum_i w_ij V_ij / R_j ;  m_j = R_j mu_j / kappa_j
    S_j       = sum_i w_ij (V_ij - mu_j)^2                     # per pose element
    1/Psi_j   = 1/psi0 + S_j + kappa0 R_j / kappa_j mu_j^2     # diagonal
    E ln pi_j     = digamma(alpha_j) - digamma(sum_j' alpha_j')
    E ln|Lam_j|   = sum_{k<D} digamma((nu_j - k) / 2) + D ln 2 + ln|Psi_j|
    ln p_ij   = (E ln|Lam_j| - D ln(2 pi) - D / kappa_j - nu_j sum_h Psi_jh (V_ijh - m_jh)^2) / 2
    p_ij      = exp(E ln pi_j + ln p_ij)
    R_ij      = p_ij / max(sum_j p_ij, 1e-11)                  # the code (assignments="code")

and, after the last parameter update (no E-step), each parent's activation logit from its
posterior entropy::

    H_j   = D ln(2 pi e) / 2 - E ln|Lam_j| / 2
    a_j   = beta_a - (exp(E ln pi_j) H_j + beta_u)

The code then batch-normalises ``a_j`` (no affine parameters) before a sigmoid, and the poses
``m_j`` as well: that is state, which ``em_capsnet``'s capsule layers keep and a router does not
(on other backbones the logits go to the sigmoid as they are).

Where the code departs from the textbook update (each a setting, the code's the default):

* ``assignments``: the code at its HEAD (9fee27e; since 9908079, 19 Feb 2020), ``"code"``:
  ``E ln pi_j`` in the numerator and a linear normaliser clamped from below
  (``torch.clamp(sum_j p_ij, min=1e-11)``, ``normaliser_floor``): a softmax wherever the sum
  is above the floor, but where every ``p_ij`` of a child is tiny (common with 16-dimensional
  votes: ``exp`` of a log-density far below zero) its ``R_ij`` shrink towards 0 and its
  parents fall back towards their priors. ``"first_commits"``: the code's first commits
  (826f731..1482128, 3-7 Feb 2020), ``ln R_ij = ln p_ij - logsumexp_j (E ln pi_j + ln p_ij)``,
  which leaves ``E ln pi_j`` out of the numerator (``sum_j exp(E ln pi_j) R_ij = 1``).
  ``"textbook"``: ``R_ij = softmax_j(E ln pi_j + ln p_ij)`` (Bishop Eq. 10.46-10.49).
* in a convolutional layer (:mod:`capsjax.models.conv_capsules`), ``conv_normalisation``: the
  code at HEAD sums ``p_ij`` of a child over every parent whose receptive field holds it
  (all positions and output types; ``"child"``, its ``conv_transpose2d`` and ``unfold``);
  the first commits routed each receptive field on its own (``"patch"``). The fully
  connected class layer has one receptive field, where both are the same.
* the code fixes ``m0 = 0`` and drops ``kappa0`` from the ``1/Psi_j`` update ("priors removed
  for faster computation"), which equals the full update only for ``kappa0 = 1`` (its value);
  here the full update is used, so any ``prior_kappa`` is right and the code's value gives the
  code's numbers. Likewise the code adds ``Psi0`` where the update adds its inverse: the same
  for its ``Psi0 = I``; here ``1 / prior_psi``.
* the code divides by ``R_j`` with no epsilon (NaN when every child of a parent is inactive);
  here ``mass_epsilon`` (1e-7) is added to ``R_j`` where it divides, and only there.

Shapes as :mod:`capsjax.routing.em`: votes ``(batch, children, out_caps, positions, D)``, each
child's R normalised over ``out_caps`` at its position unless the layer passes ``child_sum``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import digamma

from capsjax.config.settings import POSITIVE, Setting, above, one_of
from capsjax.routing.router import (ConvLayer, Router, RoutingResult, check_iterations,
                                    iterations_setting)
from capsjax.routing.em import parameters
from capsjax.routing.em_arithmetic import LOG_2PI

ASSIGNMENTS = ("code", "first_commits", "textbook")
CONV_NORMALISATIONS = ("child", "patch")

# ``config.model.routing`` of VB routing: the authors' code's values (its network, ``capsnet.py``,
# at HEAD of fabio-deep/Variational-Capsule-Routing; the module docstring gives each difference).
SETTINGS = {
    "iterations": iterations_setting(3, "The code's routing_iter (its default)."),
    "stop_gradient": Setting(False, "True: no gradient through the intermediate iterations "
                             "(the code has none)."),
    "assignments": Setting("code", "HEAD's; \"first_commits\" | \"textbook\" (module "
                           "docstring).", check=one_of(*ASSIGNMENTS)),
    "normaliser_floor": Setting(1e-11, "The code's clamp of sum_j p_ij (HEAD; 9908079: 1e-8).",
                                check=POSITIVE),
    "conv_normalisation": Setting("child", "Over every parent of a child (HEAD) | \"patch\" "
                                  "(the first commits).", check=one_of(*CONV_NORMALISATIONS)),
    "prior_alpha": Setting(1.0, "Dirichlet alpha0.", check=POSITIVE),
    "prior_kappa": Setting(1.0, "Gaussian precision scaling kappa0.", check=POSITIVE),
    "prior_nu_offset": Setting(1.0, "Wishart degrees of freedom nu0 = D + this (the Wishart "
                               "needs nu0 > D - 1).", check=above(-1)),
    "prior_psi": Setting(1.0, "Wishart scale Psi0 = prior_psi x identity.", check=POSITIVE),
    "mass_epsilon": Setting(1e-7, "Added to R_j where the code divides by it (not in the "
                            "code).", check=POSITIVE),
    "beta_u_init": Setting(0.0, "beta_u's initial value."),
    "beta_a_init": Setting(0.0, "beta_a's initial value."),
}


class Posterior(NamedTuple):
  """The parents' posteriors after a parameter update, each ``(batch, out_caps, positions
  [, D])``: ``mean`` m_j, ``precision_scale`` Psi_j (diagonal), ``kappa``, ``nu``,
  ``log_mixing`` E ln pi_j and ``log_det_precision`` E ln|Lambda_j|."""
  mean: jax.Array
  precision_scale: jax.Array
  kappa: jax.Array
  nu: jax.Array
  log_mixing: jax.Array
  log_det_precision: jax.Array


class VBResult(NamedTuple):
  """poses ``m_j (batch, out_caps, positions, D)``; ``activation_logits`` ``beta_a - (exp(E ln
  pi_j) H_j + beta_u)``, ``(batch, out_caps, positions)`` (before the layer's batch norm and
  sigmoid); diagnostics ``{name: (batch, iterations)}`` if asked for: ``coupling_entropy`` (nats,
  the mean over routed children of the entropy of their assignments normalised over the parents;
  a convolutional layer routes each receptive-field copy of a child), ``log_sigma`` (mean of
  ``-ln(nu_j Psi_j) / 2``, the log standard deviation of the expected precision),
  ``mixing_entropy`` (of ``E[pi]`` per position)."""
  poses: jax.Array
  activation_logits: jax.Array
  diagnostics: dict


def expected_log_det_precision(nu: jax.Array, precision_scale: jax.Array) -> jax.Array:
  """``E ln|Lambda| = sum_{k<D} digamma((nu - k)/2) + D ln 2 + sum_h ln Psi_h`` (Bishop Eq.
  10.65, diagonal Psi)."""
  d = precision_scale.shape[-1]
  k = jnp.arange(d, dtype=nu.dtype)
  return (jnp.sum(digamma(0.5 * (nu[..., None] - k)), axis=-1) + d * math.log(2.0)
          + jnp.sum(jnp.log(precision_scale), axis=-1))


def update_posteriors(votes: jax.Array, weights: jax.Array, settings: dict) -> Posterior:
  """The parameter update from ``weights`` ``R_ij a_i (batch, children, out_caps,
  positions)`` and ``votes (batch, children, out_caps, positions, D)``."""
  d = votes.shape[-1]
  mass = jnp.sum(weights, axis=1)                                           # R_j
  alpha = settings["prior_alpha"] + mass
  kappa = settings["prior_kappa"] + mass
  nu = d + settings["prior_nu_offset"] + mass
  w = weights[..., None]
  average = jnp.sum(w * votes, axis=1) / (mass + settings["mass_epsilon"])[..., None]
  scatter = jnp.sum(w * jnp.square(votes - average[:, None]), axis=1)       # S_j
  mean = (mass / kappa)[..., None] * average                                 # m0 = 0
  inverse_scale = (1.0 / settings["prior_psi"] + scatter
                   + (settings["prior_kappa"] * mass / kappa)[..., None] * jnp.square(average))
  precision_scale = 1.0 / inverse_scale
  log_mixing = digamma(alpha) - digamma(jnp.sum(alpha, axis=1, keepdims=True))
  return Posterior(mean, precision_scale, kappa, nu, log_mixing,
                   expected_log_det_precision(nu, precision_scale))


def log_predictive(votes: jax.Array, q: Posterior) -> jax.Array:
  """``ln p_ij`` (the module docstring), ``(batch, children, out_caps, positions)``."""
  d = votes.shape[-1]
  quadratic = jnp.sum(q.precision_scale[:, None] * jnp.square(votes - q.mean[:, None]), axis=-1)
  expected = d / q.kappa[:, None] + q.nu[:, None] * quadratic
  return 0.5 * (q.log_det_precision[:, None] - d * LOG_2PI - expected)


def assignments_from(log_p: jax.Array, q: Posterior, mode: str, floor: float = 1e-11,
                     child_sum=None) -> jax.Array:
  """New assignments ``R (batch, children, out_caps, positions)`` by the rule ``mode``
  (module docstring). ``child_sum`` (``"code"`` only): ``p -> sum of p over every parent of
  each entry's child``, same shape; default the sum over ``out_caps``."""
  joint = q.log_mixing[:, None] + log_p
  if mode == "textbook":
    return jax.nn.softmax(joint, axis=2)
  if mode == "first_commits":
    return jnp.exp(log_p - jax.nn.logsumexp(joint, axis=2, keepdims=True))
  p = jnp.exp(joint)  # Not shifted by a max: where it underflows, the clamp binds (code).
  total = jnp.sum(p, axis=2, keepdims=True) if child_sum is None else child_sum(p)
  return p / jnp.maximum(total, floor)


def activation_logits(q: Posterior, beta_u: jax.Array, beta_a: jax.Array) -> jax.Array:
  """``beta_a - (exp(E ln pi_j) H_j + beta_u)``, ``H_j`` the Gaussian's expected entropy."""
  d = q.mean.shape[-1]
  entropy = 0.5 * d * (LOG_2PI + 1.0) - 0.5 * q.log_det_precision
  return beta_a[:, None] - (jnp.exp(q.log_mixing) * entropy + beta_u[:, None])


def vb_routing(votes: jax.Array, activations: jax.Array, beta_u: jax.Array, beta_a: jax.Array,
               *, settings: dict, diagnostics: bool = False, child_sum=None) -> VBResult:
  """Variational Bayes routing, arguments as :func:`capsjax.routing.em.em_routing`'s; ``child_sum``:
  a convolutional layer's sum of ``p_ij`` over each child's parents (:func:`assignments_from`)."""
  iterations = settings["iterations"]
  check_iterations(iterations)
  batch, children, out_caps, positions, _ = votes.shape
  assignments = jnp.full((batch, children, out_caps, positions), 1.0 / out_caps, votes.dtype)
  measured = jnp.zeros((3, iterations, batch), votes.dtype)

  def measure(measured, t, assignments, q):
    if not diagnostics:
      return measured
    assignments, q = jax.lax.stop_gradient((assignments, q))
    # Over the parents of each routed child (a receptive-field copy in a convolutional layer),
    # of R normalised to sum to one (the code's rules need not: a child whose p_ij all
    # underflow has R = 0 and no entropy).
    total = jnp.sum(assignments, axis=2, keepdims=True)
    r = assignments / jnp.where(total > 0, total, 1.0)
    coupling = -jnp.sum(jnp.where(r > 0, r * jnp.log(jnp.where(r > 0, r, 1.0)), 0.0),
                        axis=(1, 2, 3)) / (children * positions)
    log_sigma = -0.5 * jnp.log(q.nu[..., None] * q.precision_scale)
    pi = jnp.exp(q.log_mixing)
    pi = pi / jnp.sum(pi, axis=1, keepdims=True)
    mixing = -jnp.mean(jnp.sum(pi * jnp.log(pi), axis=1), axis=-1)
    row = jnp.stack([coupling, jnp.mean(log_sigma.reshape(batch, -1), axis=1), mixing])
    return measured.at[:, t].set(row)

  def iteration(t, carry):
    assignments, measured = carry
    q = update_posteriors(votes, assignments * activations, settings)
    measured = measure(measured, t, assignments, q)
    assignments = assignments_from(log_predictive(votes, q), q, settings["assignments"],
                                   settings["normaliser_floor"], child_sum)
    if settings["stop_gradient"]:
      assignments = jax.lax.stop_gradient(assignments)
    return assignments, measured

  # The backward pass recomputes each iteration instead of storing votes-sized temporaries.
  iteration = jax.checkpoint(iteration, policy=jax.checkpoint_policies.nothing_saveable)
  assignments, measured = jax.lax.fori_loop(0, iterations - 1, iteration, (assignments, measured))
  q = update_posteriors(votes, assignments * activations, settings)
  found = {}
  if diagnostics:
    measured = measure(measured, iterations - 1, assignments, q)
    names = ("coupling_entropy", "log_sigma", "mixing_entropy")
    found = {name: measured[k].T for k, name in enumerate(names)}
  return VBResult(q.mean, activation_logits(q, beta_u, beta_a), found)


def route(votes, *, inputs=None, activations, params, rng=None, settings, train=False,
          diagnostics=False) -> RoutingResult:
  """The router interface (:mod:`capsjax.routing`): fully connected VB routing, votes and
  ``params`` as under ``em`` (:func:`capsjax.routing.em.route`). Parent poses ``m_j`` and
  activations ``sigmoid(a_j)``, without the code's batch norms (state: module docstring)."""
  del inputs, rng, train
  result = vb_routing(votes[:, :, :, None, :], activations[:, :, None, None], params["beta_u"],
                      params["beta_a"], settings=settings, diagnostics=diagnostics)
  logits = result.activation_logits[:, :, 0]
  return RoutingResult(result.poses[:, :, 0], jax.nn.sigmoid(logits), result.diagnostics,
                       activation_logits=logits)


def route_layer(votes, *, activations, params, settings, layer: ConvLayer,
                diagnostics=False) -> RoutingResult:
  """A convolutional layer routed as a whole (:attr:`capsjax.routing.Router.route_layer`), by
  ``conv_normalisation`` (module docstring; ``"child"``: ``layer.child_sum``)."""
  child_sum = layer.child_sum if settings["conv_normalisation"] == "child" else None
  result = vb_routing(votes, activations, params["beta_u"], params["beta_a"], settings=settings,
                      diagnostics=diagnostics, child_sum=child_sum)
  return RoutingResult(result.poses, jax.nn.sigmoid(result.activation_logits),
                       result.diagnostics, activation_logits=result.activation_logits)


# beta_u and beta_a per parent, as EM routing's (here initialised to 0, the VB code's).
ROUTER = Router(name="variational_bayes", settings=SETTINGS, route=route, parameters=parameters,
                yields_activations=True, squashes=False, route_layer=route_layer,
                activation_logits=True, parent_batch_norms=True)
