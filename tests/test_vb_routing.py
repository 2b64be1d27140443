"""Variational Bayes routing (capsjax/routing/variational_bayes.py) against a float64 NumPy
re-derivation of the variational Gaussian mixture (Bishop, PRML Sec. 10.2, diagonal
precisions) with the authors' code's assignment rule, written here with loops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import digamma, logsumexp

from capsjax.common.errors import UsageError
from capsjax.routing import variational_bayes as vb

CODE = dict(vb.SETTINGS)


def np_vb(votes, acts, beta_u, beta_a, s):
  """votes (b, c, o, d); acts (b, c); one position. Returns m (b, o, d), logits (b, o), R."""
  b, c, o, d = votes.shape
  r = np.full((b, c, o), 1.0 / o)
  alpha0, kappa0, psi0 = s["prior_alpha"], s["prior_kappa"], s["prior_psi"]
  nu0 = d + s["prior_nu_offset"]
  for t in range(s["iterations"]):
    m = np.zeros((b, o, d))
    psi = np.zeros((b, o, d))
    kappa, nu, e_log_pi, e_log_lam = (np.zeros((b, o)) for _ in range(4))
    for n in range(b):
      alpha = np.zeros(o)
      for j in range(o):
        w = r[n, :, j] * acts[n]
        n_j = w.sum()
        alpha[j] = alpha0 + n_j
        kappa[n, j], nu[n, j] = kappa0 + n_j, nu0 + n_j
        xbar = (w[:, None] * votes[n, :, j]).sum(0) / (n_j + s["mass_epsilon"])
        scatter = (w[:, None] * (votes[n, :, j] - xbar) ** 2).sum(0)
        m[n, j] = n_j * xbar / kappa[n, j]                             # m0 = 0
        psi[n, j] = 1 / (1 / psi0 + scatter + kappa0 * n_j / kappa[n, j] * xbar ** 2)
        e_log_lam[n, j] = (sum(digamma((nu[n, j] + 1 - i) / 2) for i in range(1, d + 1))
                           + d * math.log(2) + np.log(psi[n, j]).sum())
      e_log_pi[n] = digamma(alpha) - digamma(alpha.sum())
    if t == s["iterations"] - 1:
      entropy = 0.5 * d * math.log(2 * math.pi * math.e) - 0.5 * e_log_lam
      return m, beta_a - (np.exp(e_log_pi) * entropy + beta_u), r
    log_p = np.zeros((b, c, o))
    for n in range(b):
      for i in range(c):
        for j in range(o):
          quad = (psi[n, j] * (votes[n, i, j] - m[n, j]) ** 2).sum()
          log_p[n, i, j] = 0.5 * (e_log_lam[n, j] - d * math.log(2 * math.pi)
                                  - d / kappa[n, j] - nu[n, j] * quad)
    joint = e_log_pi[:, None] + log_p
    if s["assignments"] == "textbook":
      r = np.exp(joint - logsumexp(joint, axis=2, keepdims=True))
    else:
      r = np.exp(log_p - logsumexp(joint, axis=2, keepdims=True))


def route(votes, acts, beta_u, beta_a, settings, diagnostics=False):
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  return vb.vb_routing(f32(votes)[:, :, :, None], f32(acts)[:, :, None, None], f32(beta_u),
                       f32(beta_a), settings=settings, diagnostics=diagnostics)


@pytest.mark.parametrize("settings", [
    CODE,
    dict(CODE, assignments="textbook"),
    dict(CODE, prior_kappa=0.5, prior_psi=2.0, prior_alpha=0.7, prior_nu_offset=3.0),
    dict(CODE, iterations=1),
])
def test_matches_the_variational_mixture_re_derived_in_numpy(settings):
  rng = np.random.default_rng(1)
  votes = rng.normal(size=(2, 6, 3, 4)) * 0.5 + rng.normal(size=(1, 1, 3, 4))
  acts = rng.uniform(0.1, 1.0, size=(2, 6))
  beta_u, beta_a = rng.normal(size=3), rng.normal(size=3)
  result = route(votes, acts, beta_u, beta_a, settings)
  mean, logits, _ = np_vb(votes, acts, beta_u, beta_a, settings)
  np.testing.assert_allclose(result.poses[:, :, 0], mean, rtol=2e-4, atol=1e-5)
  np.testing.assert_allclose(result.activation_logits[:, :, 0], logits, rtol=2e-4, atol=1e-4)


def test_assignment_rules_normalise_as_documented():
  """Textbook: each child's R sums to 1; code: sum_j exp(E ln pi_j) R_ij = 1."""
  rng = np.random.default_rng(2)
  votes = jnp.asarray(rng.normal(size=(2, 5, 4, 3, 16)), jnp.float32)
  weights = jnp.asarray(rng.uniform(size=(2, 5, 4, 3)), jnp.float32)
  q = vb.update_posteriors(votes, weights, CODE)
  log_p = vb.log_predictive(votes, q)
  textbook = vb.assignments_from(log_p, q, "textbook")
  code = vb.assignments_from(log_p, q, "code")
  np.testing.assert_allclose(jnp.sum(textbook, axis=2), 1.0, rtol=1e-5)
  np.testing.assert_allclose(jnp.sum(jnp.exp(q.log_mixing)[:, None] * code, axis=2), 1.0,
                             rtol=1e-5)
  assert not np.allclose(jnp.sum(code, axis=2), 1.0, rtol=1e-3)


def test_a_parent_with_identical_votes_keeps_a_finite_variance():
  """The Wishart prior bounds the expected precision where EM's variance would go to its
  floor: identical votes give Psi = 1 / (1/psi0 + kappa0 R/kappa xbar^2), not infinity."""
  votes = jnp.ones((1, 4, 2, 1, 16), jnp.float32) * 0.3
  q = vb.update_posteriors(votes, jnp.full((1, 4, 2, 1), 0.5), CODE)
  expected = 1 / (1 + 1.0 * 2.0 / 3.0 * 0.09)                    # R_j = 2, kappa_j = 3
  np.testing.assert_allclose(q.precision_scale, expected, rtol=1e-6)


def test_finite_values_and_gradients_in_degenerate_cases():
  rng = np.random.default_rng(3)
  cases = {"inactive children": (rng.normal(size=(2, 6, 3, 16)), np.zeros((2, 6))),
           "one child": (rng.normal(size=(2, 1, 3, 16)), np.ones((2, 1))),
           "identical votes": (np.ones((2, 6, 3, 16)), np.ones((2, 6))),
           "large votes": (rng.normal(size=(2, 6, 3, 16)) * 1e4, np.ones((2, 6)))}
  for name, (votes, acts) in cases.items():
    def loss(votes, acts):
      result = route(votes, acts, np.zeros(3), np.zeros(3), CODE)
      return jnp.sum(result.poses ** 2) + jnp.sum(jax.nn.sigmoid(result.activation_logits))
    # Jitted, as training runs it (and one program, not an eager compilation per operation).
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(
        jnp.asarray(votes, jnp.float32), jnp.asarray(acts, jnp.float32))
    assert np.isfinite(value), name
    assert all(np.isfinite(g).all() for g in grads), name


def test_stop_gradient_cuts_the_assignments_path_only():
  rng = np.random.default_rng(4)
  votes = jnp.asarray(rng.normal(size=(1, 5, 3, 1, 4)), jnp.float32)
  acts = jnp.ones((1, 5, 1, 1))

  def grad(settings):
    f = lambda v: jnp.sum(vb.vb_routing(v, acts, jnp.zeros(3), jnp.zeros(3),
                                        settings=settings).activation_logits)
    return jax.jit(jax.grad(f))(votes)

  full, stopped = grad(CODE), grad(dict(CODE, stop_gradient=True))
  assert np.all(np.isfinite(stopped)) and np.abs(stopped).sum() > 0
  assert not np.allclose(full, stopped, rtol=1e-3)
  # With one iteration there are no assignments to stop.
  np.testing.assert_allclose(grad(dict(CODE, iterations=1)),
                             grad(dict(CODE, iterations=1, stop_gradient=True)), rtol=1e-6)


def test_diagnostics_per_iteration():
  rng = np.random.default_rng(5)
  result = route(rng.normal(size=(2, 6, 3, 16)), rng.uniform(size=(2, 6)), np.zeros(3),
                 np.zeros(3), CODE, diagnostics=True)
  assert set(result.diagnostics) == {"coupling_entropy", "log_sigma", "mixing_entropy"}
  for value in result.diagnostics.values():
    assert value.shape == (2, 3) and np.isfinite(value).all()
  # The first iteration's assignments are uniform over 3 parents: log 3 nats per child; later
  # ones (the code's rule, unnormalised) are measured normalised: within [0, log 3].
  np.testing.assert_allclose(result.diagnostics["coupling_entropy"][:, 0], math.log(3),
                             rtol=1e-5)
  assert np.all(result.diagnostics["coupling_entropy"] >= 0)
  assert np.all(result.diagnostics["coupling_entropy"] <= math.log(3) + 1e-5)
  # Convolutional layout: 4 positions, each child routed on its own, the same measure.
  conv = vb.vb_routing(jnp.asarray(rng.normal(size=(2, 6, 3, 4, 16)), jnp.float32),
                       jnp.ones((2, 6, 1, 4)), jnp.zeros(3), jnp.zeros(3), settings=CODE,
                       diagnostics=True)
  np.testing.assert_allclose(conv.diagnostics["coupling_entropy"][:, 0], math.log(3),
                             rtol=1e-5)


@pytest.mark.parametrize("key,value", [("assignments", "bishop"), ("prior_alpha", 0.0),
                                       ("prior_nu_offset", -1.0), ("iterations", 0),
                                       ("mass_epsilon", -1e-7)])
def test_bad_settings_are_named(key, value):
  with pytest.raises(UsageError, match=key):
    vb.check(dict(CODE, **{key: value}))
