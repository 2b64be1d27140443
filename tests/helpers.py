"""Shared test helpers."""

import jax
import numpy as np


def largest_intermediate(fn, *args) -> int:
  """Element count of the largest array any equation of ``fn``'s jaxpr makes,
  looking inside nested jaxprs (jit, scan, while, cond, custom_vjp)."""
  closed = jax.make_jaxpr(fn)(*args)

  def walk(jaxpr):
    largest = 0
    for eqn in jaxpr.eqns:
      for var in eqn.outvars:
        largest = max(largest, int(np.prod(var.aval.shape)))
      for param in eqn.params.values():
        for sub in (param if isinstance(param, (tuple, list)) else (param,)):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            largest = max(largest, walk(inner))
    return largest

  return walk(closed.jaxpr)
