"""Self-attention routing (router ``"self_attention"``): Efficient-CapsNet's, one pass.

Mazzia, Salvetti & Chiaberge 2021 ("Efficient-CapsNet: capsule network with self-attention
routing", arXiv 2101.12491), as the reference code has it (EscVM/Efficient-CapsNet,
``utils/layers.py``, ``FCCaps.call``)::

    A_ij = u_hat_{j|i} . sum_k u_hat_{j|k} / sqrt(out_dim)   # self-agreement of the votes
    c_ij = softmax_j(A_ij)                                   # over parents
    s_j  = sum_i (c_ij + b_ji) u_hat_{j|i}                   # b: learned, (out_caps, in_caps)
    v_j  = (1 - e^{-|s_j|}) s_j / |s_j|                      # their squash

Where we differ from the reference code, and why:

* The bias ``b`` is added after the softmax, as the code does (``c = softmax(c); c = c + b``);
  it starts at zero (``tf.zeros_initializer``).
* The squash is computed without the code's fuzz factor 1e-20 (:func:`exp_squash`), which has
  the same value wherever that factor is negligible and a finite gradient at 0.

The coupling's entropy is measured on the softmax, before the bias is added.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from capsjax.routing.core import coupling_statistics, exp_squash, safe_norm
from capsjax.routing.router import ParamSpec, Router, RoutingResult

SETTINGS: dict = {}  # One pass, nothing to set.


def parameters(in_caps: int, in_dim: int, out_caps: int, out_dim: int, settings: dict) -> dict:
  """The bias b added to the coupling after the softmax, zeros."""
  del in_dim, out_dim, settings
  return {"bias": ParamSpec((out_caps, in_caps), "zeros")}


def route(votes, *, inputs=None, activations=None, params, rng=None, settings=None,
          train=False, diagnostics=False) -> RoutingResult:
  """One pass of self-attention routing (the interface: :mod:`capsjax.routing`); ``params``:
  ``{"bias": (out_caps, in_caps)}``. Diagnostics (one iteration): ``coupling_entropy``,
  ``coupling_max`` (of the softmax), ``agreement`` (mean A_ij), ``preactivation_norm``."""
  del inputs, activations, rng, settings, train
  out_dim = votes.shape[3]
  agreement = jnp.einsum("bijd,bjd->bij", votes, jnp.sum(votes, axis=1)) / math.sqrt(out_dim)
  coupling = jax.nn.softmax(agreement, axis=2)
  preactivation = jnp.einsum("bijd,bij->bjd", votes, coupling + params["bias"].T)
  capsules = exp_squash(preactivation)
  if not diagnostics:
    return RoutingResult(capsules, None, {})
  measured = {**coupling_statistics(coupling), "agreement": jnp.mean(agreement, axis=(1, 2)),
              "preactivation_norm": jnp.mean(safe_norm(preactivation), axis=1)}
  return RoutingResult(capsules, None, {k: v[:, None] for k, v in measured.items()})


ROUTER = Router(name="self_attention", settings=SETTINGS, route=route, parameters=parameters)
