"""Dynamic routing's arithmetic, written once: Procedure 1 of Sabour et al. (2017) on
parent-major votes. The router (:func:`capsjax.routing.dynamic.dynamic_routing`,
differentiated by JAX) calls :func:`procedure_1`; so does the written-out backward pass that
``experiments/dynamic_gradient.py`` measures against it (its custom VJP runs
:func:`procedure_1` forward and uses :func:`preactivation` and :func:`agreement` as each
other's transposes).

Layout: the votes u_hat are parent-major, ``(batch, out_caps, out_dim, in_caps)``; logits
and coupling ``(batch, out_caps, in_caps)``; parents ``(batch, out_caps, out_dim)``. Both
products with the votes are then batched matrix-vector products over ``(batch, out_caps)``
with no transpose of the votes between iterations (on XLA:CPU the faster layout).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from capsjax.routing.core import squash


def preactivation(votes: jax.Array, coupling: jax.Array) -> jax.Array:
  """Eq. 2, ``s_j = sum_i c_ij u_hat_{j|i}``: ``(b, j, d, i)``, ``(b, j, i)`` -> ``(b, j, d)``."""
  return jnp.einsum("bjdi,bji->bjd", votes, coupling)


def agreement(votes: jax.Array, parents: jax.Array) -> jax.Array:
  """Procedure 1, line 7, ``u_hat_{j|i} . v_j``: ``(b, j, d, i)``, ``(b, j, d)`` ->
  ``(b, j, i)``."""
  return jnp.einsum("bjdi,bjd->bji", votes, parents)


def uniform_coupling(votes: jax.Array, uniform: float) -> jax.Array:
  """The first iteration's coupling (``b = 0``), ``(b, j, i)`` all ``uniform``: written as a
  constant, XLA need not constant-fold a softmax over a whole array (seconds)."""
  return jnp.full(votes.shape[:2] + votes.shape[3:], uniform, votes.dtype)


def procedure_1(votes: jax.Array, *, iterations: int,
                normalise: Callable[[jax.Array], jax.Array], uniform: float,
                bias: jax.Array | None = None, squash_epsilon: float = 0.0,
                routed_votes: jax.Array | None = None,
                observe: Callable[..., Any] | None = None, observed: Any = None,
                python_loop: bool = False):
  """Routing-by-agreement (Procedure 1)::

      b <- 0
      for t = 0 .. r-1:
        c_t <- normalise(b)                      # Line 4 (uniform for t = 0)
        s_t <- sum_i c_t u_hat (+ bias)          # Line 5, Eq. 2
        v_t <- squash(s_t)                       # Line 6, Eq. 1
        b   <- b + u_hat . v_t                   # Line 7 (t < r-1)

  Args:
    votes: u_hat, parent-major ``(batch, out_caps, out_dim, in_caps)``.
    iterations: r >= 1, a Python int (static bounds: the loop stays reverse-differentiable).
    normalise: logits ``(batch, out_caps, in_caps)`` -> coupling (the softmax over the chosen
      axis, leaky or not).
    uniform: the first iteration's coupling, ``normalise`` of zeros.
    bias: ``(out_caps, out_dim)`` added to every ``s_t``, or None.
    squash_epsilon: see :func:`capsjax.routing.core.squash`.
    routed_votes: the votes that the iterations before the last route with (default
      ``votes``); ``stop_gradient(votes)`` gives the switch ``stop_gradient``: only the last
      ``s_t`` sees the votes themselves.
    observe: ``observe(observed, t, b_t, c_t, s_t) -> observed``, called at each iteration
      with the logits it started from (zeros for t = 0), its coupling and ``s_t`` (a trace
      for diagnostics, or the residuals of a backward pass); ``t`` may be traced.
    observed: what ``observe`` starts from (arrays of fixed shapes, unless ``python_loop``).
    python_loop: run the iterations as a Python loop instead of ``fori_loop``, so that
      ``observe`` sees each ``t`` as an int and may keep what it is given in a list (the
      residuals of experiments/dynamic_gradient.py's backward pass: no arrays to write them
      into).

  Returns:
    The parents v_{r-1}, ``(batch, out_caps, out_dim)``, and ``observed``.
  """
  routed_votes = votes if routed_votes is None else routed_votes

  def s_of(coupling, votes_):
    s = preactivation(votes_, coupling)
    return s if bias is None else s + bias

  def note(observed, t, logits, coupling, s):
    return observed if observe is None else observe(observed, t, logits, coupling, s)

  def iteration(t, observed, logits, coupling):
    """Lines 5-7: the next logits."""
    s = s_of(coupling, routed_votes)
    observed = note(observed, t, logits, coupling, s)
    return logits + agreement(routed_votes, squash(s, epsilon=squash_epsilon)), observed

  logits = jnp.zeros(votes.shape[:2] + votes.shape[3:], votes.dtype)
  coupling = uniform_coupling(votes, uniform)
  if iterations > 1:
    logits, observed = iteration(0, observed, logits, coupling)

  def intermediate_iteration(t, carry):
    logits, observed = carry
    return iteration(t, observed, logits, normalise(logits))

  # Unrolled: a rolled loop stacks per-iteration residuals for the gradient, which XLA:CPU
  # ran slower; r is small.
  if python_loop:
    for t in range(1, iterations - 1):
      logits, observed = intermediate_iteration(t, (logits, observed))
  else:
    logits, observed = jax.lax.fori_loop(1, iterations - 1, intermediate_iteration,
                                         (logits, observed), unroll=True)
  if iterations > 1:
    coupling = normalise(logits)
  s = s_of(coupling, votes)
  observed = note(observed, iterations - 1, logits, coupling, s)
  return squash(s, epsilon=squash_epsilon), observed
