"""Dynamic routing with its backward pass written out (the dynamic router's setting
``gradient="analytic"``): the same forward as :func:`capsjax.routing.dynamic.dynamic_routing`,
with a ``custom_vjp`` over all the iterations that reads the votes once per product the
chain rule needs and writes their cotangent once. Its forward is the reference's
(:func:`capsjax.routing.dynamic_arithmetic.procedure_1`); only the backward pass is here.

Why: the votes ``u_hat (batch, in_caps, out_caps, out_dim)`` are the routing's only large
array (0.74 MB per image for the paper's MNIST model, 10 x 1152 x 16 floats); everything else
is 1/out_dim of them (logits, coupling) or smaller (the parents). So the routing costs about
the number of votes-sized passes it makes, and this form makes only those the chain rule
needs. On XLA:CPU autodiff of the unrolled loop turned out to make the same passes (the same
bytes, measured with :mod:`capsjax.perf.hlo_traffic`, and the same speed; docs/performance.md),
so the router's ``"auto"`` keeps autodiff there; GPUs are still to be measured.

The derivation. Forward, for ``t = 0 .. r-1`` (Procedure 1; ``c_0`` uniform)::

    c_t = normalise(b_t)          s_t = sum_i c_t V + bias        v_t = squash(s_t)
    a_t = sum_d V v_t             b_{t+1} = b_t + a_t            (t < r-1)

Backward, from ``dv_{r-1}`` (the output's cotangent), for ``t = r-1 .. 0``::

    dv_t = sum_i V db_{t+1}                                       (t < r-1; da_t = db_{t+1})
    ds_t = squash'(s_t) dv_t      dbias += sum_batch ds_t
    dc_t = sum_d V ds_t           db_t = db_{t+1} + normalise'(b_t) dc_t     (t > 0)
    dV   = sum_t c_t (x) ds_t + sum_{t<r-1} db_{t+1} (x) v_t

so ``2r - 2`` products with the votes backward (``dc_0`` is not needed: ``c_0`` is a
constant), and ``dV``, a sum of ``2r - 1`` outer products (children x pose), is written
once, in one fused pass. With ``stop_gradient`` only the
last ``c_{r-1} (x) ds_{r-1}`` reaches the votes (the logits see ``stop_gradient(V)``); the
iterations before are still run backward when there is a bias, whose gradient flows through
them.

Layout: the votes are parent-major, ``(batch, out_caps, out_dim, in_caps)``, as in the
reference: both kinds of product are then batched matrix-vector products over ``(batch,
out_caps)``. The residuals are the votes, each iteration's logits and ``s_t`` (small).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from capsjax.routing.core import squash
from capsjax.routing.dynamic_arithmetic import (agreement, preactivation, procedure_1,
                                                uniform_coupling)


def dynamic_routing_analytic(votes: jax.Array, bias: jax.Array | None, *, iterations: int,
                             normalise: Callable[[jax.Array], jax.Array], uniform: float,
                             squash_epsilon: float = 0.0,
                             stop_gradient: bool = False) -> jax.Array:
  """Procedure 1 on parent-major votes, differentiated by the module docstring's backward pass.

  Args:
    votes: u_hat, parent-major ``(batch, out_caps, out_dim, in_caps)``.
    bias: ``(out_caps, out_dim)`` added to every ``s_t``, or None.
    iterations: r >= 1.
    normalise: logits ``(batch, out_caps, in_caps)`` -> coupling (the softmax over the
      chosen axis, leaky or not); differentiated by JAX.
    uniform: the first iteration's coupling, ``normalise`` of zeros (a constant, so that XLA
      need not fold a softmax over a whole array).
    squash_epsilon, stop_gradient: as :func:`capsjax.routing.dynamic.dynamic_routing`.

  Returns:
    The parents v_j, ``(batch, out_caps, out_dim)``.
  """
  has_bias = bias is not None
  bias = jnp.zeros(votes.shape[1:3], votes.dtype) if bias is None else bias

  def run(votes, bias):
    """The parents and the residuals: each iteration's starting logits (None for the first)
    and ``s_t``, 1/out_dim of the votes each (the coupling is recomputed from the logits)."""
    def keep(saved, t, logits, coupling, s):
      return saved + [(None if t == 0 else logits, s)]

    return procedure_1(votes, iterations=iterations, normalise=normalise, uniform=uniform,
                       bias=bias, squash_epsilon=squash_epsilon, observe=keep, observed=[],
                       python_loop=True)

  @jax.custom_vjp
  def route(votes, bias):
    return run(votes, bias)[0]

  def forward(votes, bias):
    parents, saved = run(votes, bias)
    return parents, (votes, saved)

  def backward(residuals, d_parents):
    votes, saved = residuals
    d_votes_flow = not stop_gradient
    d_bias = jnp.zeros(votes.shape[1:3], votes.dtype)
    d_logits = None             # The cotangent of the logits b_{t+1}.
    weights, vectors = [], []   # dV = sum_k weights_k (x) vectors_k.
    for t in reversed(range(iterations)):
      logits, s_t = saved[t]
      parents, squash_vjp = jax.vjp(lambda s: squash(s, epsilon=squash_epsilon), s_t)
      if t < iterations - 1:
        d_parents = preactivation(votes, d_logits)   # The transpose of agreement.
        if d_votes_flow:
          weights.append(d_logits)
          vectors.append(parents)
      (d_preactivation,) = squash_vjp(d_parents)
      d_bias = d_bias + jnp.sum(d_preactivation, axis=0)
      coupling, normalise_vjp = (None, None) if logits is None else jax.vjp(normalise, logits)
      if d_votes_flow or t == iterations - 1:
        weights.append(uniform_coupling(votes, uniform) if coupling is None else coupling)
        vectors.append(d_preactivation)
      if logits is not None and (d_votes_flow or has_bias):
        d_coupling = agreement(votes, d_preactivation)
        (d_from_coupling,) = normalise_vjp(d_coupling)
        d_logits = d_from_coupling if d_logits is None else d_logits + d_from_coupling
      elif logits is not None:
        break   # Nothing upstream needs a gradient (stop_gradient and no bias).
    # Written as broadcasts, not as one batched product of the stacked terms: XLA fuses the
    # sum into the one pass that writes dV (and into the transpose to the caller's layout);
    # a product of K = 2r - 1 terms would run as a dot, then a copy.
    d_votes = sum(w[:, :, None, :] * v[..., None] for w, v in zip(weights, vectors))
    return d_votes, d_bias

  route.defvjp(forward, backward)
  return route(votes, bias)
