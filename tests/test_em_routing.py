"""EM routing (capsjax/routing/em.py) and its convolutional layers (capsjax/models/capsule_layers.py, receptive_fields.py)
against NumPy re-derivations of the authors' code's equations, in float64 with loops."""

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from capsjax import routing
from capsjax.models import capsule_layers, conv_capsules
from capsjax.models import receptive_fields as fields
from capsjax.routing import em
from capsjax.common.errors import UsageError

CODE = dict(em.ROUTER.defaults)
CONV = dict(CODE, inverse_temperature=0.01, mass_epsilon=1e-7, beta_u_init=0.5, beta_a_init=0.5)


def np_log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


def np_parents(votes, weights, previous, beta_u, beta_a, lam, s):
  """M-step over axis 1 (children): votes (b, c, o, p, d), weights (b, c, o, p)."""
  d = votes.shape[-1]
  mass = weights.sum(1) + s["mass_epsilon"]
  mean = ((1 - s["mean_damping"]) * (weights[..., None] * votes).sum(1) / mass[..., None]
          + s["mean_damping"] * previous)
  var = s["min_variance"] + (weights[..., None] * (votes - mean[:, None]) ** 2).sum(1) / mass[
      ..., None]
  entropy_cost = mass * (np.log(var).sum(-1) + beta_u[:, None] * d * (math.log(2 * math.pi) + 1))
  logit = lam * (-entropy_cost - s["activation_bias_scale"] * beta_a[:, None])
  # log a_j + sum_h log N(v_h; mu_h, var_h), each Gaussian written out.
  log_density = (-0.5 * np.log(2 * math.pi * var[:, None])
                 - (votes - mean[:, None]) ** 2 / (2 * var[:, None])).sum(-1)
  return mean, logit, np_log_sigmoid(logit)[:, None] + log_density


def np_em(votes, acts, beta_u, beta_a, s, normalise, initial):
  """votes (b, c, o, p, d), acts (b, c, 1, p)."""
  r = initial
  mean = np.zeros((votes.shape[0],) + votes.shape[2:])
  for t in range(s["iterations"]):
    lam = s["inverse_temperature"] * (1 - s["temperature_growth"] ** (t + 1))
    mean, logit, log_p = np_parents(votes, r * acts, mean, beta_u, beta_a, lam, s)
    r = normalise(log_p)
  return mean, 1 / (1 + np.exp(-logit))


def np_softmax(x, axis):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def test_fully_connected_em_routing_matches_the_equations():
  rng = np.random.default_rng(0)
  votes = rng.normal(size=(3, 7, 4, 16))
  acts = rng.uniform(size=(3, 7))
  beta_u, beta_a = rng.normal(size=4), rng.normal(size=4) * 1e-3
  result = em.route(jnp.asarray(votes, jnp.float32), activations=jnp.asarray(acts, jnp.float32),
                    params={"beta_u": jnp.asarray(beta_u, jnp.float32),
                            "beta_a": jnp.asarray(beta_a, jnp.float32)}, settings=CODE)
  mean, active = np_em(votes[:, :, :, None], acts[:, :, None, None], beta_u, beta_a, CODE,
                       lambda lp: np_softmax(lp, 2), np.full((3, 7, 4, 1), 0.25))
  np.testing.assert_allclose(result.capsules, mean[:, :, 0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(result.activations, active[:, :, 0], rtol=1e-4, atol=1e-6)
  # One iteration is one M-step from uniform assignments: the weighted mean, damped.
  one = em.route(jnp.asarray(votes, jnp.float32), activations=jnp.asarray(acts, jnp.float32),
                 params={"beta_u": jnp.zeros(4), "beta_a": jnp.zeros(4)},
                 settings=dict(CODE, iterations=1))
  shares = np.repeat(acts[:, :, None] / 4, 4, axis=2)                  # R a, R = 1/4
  expected = 0.9 * np.einsum("bio,biod->bod", shares, votes) / (shares.sum(1) + 1e-5)[..., None]
  np.testing.assert_allclose(one.capsules, expected, rtol=1e-4, atol=1e-5)


def np_conv_votes(poses, weights, stride):
  """Votes (b, i*k*k, o, oh*ow, 16) and child activations' index map, by loops."""
  b, h, w, i_types, _ = poses.shape
  _, k, _, o_types, p, _ = weights.shape
  oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
  votes = np.zeros((b, i_types, k, k, o_types, oh, ow, p * p))
  for i in range(i_types):
    for dy in range(k):
      for dx in range(k):
        for y in range(oh):
          for x in range(ow):
            child = poses[:, stride * y + dy, stride * x + dx, i].reshape(b, p, p)
            for o in range(o_types):
              votes[:, i, dy, dx, o, y, x] = (child @ weights[i, dy, dx, o]).reshape(b, -1)
  return votes.reshape(b, i_types * k * k, o_types, oh * ow, p * p), (oh, ow)


def np_groups(i_types, k, o_types, oh, ow, stride, by):
  """Index groups of the flat (c = i*k*k, o, p = oh*ow) assignment array over which the
  normalisation runs, per example."""
  groups = collections.defaultdict(list)
  for i in range(i_types):
    for dy in range(k):
      for dx in range(k):
        for o in range(o_types):
          for y in range(oh):
            for x in range(ow):
              c, p = (i * k + dy) * k + dx, y * ow + x
              if by == "code":          # Same type pair, stride-1 child index.
                key = (i, o, y + dy, x + dx)
              elif by == "child":       # The true child: every output type.
                key = (i, stride * y + dy, stride * x + dx)
              else:                     # "patch": output types at one slot.
                key = (i, dy, dx, y, x)
              groups[key].append((c, o, p))
  return list(groups.values())


def np_normalise(log_p, groups, mode, i_types, k):
  out = np.zeros_like(log_p)
  b = log_p.shape[0]
  if mode == "code":  # exp(lp - max over the type pair's positions and offsets) / (sum + 1e-7)
    c, o, p = log_p.shape[1:]
    grid = log_p.reshape(b, i_types, k * k, o, p)
    peak = grid.max(axis=(2, 4), keepdims=True)
    e = np.exp(grid - peak).reshape(log_p.shape)
    for group in groups:
      idx = tuple(np.array(group).T)
      total = e[(slice(None),) + idx].sum(axis=1, keepdims=True)
      out[(slice(None),) + idx] = e[(slice(None),) + idx] / (total + 1e-7)
    return out
  for group in groups:
    idx = tuple(np.array(group).T)
    out[(slice(None),) + idx] = np_softmax(log_p[(slice(None),) + idx], axis=1)
  return out


@pytest.mark.parametrize("mode", fields.NORMALISATIONS)
@pytest.mark.parametrize("stride", [1, 2])
def test_convolutional_em_layer_matches_the_equations(mode, stride):
  rng = np.random.default_rng(1)
  i_types, o_types, k = 2, 3, 3
  poses = rng.normal(size=(2, 7, 7, i_types, 16))
  acts = rng.uniform(size=(2, 7, 7, i_types))
  layer = conv_capsules.ConvCapsules(i_types, o_types, k, stride, 4, init_scale=0.3,
                                      routing=dict(CONV, name="em"), normalisation=mode,
                                      rngs=nnx.Rngs(0))
  weights = np.asarray(layer.weights[...], np.float64)
  got_poses, got_acts, _ = layer(jnp.asarray(poses, jnp.float32),
                                 jnp.asarray(acts, jnp.float32))
  votes, (oh, ow) = np_conv_votes(poses, weights, stride)
  child_acts = np.zeros((2, i_types * k * k, 1, oh * ow))
  for i in range(i_types):
    for dy in range(k):
      for dx in range(k):
        for y in range(oh):
          for x in range(ow):
            child_acts[:, (i * k + dy) * k + dx, 0, y * ow + x] = acts[
                :, stride * y + dy, stride * x + dx, i]
  groups = np_groups(i_types, k, o_types, oh, ow, stride, mode)
  initial = np.full(votes.shape[:4], 1 / o_types)
  if mode == "child":  # Uniform over every parent of the child.
    initial = np_normalise(np.zeros(votes.shape[:4]), groups, mode, i_types, k)
  mean, active = np_em(votes, child_acts, np.full(o_types, 0.5), np.full(o_types, 0.5), CONV,
                       lambda lp: np_normalise(lp, groups, mode, i_types, k), initial)
  expected_poses = mean.reshape(2, o_types, oh, ow, 16).transpose(0, 2, 3, 1, 4)
  expected_acts = active.reshape(2, o_types, oh, ow).transpose(0, 2, 3, 1)
  np.testing.assert_allclose(got_poses, expected_poses, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(got_acts, expected_acts, rtol=2e-4, atol=1e-6)


def test_the_normalisations_sum_to_one_where_they_should():
  rng = np.random.default_rng(2)
  i_types, o_types, k, stride, oh = 2, 3, 3, 2, 3
  log_p = jnp.asarray(rng.normal(size=(1, i_types * k * k, o_types, oh * oh)) * 5, jnp.float32)
  for mode in ("child", "patch"):
    r = np.asarray(fields.conv_normaliser(mode, i_types, k, stride, oh, oh)(log_p))
    for group in np_groups(i_types, k, o_types, oh, oh, stride, mode):
      np.testing.assert_allclose(r[(0,) + tuple(np.array(group).T)].sum(), 1.0, rtol=1e-5)
  # The code's: S / (S + 1e-7) over its groups, S the group's sum of exp(log p - max), the max
  # taken per (input type, output type) over every position and offset.
  r = np.asarray(fields.conv_normaliser("code", i_types, k, stride, oh, oh)(log_p))
  grid = np.asarray(log_p, np.float64).reshape(1, i_types, k * k, o_types, oh * oh)
  e = np.exp(grid - grid.max(axis=(2, 4), keepdims=True)).reshape(log_p.shape)
  for group in np_groups(i_types, k, o_types, oh, oh, stride, "code"):
    idx = (0,) + tuple(np.array(group).T)
    np.testing.assert_allclose(r[idx].sum(), e[idx].sum() / (e[idx].sum() + 1e-7), rtol=1e-5)
  # At stride 2 the code's groups are not the children: a child's shares need not sum to 1.
  r = np.asarray(fields.conv_normaliser("code", i_types, k, stride, oh, oh)(log_p))
  sums = [r[(0,) + tuple(np.array(g).T)].sum()
          for g in np_groups(i_types, k, o_types, oh, oh, stride, "child")]
  assert not np.allclose(sums, 1.0)


def test_child_reduce_and_gather_invert_each_other_as_loops_say():
  rng = np.random.default_rng(3)
  values = rng.normal(size=(2, 3, 3, 3, 3))          # (lead, oh, ow, k, k)
  for stride in (1, 2):
    got = np.asarray(fields.child_reduce(jnp.asarray(values), stride))
    size = stride * 2 + 3
    expected = np.zeros((2, size, size))
    for y in range(3):
      for x in range(3):
        for dy in range(3):
          for dx in range(3):
            expected[:, stride * y + dy, stride * x + dx] += values[:, y, x, dy, dx]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)  # float32 sums.
    back = np.asarray(fields.gather_children(jnp.asarray(expected), stride, 3, 3, 3))
    for y, x, dy, dx in np.ndindex(3, 3, 3, 3):
      np.testing.assert_allclose(back[:, y, x, dy, dx],
                                 expected[:, stride * y + dy, stride * x + dx])


def test_receptive_field_centres_by_hand():
  # 32 px: grid -16..15; conv1 5x5/2 -> -14..12 step 2; 3x3/2 -> -12..8 step 4; 3x3/1 -> -8..4.
  np.testing.assert_allclose(
      fields.receptive_field_centres(32, [(5, 2), (3, 2), (3, 1)]),
      [-0.08, -0.04, 0.0, 0.04], atol=1e-7)


def test_coordinate_addition_puts_the_centres_where_each_setting_says():
  centres = np.array([-0.05, 0.0, 0.07], np.float32)
  poses = jnp.asarray(np.random.default_rng(4).normal(size=(1, 3, 3, 2, 16)), jnp.float32)

  weights = jnp.asarray(np.random.default_rng(5).normal(size=(2, 5, 4, 4)), jnp.float32)

  def votes(where):
    grid = capsule_layers.GridMatrixVotes.create(
        3, 3, 2, 4, fields.coordinate_offsets(centres, centres * 2, 4, where))
    return np.asarray(grid(poses.reshape(1, 18, 16), weights)).reshape(1, 3, 3, 2, 5, 16)

  none = votes("none")
  for where, (row_at, column_at) in {"code": (1, 0), "paper": (3, 7)}.items():
    added = votes(where) - none
    for y, x in np.ndindex(3, 3):
      expected = np.zeros(16)
      expected[row_at], expected[column_at] = centres[y], 2 * centres[x]
      np.testing.assert_allclose(added[0, y, x], np.broadcast_to(expected, (2, 5, 16)),
                                 atol=1e-6)


CASES = {
    "one child": lambda r: (r.normal(size=(2, 1, 3, 16)), r.uniform(size=(2, 1))),
    "identical votes": lambda r: (np.broadcast_to(r.normal(size=(2, 1, 3, 16)), (2, 9, 3, 16)),
                                  r.uniform(size=(2, 9))),
    "all-zero activations": lambda r: (r.normal(size=(2, 9, 3, 16)), np.zeros((2, 9))),
    "very large poses": lambda r: (r.normal(size=(2, 9, 3, 16)) * 1e6, r.uniform(size=(2, 9))),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("stop_gradient", [False, True])
def test_routing_and_its_gradient_stay_finite(case, stop_gradient):
  votes, acts = (jnp.asarray(x, jnp.float32) for x in CASES[case](np.random.default_rng(5)))
  settings = dict(CODE, stop_gradient=stop_gradient)
  params = {"beta_u": jnp.full(3, 2.0), "beta_a": jnp.ones(3)}

  def objective(votes, acts, params):
    result = em.route(votes, activations=acts, params=params, settings=settings,
                      diagnostics=True)
    return (jnp.sum(result.activations) + jnp.sum(result.capsules)
            + sum(jnp.sum(v) for v in result.diagnostics.values()))

  value, grads = jax.value_and_grad(objective, argnums=(0, 1, 2))(votes, acts, params)
  assert np.isfinite(value)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_a_convolutional_layer_stays_finite_on_degenerate_inputs():
  layer = conv_capsules.ConvCapsules(2, 3, 3, 2, 4, init_scale=0.3,
                                      routing=dict(CONV, name="em"), normalisation="code",
                                      rngs=nnx.Rngs(0))
  # One program for both cases, as a model runs the layer (op by op it took about 7 s).
  pose_gradient = jax.jit(jax.grad(lambda p, a: jnp.sum(layer(p, a)[1])))
  for poses, acts in ((jnp.ones((1, 5, 5, 2, 16)), jnp.zeros((1, 5, 5, 2))),
                      (jnp.full((1, 5, 5, 2, 16), 1e5), jnp.ones((1, 5, 5, 2)))):
    grads = pose_gradient(poses, acts)
    assert np.all(np.isfinite(grads))


def test_the_gradient_runs_through_every_iteration_unless_stopped():
  rng = np.random.default_rng(6)
  votes = jnp.asarray(rng.normal(size=(2, 9, 3, 16)), jnp.float32)
  acts = jnp.asarray(rng.uniform(size=(2, 9)), jnp.float32)
  params = {"beta_u": jnp.zeros(3), "beta_a": jnp.zeros(3)}

  def gradient(**changes):
    settings = dict(CODE, inverse_temperature=1.0, **changes)
    return jax.grad(lambda v: jnp.sum(em.route(v, activations=acts, params=params,
                                               settings=settings).activations))(votes)

  through, stopped = gradient(), gradient(stop_gradient=True)
  assert not np.allclose(through, stopped, rtol=1e-3)
  # With one iteration there is no E-step to stop.
  np.testing.assert_allclose(gradient(iterations=1), gradient(iterations=1, stop_gradient=True))


def test_diagnostics_per_iteration_by_hand_at_the_start():
  votes = jnp.asarray(np.random.default_rng(7).normal(size=(2, 6, 4, 16)), jnp.float32)
  result = em.route(votes, activations=jnp.ones((2, 6)),
                    params={"beta_u": jnp.zeros(4), "beta_a": jnp.zeros(4)}, settings=CODE,
                    diagnostics=True)
  assert set(result.diagnostics) == {"activation_mean", "activation_spread", "coupling_entropy",
                                     "log_sigma"}
  assert all(v.shape == (2, 3) for v in result.diagnostics.values())
  # The first M-step uses uniform assignments: entropy log 4 per child.
  np.testing.assert_allclose(result.diagnostics["coupling_entropy"][:, 0], math.log(4),
                             rtol=1e-5)
  np.testing.assert_allclose(result.diagnostics["activation_mean"][:, -1],
                             np.mean(result.activations, axis=1), rtol=1e-5)


def test_the_router_is_registered_and_refuses_bad_settings():
  router, settings = routing.resolve({"name": "em"})
  assert router.yields_activations and settings == em.ROUTER.defaults
  with pytest.raises(UsageError, match=r"min_variance=0\.0 is out of range: it must be > 0"):
    routing.resolve({"name": "em", "min_variance": 0.0})
  with pytest.raises(UsageError, match=r"mean_damping=1\.0 is out of range: it must be in "
                                       r"\[0, 1\)"):
    routing.resolve({"name": "em", "mean_damping": 1.0})
  specs = router.parameters(8, 16, 5, 16, settings)
  np.testing.assert_array_equal(specs["beta_u"].create(jax.random.key(0)), np.full(5, 2.0))
  np.testing.assert_array_equal(specs["beta_a"].create(jax.random.key(0)), np.ones(5))
