"""What dynamic routing did, iteration by iteration (:class:`RoutingTrace`, from
:func:`capsjax.routing.dynamic.dynamic_routing` with ``return_trace=True``), and its diagnostics:
the coupling's entropy and peak, the logits' change, the length of s_j (cf. paper Fig. A.1)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from capsjax.routing.core import coupling_statistics


class RoutingTrace(NamedTuple):
  """What routing did, iteration by iteration, for analysis.

  Attributes:
    logits: ``(iterations, batch, in_caps, out_caps)``; ``logits[r]`` are the b_ij that
      iteration r started from (all zero for r = 0).
    coupling: ``(iterations, batch, in_caps, out_caps)``; the c_ij that iteration r used.
    preactivation_norm: ``(iterations, batch, out_caps)``; ``|s_j|`` of iteration r, before the
      squash (long ``s_j`` saturate it).
  """
  logits: jax.Array
  coupling: jax.Array
  preactivation_norm: jax.Array | None = None


def routing_diagnostics_per_example(trace: RoutingTrace, softmax_axis: str = "output") -> dict:
  """Per-iteration summaries of a :class:`RoutingTrace` for each example (cf. Fig. A.1).

  Returns:
    A dict of ``(batch, iterations)`` arrays:
      ``coupling_entropy``: mean entropy (nats) of each child's (or, for ``"input"``, each
        parent's) coupling distribution;
      ``coupling_max``: the mean of the largest coefficient of each distribution;
      ``logit_change``: mean ``|b^r - b^(r-1)|``, 0 for the first iteration;
      ``preactivation_norm``: mean ``|s_j|`` over the parents (when the trace has it).
  """
  axis = {"output": 2, "input": 1}[softmax_axis]  # Of (batch, in_caps, out_caps).
  stats = jax.vmap(lambda c: coupling_statistics(c, axis))(trace.coupling)
  logits = trace.logits
  change = jnp.abs(jnp.concatenate([jnp.zeros_like(logits[:1]), jnp.diff(logits, axis=0)]))
  logit_change = jnp.mean(change.reshape(*change.shape[:2], -1), axis=2)
  per_iteration = {**stats, "logit_change": logit_change}  # Each (iterations, batch).
  if trace.preactivation_norm is not None:
    per_iteration["preactivation_norm"] = jnp.mean(trace.preactivation_norm, axis=2)
  return {k: v.T for k, v in per_iteration.items()}


def routing_diagnostics(trace: RoutingTrace, softmax_axis: str = "output",
                        weights: jax.Array | None = None) -> dict:
  """:func:`routing_diagnostics_per_example` averaged over examples, ``(iterations,)`` each;
  ``softmax_axis``: the axis the coupling was normalised over; ``weights``: optional ``(batch,)``
  example weights (0 for padding)."""
  per_example = routing_diagnostics_per_example(trace, softmax_axis)
  if weights is None:
    weights = jnp.ones(trace.coupling.shape[1], trace.coupling.dtype)
  return {k: jnp.sum(v * weights[:, None], axis=0) / jnp.maximum(jnp.sum(weights), 1e-12)
          for k, v in per_example.items()}
