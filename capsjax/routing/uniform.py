"""Uniform coupling (router ``"uniform"``): the "no routing" control.

Every child sends its vote to every parent with the same weight, c_ij = 1/out_caps, and there
is no iteration and no agreement::

    s_j = sum_i (1/out_caps) u_hat_{j|i} (+ bias)
    v_j = squash(s_j)                           # Eq. 1 of Sabour et al.

This is dynamic routing with one iteration (Procedure 1 with r = 1 computes exactly this), the
control of Paik et al. 2019 ("Capsule networks need an improved routing algorithm") and Gu &
Tresp 2020, who found it often as accurate as routing by agreement.
"""

from __future__ import annotations

import jax.numpy as jnp

from capsjax.routing.core import coupled_parents
from capsjax.routing.router import SQUASH_EPSILON, Router, RoutingResult

SETTINGS = {"squash_epsilon": SQUASH_EPSILON}


def route(votes, *, inputs=None, activations=None, params=None, rng=None, settings,
          train=False, diagnostics=False) -> RoutingResult:
  """Parents from uniformly coupled votes (the interface, ``params["bias"] (out_caps, out_dim)``
  on s_j included: :mod:`capsjax.routing`). Diagnostics (one iteration): ``coupling_entropy``
  (log out_caps, the maximum), ``coupling_max`` (1/out_caps) and ``preactivation_norm``."""
  del inputs, activations, rng, train
  coupling = jnp.full(votes.shape[:3], 1.0 / votes.shape[2], votes.dtype)
  return coupled_parents(votes, coupling, bias=(params or {}).get("bias"),
                         squash_epsilon=settings["squash_epsilon"], diagnostics=diagnostics)


ROUTER = Router(name="uniform", settings=SETTINGS, route=route, uses_parent_bias=True)
