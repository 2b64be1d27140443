"""EM routing's arithmetic, written once: the inverse-temperature schedule, the M-step's
formulas for each parent and the E-step's distance of a vote from a parent, for the router's loop
(:func:`capsjax.routing.em.em_routing`) and the two forms it replaced
(``experiments/em_loop_forms.py``); only the sums over the children are each form's own.

Names as in :mod:`capsjax.routing.em`: ``w = R a`` the weights of the children's votes V,
``m0 = sum_i w``, ``S1 = sum_i w V``, ``S2 = sum_i w (V - mu)^2`` (sums over the children), each
parent-sized: ``(batch, out_caps, positions[, D])``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

LOG_2PI = math.log(2.0 * math.pi)


def schedule(settings: dict, dtype) -> jax.Array:
  """``lambda_t = lambda (1 - growth^(t+1))``, ``t = 0 .. iterations-1`` (the code's schedule), of
  EM's ``settings``, ``(iterations,)`` in ``dtype`` (the votes': a float64 run's is float64)."""
  t = jnp.arange(1, settings["iterations"] + 1, dtype=dtype)
  return settings["inverse_temperature"] * (1.0 - settings["temperature_growth"] ** t)


def damped_mean(s1: jax.Array, m0: jax.Array, previous_mean: jax.Array,
                settings: dict) -> jax.Array:
  """``mu = (1 - delta) S1 / (m0 + eps) + delta mu_prev`` (the code's damping ``delta``,
  ``mean_damping``), ``(batch, out_caps, positions, D)``."""
  mass = m0 + settings["mass_epsilon"]
  damping = settings["mean_damping"]
  return (1.0 - damping) * (s1 / mass[..., None]) + damping * previous_mean


class Fit(NamedTuple):
  """A parent's Gaussian and activation after the M-step.

  Attributes:
    variance: ``min_var + S2 / (m0 + eps)``, ``(batch, out_caps, positions, D)``.
    logit: ``lambda (cost - 5000 beta_a)``, ``cost = (m0 + eps) (-sum_h log var - beta_u D (log
      2 pi + 1))``; the activation is its sigmoid. ``(batch, out_caps, positions)``.
    log_normaliser: the E-step's per-parent term ``log sigmoid(logit) - (D log 2 pi + sum_h log
      var) / 2``, ``(batch, out_caps, positions)``.
  """
  variance: jax.Array
  logit: jax.Array
  log_normaliser: jax.Array


def fit(s2: jax.Array, m0: jax.Array, beta_u: jax.Array, beta_a: jax.Array,
        inverse_temperature, settings: dict) -> Fit:
  """The M-step's variance, activation logit and log-normaliser from ``S2`` and ``m0``
  (``beta_u``, ``beta_a``: ``(out_caps,)``; ``inverse_temperature``: lambda_t, a scalar)."""
  d = s2.shape[-1]
  mass = m0 + settings["mass_epsilon"]
  variance = settings["min_variance"] + s2 / mass[..., None]
  log_det = jnp.sum(jnp.log(variance), axis=-1)                             # sum_h log var
  cost = mass * (-log_det - beta_u[:, None] * d * (LOG_2PI + 1.0))
  logit = inverse_temperature * (cost - settings["activation_bias_scale"] * beta_a[:, None])
  return Fit(variance, logit, jax.nn.log_sigmoid(logit) - 0.5 * (d * LOG_2PI + log_det))


def scaled_distance(votes: jax.Array, mean: jax.Array, variance: jax.Array) -> jax.Array:
  """The E-step's ``sum_h (V_h - mu_h)^2 / (2 var_h)``, over the last axis, with ``mean`` and
  ``variance`` broadcast against ``votes`` (the caller inserts the children's axis); so
  ``log p_ij = log_normaliser_j - scaled_distance``."""
  return jnp.sum(jnp.square(votes - mean) / (2.0 * variance), axis=-1)
