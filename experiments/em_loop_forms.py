"""EM routing's gradient three ways: the router's loop, differentiated by JAX, against the two
forms it replaced (issue 78 item 7, "EM's loop once"; until 2026-11-29 EM's setting
``gradient``):

* ``router``: :func:`capsjax.routing.em.em_routing`, parent-major votes shifted by their mean,
  every sum over the children or the pose a product with the votes or their squares,
  differentiated by JAX: what every backend runs;
* ``custom_vjp``: the same layout with the backward pass written out (``gradient="analytic"``,
  until then the default on CPUs; :func:`custom_vjp`, derivation below);
* ``reference_loop``: the authors' child-major loop with the sums over the children as
  reductions and ``jax.checkpoint`` per iteration, differentiated by JAX (``"autodiff"``, until
  then the default elsewhere; :func:`reference_loop`).

    python experiments/em_loop_forms.py [--batches=16,4] [--calls=10]

checks that the three give the same value and gradients (float32) and prints one JSON line per
batch: each form's median seconds of the jitted value and gradient, and its compiled program's
temporary bytes (XLA's memory analysis; null where the backend gives none). The sizes default
to ConvCaps1 of ``configs/em_mnist.py`` (children 3x3x32, 32 types, 5x5 positions, 4x4 poses:
14.7 MB of votes per image). ``experiments/gpu_speed.sh`` runs it in its ``gradients`` stage;
tests/test_experiment_em_loop_forms.py keeps the three equal (float64 too). A removed form
comes back as a router setting where it is measured faster in a whole train step.

The custom VJP's derivation, per iteration ``t`` (names as in :mod:`capsjax.routing.em`; sums
over the children ``n`` unless said)::

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

with every sum over the children and the pose a batched product, as in the router, and ``dV``
written once as ``V A + B`` (``A``, ``B`` sums of outer products, each one batched product).
Its forward computes the E-step's distance directly (the router: as products); its residuals
are the shifted votes and their squares and each iteration's assignments and log-likelihoods.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from capsjax.perf import rates
from capsjax.routing import em
from capsjax.routing.em import against_parents as _against_parents
from capsjax.routing.em import child_major as _child_major
from capsjax.routing.em import over_children as _over_children
from capsjax.routing.em import parent_major as _parent_major
from capsjax.routing.em_arithmetic import damped_mean, fit, scaled_distance, schedule

FORMS = ("router", "custom_vjp", "reference_loop")


# The reference loop (capsjax/routing/em.py until 2026-11-29, without its diagnostics).

def _reference_m_step(votes, weights, previous_mean, beta_u, beta_a, inverse_temperature,
                      settings):
  """The M-step on child-major votes ``(b, n, o, p, D)``, the sums over the children as
  reductions of elementwise products: ``(mean, variance, logit, log_normaliser)``."""
  m0 = jnp.sum(weights, axis=1)
  w = weights[..., None]
  mean = damped_mean(jnp.sum(w * votes, axis=1), m0, previous_mean, settings)
  s2 = jnp.sum(w * jnp.square(votes - mean[:, None]), axis=1)
  return (mean, *fit(s2, m0, beta_u, beta_a, inverse_temperature, settings))


def reference_loop(votes, activations, beta_u, beta_a, *, settings: dict,
                   normalise: Callable[[jax.Array], jax.Array], initial=None):
  """EM routing by the reference loop, ``(poses, activations)`` as the router's (same
  arguments, no diagnostics)."""
  iterations = settings["iterations"]
  batch, children, out_caps, positions, d = votes.shape
  lambdas = schedule(settings, votes.dtype)
  assignments = jnp.broadcast_to(1.0 / out_caps if initial is None else initial,
                                 (batch, children, out_caps, positions)).astype(votes.dtype)
  mean = jnp.zeros((batch, out_caps, positions, d), votes.dtype)

  def iteration(t, carry):
    assignments, mean = carry
    mean, variance, _, log_normaliser = _reference_m_step(
        votes, assignments * activations, mean, beta_u, beta_a, lambdas[t], settings)
    assignments = normalise(log_normaliser[:, None]
                            - scaled_distance(votes, mean[:, None], variance[:, None]))
    if settings["stop_gradient"]:
      assignments = jax.lax.stop_gradient(assignments)
    return assignments, mean

  # The backward pass recomputes each iteration from its carry.
  iteration = jax.checkpoint(iteration, policy=jax.checkpoint_policies.nothing_saveable)
  assignments, mean = jax.lax.fori_loop(0, iterations - 1, iteration, (assignments, mean))
  mean, _, logit, _ = _reference_m_step(votes, assignments * activations, mean, beta_u, beta_a,
                                        lambdas[iterations - 1], settings)
  return mean, jax.nn.sigmoid(logit)


# The custom VJP (capsjax/routing/em_gradient.py until 2026-11-29).

def _forward(votes, activations, beta_u, beta_a, initial, settings, normalise):
  """Runs the iterations on ``votes`` ``(b, n, o, p, D)`` (the caller's layout, made
  parent-major here) and ``activations`` broadcastable to ``(b, o, p, n)``; ``initial`` and
  ``normalise`` in the caller's layout ``(b, n, o, p)``. Returns ``(mean, logit)`` of the last
  M-step and the residuals."""
  iterations = settings["iterations"]
  lambdas = schedule(settings, votes.dtype)
  assignments = _parent_major(initial)
  votes, squares, shift = em.Votes.of(votes)   # Parent-major, about their mean, as the router.
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


def custom_vjp(votes: jax.Array, activations: jax.Array, beta_u: jax.Array, beta_a: jax.Array,
               *, settings: dict, normalise: Callable[[jax.Array], jax.Array],
               initial: jax.Array | float | None = None) -> tuple[jax.Array, jax.Array]:
  """EM routing as :func:`capsjax.routing.em.em_routing` (same arguments, no diagnostics),
  differentiated by the backward pass of :func:`_backward`'s derivation (module docstring).

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


def router(votes, activations, beta_u, beta_a, *, settings: dict,
           normalise: Callable[[jax.Array], jax.Array], initial=None):
  """The router's loop: ``(poses, activations)`` of :func:`capsjax.routing.em.em_routing`."""
  return tuple(em.em_routing(votes, activations, beta_u, beta_a, settings=settings,
                             normalise=normalise, initial=initial)[:2])


def routings(settings: dict, normalise, initial=None) -> dict:
  """``{form: fn(votes, activations, beta_u, beta_a) -> (poses, activations)}``, each form
  looked up when called (so a test can replace one)."""
  def form(name):
    return lambda *a: globals()[name](*a, settings=settings, normalise=normalise,
                                      initial=initial)
  return {name: form(name) for name in FORMS}


def problem(batch: int, children: int, out_caps: int, positions: int, dim: int, seed=0,
            dtype=jnp.float32):
  """Votes, activations, betas and the cotangents of the two outputs."""
  rng = np.random.default_rng(seed)
  arrays = dict(votes=rng.normal(size=(batch, children, out_caps, positions, dim)),
                activations=rng.uniform(0.05, 1.0, size=(batch, children, 1, positions)),
                beta_u=rng.normal(size=out_caps), beta_a=0.01 * rng.normal(size=out_caps),
                pose_weights=rng.normal(size=(batch, out_caps, positions, dim)),
                activation_weights=rng.normal(size=(batch, out_caps, positions)))
  return {k: jnp.asarray(v, dtype) for k, v in arrays.items()}


def gradient_programs(x: dict, forms: dict) -> dict:
  """The jitted value and gradient (in votes, activations and both betas) of a weighted sum
  of the outputs, by each form."""
  def program(route):
    def objective(votes, activations, beta_u, beta_a):
      poses, activations_out = route(votes, activations, beta_u, beta_a)
      return (jnp.sum(poses * x["pose_weights"])
              + jnp.sum(activations_out * x["activation_weights"]))
    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2, 3)))
  return {name: program(route) for name, route in forms.items()}


def largest_difference(results: dict) -> float:
  """The largest difference of any form's value or gradient from the router's, relative
  to the router's largest magnitude of that array."""
  reference = jax.tree.leaves(results["router"])
  worst = 0.0
  for name, result in results.items():
    for got, want in zip(jax.tree.leaves(result), reference):
      scale = float(np.max(np.abs(want))) or 1.0
      worst = max(worst, float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) / scale)
  return worst


def temp_bytes(compiled) -> int | None:
  analysis = compiled.memory_analysis()
  return None if analysis is None else int(analysis.temp_size_in_bytes)


def measure(batch: int, calls: int, children: int = 288, out_caps: int = 32,
            positions: int = 25, dim: int = 16, tolerance: float = 1e-3) -> dict:
  """The three forms at these sizes: equal values and gradients (within ``tolerance`` of the
  router's scale, or SystemExit: not measured), then the median seconds of ``calls`` calls
  each (alternating) and each program's temporary bytes."""
  x = problem(batch, children, out_caps, positions, dim)
  settings = dict(em.ROUTER.defaults)
  normalise = lambda log_p: jax.nn.softmax(log_p, axis=2)  # Over each child's parents.
  programs = gradient_programs(x, routings(settings, normalise))
  args = (x["votes"], x["activations"], x["beta_u"], x["beta_a"])
  results = {name: jax.device_get(fn(*args)) for name, fn in programs.items()}
  difference = largest_difference(results)
  if not difference <= tolerance:
    raise SystemExit(f"the forms differ by {difference:.3g} of the router's scale: "
                     "not measured.")
  seconds = rates.median_seconds(programs, args, calls)
  memory = {name: temp_bytes(fn.lower(*args).compile()) for name, fn in programs.items()}
  return {"measurement": "em_loop_forms", "backend": jax.default_backend(),
          "device": jax.devices()[0].device_kind, "batch": batch,
          "votes": [batch, children, out_caps, positions, dim],
          "iterations": settings["iterations"], "calls": calls,
          "max_relative_difference": difference,
          **{f"{name}_median_s": s for name, s in seconds.items()},
          **{f"{name}_temp_bytes": memory[name] for name in programs}}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", default="16,4", help="comma-separated batch sizes")
  parser.add_argument("--calls", type=int, default=10, help="timed calls of each form")
  parser.add_argument("--children", type=int, default=288, help="children (ConvCaps1: 288)")
  parser.add_argument("--out_caps", type=int, default=32, help="parent types (ConvCaps1: 32)")
  parser.add_argument("--positions", type=int, default=25, help="positions (ConvCaps1: 25)")
  args = parser.parse_args(argv)
  for batch in (int(b) for b in args.batches.split(",")):
    print(json.dumps(measure(batch, args.calls, args.children, args.out_caps,
                             args.positions)), flush=True)


if __name__ == "__main__":
  main()
