"""EM routing with its backward pass written out (EM's setting ``gradient="analytic"``, the
default): the same forward as :func:`capsjax.routing.em.em_routing` (the same formulas, from
:mod:`capsjax.routing.em_arithmetic`; only the sums over the children are laid out for speed
here), with a ``custom_vjp``
that makes a few passes over the votes instead of the ~120 that autodiff of the reference
makes (measured with :mod:`capsjax.perf.hlo_traffic`, docs/performance.md).

Why: matrix capsules' routing is memory-bound. Its arrays are the votes ``V (batch,
children, out_caps, positions, D)`` (ConvCaps1 of ``configs/em_mnist.py``: 14.7 MB per image)
and things 1/D their size (assignments, weights) or smaller (the parents). Every votes-sized
pass costs about as much as the arithmetic of the whole layer, so the cost of a step is the
number of such passes. Autodiff of the reference writes several votes-sized temporaries per
iteration and reads each back (differences ``V - mu``, their squares, products with the
weights, their cotangents); the backward pass below needs, per iteration, the reductions of
``V`` and ``(V - mu)^2`` against the cotangents (two passes), and one final pass that writes
the votes' cotangent from every iteration's small arrays at once.

The derivation, per iteration ``t`` (names as in :mod:`capsjax.routing.em`; sums over the
children ``n`` unless said)::

    w     = R a                   m0 = sum w                       mass = m0 + eps
    S1    = sum w V               mu = (1 - delta) S1 / mass + delta mu_prev
    S2    = sum w (V - mu)^2      (var, logit, c) = fit(S2, m0, beta_u, beta_a)
    q     = sum_h (V - mu)^2 / (2 var)              log p = c - q       R' = normalise(log p)

and its cotangents (``damped_mean`` and ``fit``, the parent-sized M-step, and ``normalise``
are differentiated by JAX; only the votes-sized steps are written here)::

    dq    = -d log p              dc = sum d log p
    dmu  += -(sum dq V - mu sum dq) / var           dvar = -sum dq (V - mu)^2 / (2 var^2)
    dmu  += -2 dS2 (S1 - m0 mu)                     (sum w (V - mu) = S1 - m0 mu)
    dw    = sum_h (dS1 V + dS2 (V - mu)^2) + dm0
    dV    = sum_t [w (dS1 + 2 dS2 (V - mu)) + dq (V - mu) / var]

How XLA:CPU runs this fast (each measured on ``configs/em_mnist.py``, docs/performance.md):

* the votes are made parent-major, ``(b, o, p, n, D)``, so that every sum over the children
  is a batched matrix-vector product (``sum w V``, ``sum dq V``) and every sum over the pose a
  product with a parent-sized vector, not a strided reduction (which XLA:CPU runs several
  times slower, materialising the broadcast products it reduces);
* ``S2`` and ``sum dq (V - mu)^2`` come from the products with ``V`` and ``V^2`` (``sum w (V -
  mu)^2 = sum w V^2 - 2 mu sum w V + mu^2 sum w``), the votes first shifted by their mean over
  the children (a constant: routing is translation-equivariant) so that the difference is of
  numbers of the spread's size, not the poses';
* ``dV`` is ``V A + B`` with ``A`` and ``B`` sums of outer products, each one batched product.

The residuals are the shifted votes and their squares (votes-sized), each iteration's
assignments and log-likelihoods (1/D of the votes each) and the parents. Diagnostics are
measured by the reference (:func:`capsjax.routing.em.em_routing` calls it when asked for them:
evaluation only, no backward pass).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from capsjax.routing.em_arithmetic import damped_mean, fit, scaled_distance, schedule

def _parent_major(x: jax.Array) -> jax.Array:
  """``(batch, children, out_caps, positions, ...)`` -> ``(batch, out_caps, positions,
  children, ...)``: the layout in which a sum over the children is a batched matrix-vector
  product (the CPU's dot runs it at several times the speed of a strided reduction)."""
  return jnp.moveaxis(x, 1, 3)


def _child_major(x: jax.Array) -> jax.Array:
  """The inverse of :func:`_parent_major`."""
  return jnp.moveaxis(x, 3, 1)


def _over_children(weights: jax.Array, votes: jax.Array) -> jax.Array:
  """``sum_n weights[..., n] votes[..., n, :]``: ``(b, o, p, n)``, ``(b, o, p, n, D)`` ->
  ``(b, o, p, D)``."""
  return jnp.einsum("bopn,bopnd->bopd", weights, votes)


def _against_parents(votes: jax.Array, parents: jax.Array) -> jax.Array:
  """``sum_h votes[..., n, h] parents[..., h]``: ``(b, o, p, n, D)``, ``(b, o, p, D)`` ->
  ``(b, o, p, n)``."""
  return jnp.einsum("bopnd,bopd->bopn", votes, parents)


def _forward(votes, activations, beta_u, beta_a, initial, settings, normalise):
  """Runs the iterations on ``votes`` ``(b, n, o, p, D)`` (the caller's layout, made
  parent-major here) and ``activations`` broadcastable to ``(b, o, p, n)``; ``initial`` and
  ``normalise`` in the caller's layout ``(b, n, o, p)``. Returns ``(mean, logit)`` of the last
  M-step and the residuals."""
  iterations = settings["iterations"]
  lambdas = schedule(settings, votes.dtype)
  assignments = _parent_major(initial)
  # The votes about a shift per parent and pose element (their mean over the children):
  # the sums of w V and w V^2 below then subtract numbers of the size of the spread, not
  # of the poses. Routing is translation-equivariant but for the mass epsilon, which the
  # mean sees in true coordinates (s1 + shift m0), so the shift is a constant of the
  # function: no gradient. Taken in the caller's layout, where it is a cheap reduction, and
  # subtracted in the same pass that makes the votes parent-major.
  shift = jax.lax.stop_gradient(jnp.mean(votes, axis=1))
  votes = _parent_major(votes) - shift[..., None, :]
  squares = jnp.square(votes)
  previous_mean = jnp.zeros(shift.shape, votes.dtype)
  saved = []
  for t in range(iterations):
    weights = assignments * activations
    m0 = jnp.sum(weights, axis=-1)
    s1 = _over_children(weights, votes)
    mean = damped_mean(s1 + shift * m0[..., None], m0, previous_mean, settings)
    centre = mean - shift
    # sum w (V - mu)^2 = sum w V^2 - 2 mu sum w V + mu^2 sum w (V, mu about the shift): two
    # products with the votes and their squares instead of a strided reduction (clamped:
    # rounding can make the difference of a near-zero spread negative).
    s2 = jnp.maximum(_over_children(weights, squares) - 2.0 * centre * s1
                     + jnp.square(centre) * m0[..., None], 0.0)
    variance, logit, c = fit(s2, m0, beta_u, beta_a, lambdas[t], settings)
    log_p = None
    if t < iterations - 1:
      squared = jax.lax.optimization_barrier(
          scaled_distance(votes, centre[..., None, :], variance[..., None, :]))
      log_p = _child_major(c[..., None] - squared)
    saved.append((assignments, m0, s1, previous_mean, centre, s2, variance, log_p))
    if log_p is not None:
      assignments = _parent_major(normalise(log_p))
    previous_mean = mean
  return (mean, logit), (votes, squares, shift, saved)


def _sum_to(x: jax.Array, shape: tuple) -> jax.Array:
  """Sums ``x`` over the axes where ``shape`` broadcasts (size 1) onto it."""
  axes = tuple(k for k, (n, m) in enumerate(zip(shape, x.shape)) if n == 1 and m != 1)
  return jnp.sum(x, axis=axes, keepdims=True).reshape(shape)


def _backward(settings, normalise, residuals, cotangents):
  """The cotangents of ``(votes, activations, beta_u, beta_a, initial)`` (module docstring),
  parent-major as :func:`_forward`."""
  _, activations, beta_u, beta_a, initial, (votes, squares, shift, saved) = residuals
  # XLA would otherwise find the forward's (V - mu)^2 in the expressions below and keep it,
  # votes-sized, from the forward pass to this one (common-subexpression elimination).
  votes, squares = jax.lax.optimization_barrier((votes, squares))
  d_mean, d_logit_out = cotangents
  iterations = settings["iterations"]
  lambdas = schedule(settings, votes.dtype)
  d_activations = jnp.zeros(activations.shape, activations.dtype)
  d_beta_u, d_beta_a = jnp.zeros_like(beta_u), jnp.zeros_like(beta_a)
  d_next = None                     # The cotangent of the assignments iteration t made.
  vote_terms = []                   # dV = sum_k weight_k (scale_k V + offset_k).
  for t in reversed(range(iterations)):
    # mean: about the shift, as the votes; s1 = sum w V about it.
    assignments, m0, s1, previous_mean, mean, s2, variance, log_p = saved[t]
    weights = assignments * activations
    d_variance = jnp.zeros_like(variance)
    d_c = jnp.zeros_like(m0)
    if d_next is not None:
      _, normalise_vjp = jax.vjp(normalise, log_p)
      d_q = -_parent_major(normalise_vjp(_child_major(d_next))[0])
      g0 = jnp.sum(d_q, axis=-1)[..., None]
      d_c = -g0[..., 0]
      g1 = _over_children(d_q, votes)                               # sum dq V
      g2 = _over_children(d_q, squares) - 2.0 * mean * g1 + jnp.square(mean) * g0
      d_mean = d_mean - (g1 - mean * g0) / variance
      d_variance = -g2 / (2.0 * jnp.square(variance))
      vote_terms.append((d_q, 1.0 / variance, -mean / variance))
    d_logit = d_logit_out if t == iterations - 1 else jnp.zeros_like(m0)
    _, fit_vjp = jax.vjp(lambda *a: tuple(fit(*a, lambdas[t], settings)), s2, m0, beta_u,
                         beta_a)
    d_s2, d_m0, du, da = fit_vjp((d_variance, d_logit, d_c))
    d_beta_u, d_beta_a = d_beta_u + du, d_beta_a + da
    d_mean = d_mean - 2.0 * d_s2 * (s1 - m0[..., None] * mean)
    _, mean_vjp = jax.vjp(lambda s1, m0, previous: damped_mean(s1 + shift * m0[..., None], m0,
                                                               previous, settings),
                          s1, m0, previous_mean)
    d_s1, d_m0_mean, d_mean = mean_vjp(d_mean)
    # sum_h dS1 V + dS2 (V - mu)^2 as products of the votes and their squares with
    # parent-sized vectors (XLA:CPU's reductions would materialise the broadcast products).
    d_weights = (_against_parents(votes, d_s1 - 2.0 * d_s2 * mean)
                 + _against_parents(squares, d_s2)
                 + (jnp.sum(d_s2 * jnp.square(mean), axis=-1) + d_m0 + d_m0_mean)[..., None])
    vote_terms.append((weights, 2.0 * d_s2, d_s1 - 2.0 * d_s2 * mean))
    d_activations = d_activations + _sum_to(d_weights * assignments, activations.shape)
    d_next = None if (t == 0 or settings["stop_gradient"]) else d_weights * activations
  # w f (V - c) = (w f) V - w (f c): no votes-sized V - c to share between terms.
  # dV = V A + B, A and B each a sum of outer products (children x pose) computed as one
  # batched product over the stacked terms: XLA fuses what is left, V A + B, into the
  # transposes that the votes' einsum's backward pass reads.
  weight, scale, offset = (jnp.stack(parts, axis=-2) for parts in zip(*vote_terms))
  d_votes = (votes * jnp.einsum("bopkn,bopkd->bopnd", weight, scale)
             + jnp.einsum("bopkn,bopkd->bopnd", weight, offset))
  return _child_major(d_votes), d_activations, d_beta_u, d_beta_a, jnp.zeros_like(initial)


def em_routing_analytic(votes: jax.Array, activations: jax.Array, beta_u: jax.Array,
                        beta_a: jax.Array, *, settings: dict,
                        normalise: Callable[[jax.Array], jax.Array],
                        initial: jax.Array | float | None = None) -> tuple[jax.Array, jax.Array]:
  """EM routing as :func:`capsjax.routing.em.em_routing` (same arguments, no diagnostics),
  differentiated by the backward pass of the module docstring.

  Returns:
    The parents' means ``(batch, out_caps, positions, D)`` and activations ``sigmoid(logit)``
    ``(batch, out_caps, positions)``.
  """
  batch, children, out_caps, positions, _ = votes.shape
  initial = jnp.broadcast_to(1.0 / out_caps if initial is None else initial,
                             (batch, children, out_caps, positions)).astype(votes.dtype)

  activations = _parent_major(jnp.broadcast_to(
      activations, activations.shape[:1] + votes.shape[1:2] + activations.shape[2:]))

  @jax.custom_vjp
  def route(votes, activations, beta_u, beta_a, initial):
    return _forward(votes, activations, beta_u, beta_a, initial, settings, normalise)[0]

  def forward(votes, activations, beta_u, beta_a, initial):
    outputs, saved = _forward(votes, activations, beta_u, beta_a, initial, settings, normalise)
    return outputs, (None, activations, beta_u, beta_a, initial, saved)

  route.defvjp(forward, lambda residuals, cotangents: _backward(settings, normalise, residuals,
                                                                cotangents))
  mean, logit = route(votes, activations, beta_u, beta_a, initial)
  return mean, jax.nn.sigmoid(logit)
