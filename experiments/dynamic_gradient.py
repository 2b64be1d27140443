"""Dynamic routing with its backward pass written out, measured against autodiff of the
router (:func:`capsjax.routing.dynamic.dynamic_routing`): the same forward, with a
``custom_vjp`` over all the iterations that reads the votes once per product the chain rule
needs and writes their cotangent once. Its forward is the router's
(:func:`capsjax.routing.dynamic.procedure_1`); only the backward pass is here.

    python experiments/dynamic_gradient.py [--batches=128,16] [--calls=10]

checks on this machine's default backend that both forms give the same gradient (float32, at
the paper's vote sizes) and prints one JSON line per batch: the median seconds of the
jitted value and gradient of each form and the bytes XLA's program moves
(:mod:`capsjax.perf.hlo_traffic`). ``experiments/gpu_speed.sh`` runs it in its
``gradients`` stage. It left the package (until 2026-11-28 the dynamic router's setting
``gradient="analytic"``) because nothing chose it: on XLA:CPU autodiff makes the same passes
(docs/notes/performance_log.md); it comes back as a router setting where it is measured
faster. tests/test_experiment_dynamic_gradient.py keeps it equal to autodiff.

Why: the votes ``u_hat (batch, in_caps, out_caps, out_dim)`` are the routing's only large
array (0.74 MB per image for the paper's MNIST model, 10 x 1152 x 16 floats); everything else
is 1/out_dim of them (logits, coupling) or smaller (the parents). So the routing costs about
the number of votes-sized passes it makes, and this form makes only those the chain rule
needs. On XLA:CPU autodiff of the unrolled loop turned out to make the same passes (the same
bytes and the same speed), so the router differentiates its loop with JAX.

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

import argparse
import json
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from capsjax.routing import dynamic
from capsjax.routing.core import squash
from capsjax.routing.dynamic import (agreement, preactivation, procedure_1,
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


def routing(votes: jax.Array, iterations: int, *, softmax_axis: str = "output",
            stop_gradient: bool = False, leaky: bool = False, bias: jax.Array | None = None,
            squash_epsilon: float = 0.0) -> jax.Array:
  """:func:`capsjax.routing.dynamic.dynamic_routing`'s arguments and result (child-major
  ``votes (batch, in_caps, out_caps, out_dim)``), differentiated by the written-out pass."""
  votes = jnp.transpose(votes, (0, 2, 3, 1))
  _, out_caps, _, in_caps = votes.shape
  uniform = 1.0 / ((out_caps if softmax_axis == "output" else in_caps) + int(leaky))
  axis = {"output": 1, "input": 2}[softmax_axis]
  return dynamic_routing_analytic(
      votes, bias, iterations=iterations, uniform=uniform,
      normalise=lambda logits: dynamic._softmax(logits, axis, leaky),
      squash_epsilon=squash_epsilon, stop_gradient=stop_gradient)


def gradient_programs(votes: jax.Array, cotangent: jax.Array, iterations: int = 3) -> dict:
  """The jitted gradient in the votes of ``sum(v * cotangent)`` by each form (the paper's
  switches): ``{"autodiff": fn, "analytic": fn}``."""
  forms = {"autodiff": lambda v: dynamic.dynamic_routing(v, iterations),
           "analytic": lambda v: routing(v, iterations)}
  return {name: jax.jit(jax.grad(lambda v, f=f: jnp.sum(f(v) * cotangent)))
          for name, f in forms.items()}


def measure(batch: int, calls: int, in_caps: int = 1152) -> dict:
  """Both forms at the paper's DigitCaps sizes: equal gradients (float32 rounding), then the
  median seconds of ``calls`` calls each (alternating) and the bytes each program moves."""
  from capsjax.perf import hlo_traffic, rates

  rng = np.random.default_rng(0)
  votes = jnp.asarray(0.05 * rng.normal(size=(batch, in_caps, 10, 16)), jnp.float32)
  cotangent = jnp.asarray(rng.normal(size=(batch, 10, 16)), jnp.float32)
  programs = gradient_programs(votes, cotangent)
  grads = {name: np.asarray(fn(votes)) for name, fn in programs.items()}
  scale = float(np.max(np.abs(grads["autodiff"])))
  difference = float(np.max(np.abs(grads["analytic"] - grads["autodiff"])))
  if not difference <= 1e-5 * scale:
    raise SystemExit(f"the two gradients differ by {difference:.3g} (scale {scale:.3g}): "
                     "not measured.")
  seconds = rates.median_seconds(programs, (votes,), calls)
  traffic = {name: hlo_traffic.program_traffic(fn.lower(votes).compile().as_text()).total_bytes
             for name, fn in programs.items()}
  return {"measurement": "dynamic_routing_gradient", "backend": jax.default_backend(),
          "device": jax.devices()[0].device_kind, "batch": batch,
          "votes": [batch, in_caps, 10, 16], "iterations": 3, "calls": calls,
          "max_difference": difference, "gradient_scale": scale,
          **{f"{name}_median_s": s for name, s in seconds.items()},
          **{f"{name}_bytes": traffic[name] for name in programs}}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", default="128,16", help="comma-separated batch sizes")
  parser.add_argument("--calls", type=int, default=10, help="timed calls of each form")
  parser.add_argument("--in_caps", type=int, default=1152, help="children (paper: 1152)")
  args = parser.parse_args(argv)
  for batch in (int(b) for b in args.batches.split(",")):
    print(json.dumps(measure(batch, args.calls, args.in_caps)), flush=True)


if __name__ == "__main__":
  main()
