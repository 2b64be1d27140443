"""Inverted dot-product attention routing (router ``"inverted_dot_product"``).

Tsai, Srivastava, Goh & Salakhutdinov, ICLR 2020 ("Capsules with inverted dot-product
attention routing"), Procedure 1, as the reference code has it
(apple/ml-capsules-inverted-attention-routing, ``src/layers.py``, ``CapsuleFC.forward``)::

    p_j  <- 0                                        # so the first coupling is uniform
    repeat iterations times:
      a_ij = p_j . u_hat_{j|i} / sqrt(out_dim)       # agreement (Eq. 2)
      r_ij = softmax_j(a_ij)                         # over parents (Eq. 3)
      p_j  = LayerNorm(sum_i r_ij u_hat_{j|i})       # pose update, learned LayerNorm (Eq. 4)

No squash: the poses are layer-normalised, so their lengths barely differ between classes and
cannot score them. The reference scores each class capsule with one shared linear map
(``CapsModel.final_fc = nn.Linear(caps_dim, 1)``) and trains the logits with cross-entropy; here
the parents' activations are its sigmoid, ``a_j = sigmoid(w . p_j + c)``, in (0, 1) for the
margin loss, and the class scores by default (``model.class_capsules.scores``). ``iterations``
counts every pass, the uniform first one included: the reference's ``num_routing + 1``
(``CapsModel.forward`` runs the uniform pass, then ``for n in range(self.num_routing)``). Its
``main_capsule.py`` defaults to ``--num_routing=1`` (2 passes, our default); its README's
commands use ``--num_routing=2`` (``iterations=3`` here).

Where the paper and the reference code differ, and which we follow:

* The code scales the agreement by ``1/sqrt(out_dim)`` (``self.scale``); the paper's Eq. 2 has
  no scale. We follow the code (``agreement_scale="code"``; ``"paper"`` for none).
* The code renormalises the softmax (``r / (sum r + 1e-10)``): no change beyond rounding; left out.
* The LayerNorm is torch's ``nn.LayerNorm(out_dim)``: over each pose's out_dim entries, scale
  and offset of shape (out_dim,) shared by all parents, epsilon 1e-5.
* The code's dropout on the poses (rate 0 in its configs) is left out.
* The reference layer-normalises its primary capsules instead of squashing them; capsjax's
  backbone squashes them for every router.
* The readout's ``w`` starts normal(0, 1/out_dim) (torch's Linear: uniform of that order), ``c`` 0.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from capsjax.config.settings import POSITIVE, Setting, one_of
from capsjax.routing.core import coupling_statistics, safe_norm
from capsjax.routing.router import (ParamSpec, Router, RoutingResult, iterations_setting,
                                    per_iteration)

AGREEMENT_SCALES = ("code", "paper")
SETTINGS = {
    "iterations": iterations_setting(2, "Passes, the uniform first included: the reference's "
                                     "num_routing=1."),
    "agreement_scale": Setting("code", "\"code\": a_ij / sqrt(out_dim); \"paper\": unscaled "
                               "(Eq. 2).", check=one_of(*AGREEMENT_SCALES)),
    "layer_norm_epsilon": Setting(1e-5, "torch's nn.LayerNorm default.", check=POSITIVE),
}


def _readout_init(key, shape):
  return jax.random.normal(key, shape) / math.sqrt(shape[0])


def parameters(in_caps: int, in_dim: int, out_caps: int, out_dim: int, settings: dict) -> dict:
  """The LayerNorm's scale (ones) and offset (zeros), ``(out_dim,)`` each, as torch's; the
  readout's weights ``(out_dim,)`` and bias ``(1,)``."""
  del in_caps, in_dim, out_caps, settings
  return {"layer_norm_scale": ParamSpec((out_dim,), "ones"),
          "layer_norm_offset": ParamSpec((out_dim,), "zeros"),
          "readout_weights": ParamSpec((out_dim,), _readout_init),
          "readout_bias": ParamSpec((1,), "zeros")}


def layer_norm(x: jax.Array, scale: jax.Array, offset: jax.Array, epsilon: float) -> jax.Array:
  """LayerNorm over the last axis (biased variance, as torch)."""
  mean = jnp.mean(x, axis=-1, keepdims=True)
  variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(variance + epsilon) * scale + offset


def route(votes, *, inputs=None, activations=None, params, rng=None, settings,
          train=False, diagnostics=False) -> RoutingResult:
  """Inverted dot-product attention routing (the interface: :mod:`capsjax.routing`; ``params``:
  :func:`parameters`; the activations: the module docstring's readout); diagnostics per
  iteration: ``coupling_entropy``, ``coupling_max``, ``agreement`` (mean a_ij) and
  ``pose_change`` (mean |p^r - p^(r-1)| over parents, from p = 0 for the first)."""
  del inputs, activations, rng, train
  batch, in_caps, out_caps, out_dim = votes.shape
  scale = 1.0 / math.sqrt(out_dim) if settings["agreement_scale"] == "code" else 1.0

  def update(coupling):
    pose = jnp.einsum("bijd,bij->bjd", votes, coupling)
    return layer_norm(pose, params["layer_norm_scale"], params["layer_norm_offset"],
                      settings["layer_norm_epsilon"])

  def measure(coupling, agreement, pose, previous):
    return {**coupling_statistics(coupling), "agreement": jnp.mean(agreement, axis=(1, 2)),
            "pose_change": jnp.mean(safe_norm(pose - previous), axis=1)}

  # p = 0 makes every a_ij 0: the first coupling is the uniform constant.
  coupling = jnp.full((batch, in_caps, out_caps), 1.0 / out_caps, votes.dtype)
  agreement = jnp.zeros_like(coupling)
  pose = update(coupling)
  rows = [measure(coupling, agreement, pose, jnp.zeros_like(pose))] if diagnostics else []
  for _ in range(settings["iterations"] - 1):  # Static and small: unrolled.
    agreement = scale * jnp.einsum("bijd,bjd->bij", votes, pose)
    coupling = jax.nn.softmax(agreement, axis=2)
    previous, pose = pose, update(coupling)
    if diagnostics:
      rows.append(measure(coupling, agreement, pose, previous))
  activations = jax.nn.sigmoid(pose @ params["readout_weights"] + params["readout_bias"])
  return RoutingResult(pose, activations, per_iteration(rows) if diagnostics else {})


ROUTER = Router(name="inverted_dot_product", settings=SETTINGS, route=route,
                parameters=parameters, yields_activations=True, squashes=False)
