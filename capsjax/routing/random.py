"""Random coupling (router ``"random"``): Paik et al. 2019's second control.

Paik, Kwak & Kim 2019 ("Capsule networks need an improved routing algorithm", arXiv
1907.13327) compare routing algorithms with baselines that "assign the connection strengths
uniformly or randomly". Here the coupling comes from a softmax over parents of Gaussian
logits, with no agreement and no iteration::

    b_ij ~ normal(0, logit_scale**2)          # fresh per example and training step
    c_i  = softmax_j(b_i)
    s_j  = sum_i c_ij u_hat_{j|i} (+ bias)
    v_j  = squash(s_j)                         # Eq. 1 of Sabour et al.

At evaluation the logits come from a fixed key (``eval_seed``), so every evaluation of the same
batch sees the same coupling. The text gives no distribution for its random strengths; the
Gaussian logit and its scale 1 are ours (``logit_scale``; 0 is the uniform control).
"""

from __future__ import annotations

import jax

from capsjax.config.settings import NON_NEGATIVE, Setting
from capsjax.routing.core import coupled_parents
from capsjax.routing.router import SQUASH_EPSILON, Router, RoutingResult

SETTINGS = {
    "logit_scale": Setting(1.0, "The std of the Gaussian logits (0: uniform coupling; the "
                           "text gives none: ours).", check=NON_NEGATIVE),
    "eval_seed": Setting(0, "The fixed key of the evaluation coupling."),
    "squash_epsilon": SQUASH_EPSILON,
}


def route(votes, *, inputs=None, activations=None, params=None, rng=None, settings,
          train=False, diagnostics=False) -> RoutingResult:
  """Parents from randomly coupled votes (the interface, ``params["bias"] (out_caps, out_dim)``
  on s_j included: :mod:`capsjax.routing`; ``rng`` required when ``train``). Diagnostics (one
  iteration): ``coupling_entropy``, ``coupling_max``, ``preactivation_norm``."""
  del inputs, activations
  if train and rng is None:
    raise ValueError("The random router needs a key in training (rng=...).")
  key = rng if train else jax.random.PRNGKey(settings["eval_seed"])
  logits = settings["logit_scale"] * jax.random.normal(key, votes.shape[:3], votes.dtype)
  return coupled_parents(votes, jax.nn.softmax(logits, axis=2), bias=(params or {}).get("bias"),
                         squash_epsilon=settings["squash_epsilon"], diagnostics=diagnostics)


ROUTER = Router(name="random", settings=SETTINGS, route=route, uses_parent_bias=True)
