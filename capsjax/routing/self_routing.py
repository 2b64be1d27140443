"""Self-routing (router ``"self_routing"``): each child routes itself, no iteration.

Hahn, Pyeon & Kim, NeurIPS 2019 ("Self-routing capsule networks"), as the reference code has
it (coder3000/SR-CapsNet, ``modules.py``, ``SelfRouting2d`` over all children at once, the
fully connected case)::

    logit_ij = W^route_ij . u_i + b^route_ij        # a learned routing matrix per child
    c_ij     = softmax_j(logit_ij)                  # over parents
    a_j      = sum_i c_ij a_i / sum_i a_i           # parent activation
    p_j      = sum_i c_ij a_i u_hat_{j|i} / sum_i c_ij a_i     # parent pose

``W^route`` (in_caps, out_caps, in_dim) and ``b^route`` (in_caps, out_caps) start at zero (as the
code's ``W2`` and ``b2``), so routing starts uniform. No squash; the parents' activations a_j
are the class scores (``model.class_capsules.scores``).

Where we differ from the reference, and why:

* The children's activations a_i are their lengths |u_i| (capsjax's primary capsules are
  squashed vectors); SR-CapsNet computes them with a separate convolution and a sigmoid.
* The divisions get a floor of 1e-12: a length can be 0 (the reference's sigmoids cannot; no floor).
* The reference's class layer (``pose_out=False``) computes no parent poses; here the poses are
  computed as in its hidden layers, for the reconstruction network.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from capsjax.routing.core import coupling_statistics
from capsjax.routing.router import ParamSpec, Router, RoutingResult

SETTINGS: dict = {}  # One pass, nothing to set.
_FLOOR = 1e-12


def parameters(in_caps: int, in_dim: int, out_caps: int, out_dim: int, settings: dict) -> dict:
  """The routing matrices and biases, zeros."""
  del out_dim, settings
  return {"route_weights": ParamSpec((in_caps, out_caps, in_dim), "zeros"),
          "route_bias": ParamSpec((in_caps, out_caps), "zeros")}


def route(votes, *, inputs, activations, params, rng=None, settings=None, train=False,
          diagnostics=False) -> RoutingResult:
  """Self-routing of the votes (the interface: :mod:`capsjax.routing`; ``inputs`` u_i and
  ``activations`` a_i >= 0 are used); ``params``: ``route_weights`` ``(in_caps, out_caps, in_dim)``,
  ``route_bias`` ``(in_caps, out_caps)``. Parent activations are in [0, 1]; diagnostics (one
  iteration): ``coupling_entropy``, ``coupling_max`` and ``parent_activation_max`` (the mean over
  examples of the largest a_j; the a_j of an example sum to 1)."""
  del rng, settings, train
  logits = jnp.einsum("bik,ijk->bij", inputs, params["route_weights"]) + params["route_bias"]
  coupling = jax.nn.softmax(logits, axis=2)
  weighted = coupling * activations[:, :, None]                       # c_ij a_i
  weighted_sum = jnp.sum(weighted, axis=1)                            # (batch, out_caps)
  parent_activations = weighted_sum / jnp.maximum(
      jnp.sum(activations, axis=1, keepdims=True), _FLOOR)
  poses = jnp.einsum("bijd,bij->bjd", votes, weighted) / jnp.maximum(weighted_sum, _FLOOR)[
      ..., None]
  if not diagnostics:
    return RoutingResult(poses, parent_activations, {})
  measured = coupling_statistics(coupling)
  measured["parent_activation_max"] = jnp.max(parent_activations, axis=1)
  return RoutingResult(poses, parent_activations, {k: v[:, None] for k, v in measured.items()})


ROUTER = Router(name="self_routing", settings=SETTINGS, route=route, parameters=parameters,
                yields_activations=True, squashes=False)
