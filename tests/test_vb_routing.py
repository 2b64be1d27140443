"""Variational Bayes routing (capsjax/routing/variational_bayes.py) against a float64 NumPy
re-derivation of the variational Gaussian mixture (Bishop, PRML Sec. 10.2, diagonal
precisions) with the authors' code's assignment rules (at its HEAD, and its first commits),
written here with loops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import digamma, logsumexp

from capsjax import routing
from capsjax.common.errors import UsageError
from capsjax.routing import variational_bayes as vb

CODE = dict(vb.ROUTER.defaults)


def np_vb(votes, acts, beta_u, beta_a, s):
  """votes (b, c, o, d); acts (b, c); one position. Returns m (b, o, d), logits (b, o), R."""
  m, logits, r = np_vb_positions(votes[:, :, :, None], acts[:, :, None], beta_u, beta_a, s)
  return m[:, :, 0], logits[:, :, 0], r[..., 0]


def np_vb_positions(votes, acts, beta_u, beta_a, s, groups=None):
  """votes (b, c, o, P, d); acts (b, c, P). ``groups``: lists of (c, o, P) indices over which
  the code's rule sums p_ij (a convolutional layer's true children); default: over o at each
  (c, P). Returns m (b, o, P, d), logits (b, o, P), R (b, c, o, P)."""
  b, c, o, positions, d = votes.shape
  r = np.full((b, c, o, positions), 1.0 / o)
  alpha0, kappa0, psi0 = s["prior_alpha"], s["prior_kappa"], s["prior_psi"]
  nu0 = d + s["prior_nu_offset"]
  for t in range(s["iterations"]):
    m = np.zeros((b, o, positions, d))
    psi = np.zeros((b, o, positions, d))
    kappa, nu, e_log_pi, e_log_lam = (np.zeros((b, o, positions)) for _ in range(4))
    for n in range(b):
      for q in range(positions):
        alpha = np.zeros(o)
        for j in range(o):
          w = r[n, :, j, q] * acts[n, :, q]
          n_j = w.sum()
          alpha[j] = alpha0 + n_j
          kappa[n, j, q], nu[n, j, q] = kappa0 + n_j, nu0 + n_j
          x = votes[n, :, j, q]
          xbar = (w[:, None] * x).sum(0) / (n_j + s["mass_epsilon"])
          scatter = (w[:, None] * (x - xbar) ** 2).sum(0)
          m[n, j, q] = n_j * xbar / kappa[n, j, q]                             # m0 = 0
          psi[n, j, q] = 1 / (1 / psi0 + scatter + kappa0 * n_j / kappa[n, j, q] * xbar ** 2)
          e_log_lam[n, j, q] = (sum(digamma((nu[n, j, q] + 1 - i) / 2) for i in range(1, d + 1))
                                + d * math.log(2) + np.log(psi[n, j, q]).sum())
        e_log_pi[n, :, q] = digamma(alpha) - digamma(alpha.sum())
    if t == s["iterations"] - 1:
      entropy = 0.5 * d * math.log(2 * math.pi * math.e) - 0.5 * e_log_lam
      return m, beta_a[:, None] - (np.exp(e_log_pi) * entropy + beta_u[:, None]), r
    log_p = np.zeros((b, c, o, positions))
    for n in range(b):
      for i in range(c):
        for j in range(o):
          for q in range(positions):
            quad = (psi[n, j, q] * (votes[n, i, j, q] - m[n, j, q]) ** 2).sum()
            log_p[n, i, j, q] = 0.5 * (e_log_lam[n, j, q] - d * math.log(2 * math.pi)
                                       - d / kappa[n, j, q] - nu[n, j, q] * quad)
    joint = e_log_pi[:, None] + log_p
    if s["assignments"] == "textbook":
      r = np.exp(joint - logsumexp(joint, axis=2, keepdims=True))
    elif s["assignments"] == "first_commits":
      r = np.exp(log_p - logsumexp(joint, axis=2, keepdims=True))
    else:  # HEAD: p / clamp(sum of p over the child's parents, floor).
      p = np.exp(joint)
      total = np.repeat(p.sum(axis=2, keepdims=True), o, axis=2)
      for group in groups or ():
        idx = (slice(None),) + tuple(np.array(group).T)
        total[idx] = p[idx].sum(axis=1, keepdims=True)
      r = p / np.maximum(total, s["normaliser_floor"])


def route(votes, acts, beta_u, beta_a, settings, diagnostics=False):
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  return vb.vb_routing(f32(votes)[:, :, :, None], f32(acts)[:, :, None, None], f32(beta_u),
                       f32(beta_a), settings=settings, diagnostics=diagnostics)


@pytest.mark.parametrize("settings", [
    CODE,
    dict(CODE, assignments="first_commits"),
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
  """Textbook: each child's R sums to 1; first commits: sum_j exp(E ln pi_j) R_ij = 1; HEAD
  (code): p_ij / max(sum_j p_ij, floor), so 1 where the sum is above the floor and the sum
  over the floor where it is not."""
  rng = np.random.default_rng(2)
  votes = jnp.asarray(rng.normal(size=(2, 5, 4, 3, 16)) * 0.1, jnp.float32)
  weights = jnp.asarray(rng.uniform(size=(2, 5, 4, 3)), jnp.float32)
  q = vb.update_posteriors(votes, weights, CODE)
  log_p = vb.log_predictive(votes, q)
  textbook = vb.assignments_from(log_p, q, "textbook")
  first = vb.assignments_from(log_p, q, "first_commits")
  np.testing.assert_allclose(jnp.sum(textbook, axis=2), 1.0, rtol=1e-5)
  np.testing.assert_allclose(jnp.sum(jnp.exp(q.log_mixing)[:, None] * first, axis=2), 1.0,
                             rtol=1e-5)
  assert not np.allclose(jnp.sum(first, axis=2), 1.0, rtol=1e-3)
  joint = np.asarray(q.log_mixing[:, None] + log_p, np.float64)
  totals = np.exp(joint).sum(axis=2)
  assert totals.min() > 1e-11  # Votes of scale 0.1 stay above the floor: code = textbook.
  np.testing.assert_allclose(vb.assignments_from(log_p, q, "code"), textbook, rtol=1e-4,
                             atol=1e-7)
  floor = float(np.median(totals))   # A floor above half the sums: it binds there.
  code = np.asarray(vb.assignments_from(log_p, q, "code", floor), np.float64)
  np.testing.assert_allclose(code.sum(axis=2), totals / np.maximum(totals, floor), rtol=1e-4)
  assert np.sum(totals < floor) > 0 and np.all(code.sum(axis=2) <= 1 + 1e-5)


def route64(votes, acts, beta_u, beta_a, settings, child_sum=None):
  """vb_routing in float64: votes (b, c, o, P, d), acts (b, c, P)."""
  with jax.enable_x64(True):
    result = vb.vb_routing(jnp.asarray(votes, jnp.float64),
                           jnp.asarray(acts, jnp.float64)[:, :, None],
                           jnp.asarray(beta_u, jnp.float64), jnp.asarray(beta_a, jnp.float64),
                           settings=settings, child_sum=child_sum)
    return np.asarray(result.poses), np.asarray(result.activation_logits)


@pytest.mark.parametrize("case", ["above the floor", "the floor binds"])
def test_the_authors_current_rule_in_float64(case):
  """The class layer's routing at HEAD against the NumPy re-derivation to 1e-10, where the
  clamp does not bind (votes of scale 0.1) and where it does (16-dimensional votes of unit
  scale: many children's sums of p_ij fall below the floor of 1e-11, so their R shrink and
  their parents fall back towards the prior)."""
  rng = np.random.default_rng(6)
  scale = 0.1 if case == "above the floor" else 1.0
  votes = rng.normal(size=(2, 7, 3, 1, 16)) * scale + rng.normal(size=(1, 1, 3, 1, 16))
  acts = rng.uniform(0.2, 1.0, size=(2, 7, 1))
  beta_u, beta_a = rng.normal(size=3), rng.normal(size=3)
  poses, logits = route64(votes, acts, beta_u, beta_a, CODE)
  mean, expected, r = np_vb_positions(votes, acts, beta_u, beta_a, CODE)
  np.testing.assert_allclose(poses, mean, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(logits, expected, rtol=1e-10, atol=1e-10)
  bound = r.sum(axis=2) < 1 - 1e-6   # Children whose assignments the floor shrank.
  assert bound.any() == (case == "the floor binds")
  # The first commits' rule differs from HEAD's in both cases.
  _, first = route64(votes, acts, beta_u, beta_a, dict(CODE, assignments="first_commits"))
  assert not np.allclose(first, logits, rtol=1e-3)


@pytest.mark.parametrize("mode", ["child", "patch"])
def test_a_convolutional_layer_normalises_each_child_over_all_its_parents(mode):
  """At stride 2 (3x3 kernels on a 7x7 grid: children in up to four receptive fields), HEAD's
  rule sums a child's p_ij over every parent whose receptive field holds it (``"child"``,
  :class:`capsjax.models.receptive_fields.ReceptiveFieldGrid`), the first commits per receptive
  field (``"patch"``): each against the re-derivation in float64 to 1e-10."""
  from capsjax.models import receptive_fields as fields
  from test_em_routing import np_groups

  rng = np.random.default_rng(7)
  i_types, o_types, k, stride, oh = 2, 3, 3, 2, 3
  votes = rng.normal(size=(2, i_types * k * k, o_types, oh * oh, 16)) * 0.4
  acts = rng.uniform(0.2, 1.0, size=(2, i_types * k * k, oh * oh))
  beta_u, beta_a = rng.normal(size=3), rng.normal(size=3)
  settings = dict(CODE, conv_normalisation=mode)
  child_sum = fields.ReceptiveFieldGrid(i_types, k, stride, oh, oh).child_sum \
      if mode == "child" else None
  poses, logits = route64(votes, acts, beta_u, beta_a, settings, child_sum)
  groups = np_groups(i_types, k, o_types, oh, oh, stride, "child") if mode == "child" else None
  mean, expected, r = np_vb_positions(votes, acts, beta_u, beta_a, settings, groups)
  np.testing.assert_allclose(poses, mean, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(logits, expected, rtol=1e-10, atol=1e-10)
  if mode == "child":  # Every true child's assignments sum to one over all its parents.
    for group in groups:
      np.testing.assert_allclose(r[(slice(None),) + tuple(np.array(group).T)].sum(1), 1.0)


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
                                       ("conv_normalisation", "field"),
                                       ("normaliser_floor", 0.0),
                                       ("prior_nu_offset", -1.0), ("iterations", 0),
                                       ("mass_epsilon", -1e-7)])
def test_bad_settings_are_named(key, value):
  with pytest.raises(UsageError, match=rf"config\.model\.routing\.{key}=.* is out of range"):
    routing.resolve({"name": "variational_bayes", key: value})
