"""The routers behind one interface (capsjax.routing), each against a float64 NumPy
re-derivation of its paper's or reference code's equations (written here, not calling
capsjax; float32 against float64: rtol 1e-4 unless stated), hand-computed 2 x 2 cases, and the
settings they are configured by."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from capsjax import routing
from capsjax.common.errors import UsageError
from helpers import ROUTER_NAMES as NAMES, check_directional_derivatives, parse_config_flags

BATCH, IN_CAPS, IN_DIM, OUT_CAPS, OUT_DIM = 3, 7, 4, 5, 6


def _softmax(x, axis):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _squash(s):
  n = np.linalg.norm(s, axis=-1, keepdims=True)
  return n ** 2 / (1 + n ** 2) * s / n


def _inputs(seed=0):
  """Votes and children as float32 (what the routers get) whose values are exact in float64
  (what the references compute in)."""
  rng = np.random.RandomState(seed)
  votes = rng.normal(size=(BATCH, IN_CAPS, OUT_CAPS, OUT_DIM)).astype(np.float32)
  children = rng.normal(size=(BATCH, IN_CAPS, IN_DIM)).astype(np.float32)
  return votes, children


def _f64(*arrays):
  return [np.asarray(a, np.float64) for a in arrays]


def _route(name, votes, children, params=None, overrides=(), **kwargs):
  router, settings = routing.resolve({"name": name, **dict(overrides)})
  if params is None:
    specs = router.parameters(IN_CAPS, IN_DIM, OUT_CAPS, OUT_DIM, settings)
    params = {k: spec.create(jax.random.PRNGKey(0)) for k, spec in specs.items()}
  return router.route(jnp.asarray(votes), inputs=jnp.asarray(children),
                      activations=routing.safe_norm(jnp.asarray(children)), params=params,
                      settings=settings, **kwargs)


def test_every_router_is_registered_and_keeps_the_interface():
  assert "dynamic" in NAMES and routing.DEFAULT in NAMES
  votes, children = _inputs()
  for name in NAMES:
    assert isinstance(routing.get(name), routing.Router) and routing.get(name).name == name
    # Each call as one program (op by op the seven routers took ~20 s of compilations).
    plain = jax.jit(lambda v, c: _route(name, v, c, rng=jax.random.PRNGKey(1), train=True))(
        votes, children)
    assert plain.capsules.shape == (BATCH, OUT_CAPS, OUT_DIM), name
    assert plain.diagnostics == {}, name
    measured = jax.jit(lambda v, c: _route(name, v, c, diagnostics=True))(votes, children)
    assert measured.diagnostics, name
    iterations = {v.shape for v in measured.diagnostics.values()}
    assert len(iterations) == 1 and next(iter(iterations))[0] == BATCH, (name, iterations)
    yields = routing.get(name).yields_activations
    assert (measured.activations is not None) == yields, name


def test_dynamic_through_the_interface_is_dynamic_routing_exactly():
  votes, _ = _inputs()
  bias = jnp.full((OUT_CAPS, OUT_DIM), 0.2)
  for overrides in ({}, {"iterations": 1, "leaky": True}, {"softmax_axis": "input"}):
    got = _route("dynamic", votes, _inputs()[1], params={"bias": bias}, overrides=overrides)
    r = {**routing.get("dynamic").defaults, **overrides}
    want = routing.dynamic_routing(jnp.asarray(votes), r["iterations"],
                                   softmax_axis=r["softmax_axis"], leaky=r["leaky"], bias=bias)
    np.testing.assert_array_equal(np.asarray(got.capsules), np.asarray(want))


def test_uniform_is_one_iteration_of_dynamic_routing_and_the_mean_vote_squashed():
  votes, children = _inputs()
  got = _route("uniform", votes, children, diagnostics=True)
  (v64,) = _f64(votes)
  np.testing.assert_allclose(np.asarray(got.capsules), _squash(v64.sum(axis=1) / OUT_CAPS),
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got.capsules),
                             np.asarray(routing.dynamic_routing(jnp.asarray(votes), 1)),
                             rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.asarray(got.diagnostics["coupling_entropy"]), np.log(OUT_CAPS),
                             rtol=1e-6)
  np.testing.assert_allclose(np.asarray(got.diagnostics["coupling_max"]), 1 / OUT_CAPS,
                             rtol=1e-6)


def test_random_is_a_softmax_of_gaussian_logits_fresh_in_training_fixed_at_eval():
  votes, children = _inputs()
  key = jax.random.PRNGKey(3)
  got = _route("random", votes, children, overrides={"logit_scale": 2.0}, rng=key, train=True)
  logits = 2.0 * np.asarray(jax.random.normal(key, (BATCH, IN_CAPS, OUT_CAPS)), np.float64)
  coupling = _softmax(logits, axis=2)
  np.testing.assert_allclose(coupling.sum(axis=2), 1.0)
  want = _squash(np.einsum("bijd,bij->bjd", *_f64(votes), coupling))
  np.testing.assert_allclose(np.asarray(got.capsules), want, rtol=1e-5, atol=1e-6)
  other = _route("random", votes, children, rng=jax.random.PRNGKey(4), train=True)
  assert not np.allclose(np.asarray(other.capsules), np.asarray(got.capsules))
  first, again = (_route("random", votes, children) for _ in range(2))
  np.testing.assert_array_equal(np.asarray(first.capsules), np.asarray(again.capsules))
  reseeded = _route("random", votes, children, overrides={"eval_seed": 1})
  assert not np.allclose(np.asarray(reseeded.capsules), np.asarray(first.capsules))
  uniform = _route("random", votes, children, overrides={"logit_scale": 0.0})
  np.testing.assert_allclose(np.asarray(uniform.capsules),
                             np.asarray(_route("uniform", votes, children).capsules),
                             rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match="needs a key"):
    _route("random", votes, children, train=True)


def _efficient_squash(s):
  n = np.linalg.norm(s, axis=-1, keepdims=True)
  return (1 - np.exp(-n)) * s / n


def test_self_attention_follows_the_reference_fccaps():
  votes, children = _inputs()
  bias = np.random.RandomState(5).normal(scale=0.1, size=(OUT_CAPS, IN_CAPS)).astype(np.float32)
  got = _route("self_attention", votes, children, params={"bias": jnp.asarray(bias)},
               diagnostics=True)
  # The reference's layout: u (batch, N parents, I children, D).
  u = np.transpose(*_f64(votes), (0, 2, 1, 3))
  c = np.einsum("bnij,bnkj->bni", u, u)[..., None] / np.sqrt(OUT_DIM)
  c = _softmax(c, axis=1) + np.float64(bias)[None, :, :, None]
  want = _efficient_squash(np.sum(u * c, axis=-2))
  np.testing.assert_allclose(np.asarray(got.capsules), want, rtol=1e-4, atol=1e-6)
  assert got.diagnostics["agreement"].shape == (BATCH, 1)


def test_exp_squash_matches_its_formula_and_has_a_finite_gradient_at_zero():
  s = np.random.RandomState(0).normal(size=(4, 6)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(routing.exp_squash(jnp.asarray(s))),
                             _efficient_squash(s), rtol=1e-5)
  zero = jnp.zeros((2, 3))
  np.testing.assert_array_equal(np.asarray(routing.exp_squash(zero)), 0.0)
  grad = jax.grad(lambda x: jnp.sum(routing.exp_squash(x)))(zero)
  assert np.all(np.isfinite(np.asarray(grad)))


def _layer_norm(x, eps=1e-5):
  mean = x.mean(axis=-1, keepdims=True)
  return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + eps)


@pytest.mark.parametrize("scale", ["code", "paper"])
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_inverted_dot_product_follows_procedure_1_of_tsai_et_al(iterations, scale):
  votes, children = _inputs()
  got = _route("inverted_dot_product", votes, children, diagnostics=True,
               overrides={"iterations": iterations, "agreement_scale": scale})
  factor = 1 / np.sqrt(OUT_DIM) if scale == "code" else 1.0
  (votes,) = _f64(votes)
  pose = np.zeros((BATCH, OUT_CAPS, OUT_DIM))
  for _ in range(iterations):  # p = 0 first: the first coupling is uniform.
    coupling = _softmax(factor * np.einsum("bijd,bjd->bij", votes, pose), axis=2)
    pose = _layer_norm(np.einsum("bijd,bij->bjd", votes, coupling))
  np.testing.assert_allclose(np.asarray(got.capsules), pose, rtol=1e-4, atol=1e-5)
  specs = routing.get("inverted_dot_product").parameters(IN_CAPS, IN_DIM, OUT_CAPS, OUT_DIM, {})
  w = np.asarray(specs["readout_weights"].create(jax.random.PRNGKey(0)))
  np.testing.assert_allclose(np.asarray(got.activations), 1 / (1 + np.exp(-(pose @ w))),
                             rtol=1e-4)
  assert got.diagnostics["pose_change"].shape == (BATCH, iterations)
  np.testing.assert_allclose(np.asarray(got.diagnostics["coupling_entropy"][:, 0]),
                             np.log(OUT_CAPS), rtol=1e-6)


def test_self_routing_follows_the_reference_selfrouting2d():
  votes, children = _inputs()
  rng = np.random.RandomState(7)
  weights = rng.normal(size=(IN_CAPS, OUT_CAPS, IN_DIM)).astype(np.float32)
  bias = rng.normal(size=(IN_CAPS, OUT_CAPS)).astype(np.float32)
  got = _route("self_routing", votes, children,
               params={"route_weights": jnp.asarray(weights), "route_bias": jnp.asarray(bias)})
  votes, children, weights, bias = _f64(votes, children, weights, bias)
  r = _softmax(np.einsum("ijk,bik->bij", weights, children) + bias, axis=2)
  a = np.linalg.norm(children, axis=-1)[:, :, None]            # a_i = |u_i|
  ar = a * r
  np.testing.assert_allclose(np.asarray(got.activations), ar.sum(1) / a.sum(1), rtol=1e-5)
  want = np.einsum("bij,bijd->bjd", ar / ar.sum(1, keepdims=True), votes)
  np.testing.assert_allclose(np.asarray(got.capsules), want, rtol=1e-4, atol=1e-6)


def test_self_routing_starts_uniform_from_its_zero_initialised_routing_matrices():
  votes, children = _inputs()
  got = _route("self_routing", votes, children, diagnostics=True)
  np.testing.assert_allclose(np.asarray(got.activations), 1 / OUT_CAPS, rtol=1e-5)
  v64, c64 = _f64(votes, children)
  a = np.linalg.norm(c64, axis=-1)                       # Activation-weighted averaging.
  np.testing.assert_allclose(np.asarray(got.capsules),
                             np.einsum("bi,bijd->bjd", a / a.sum(1, keepdims=True), v64),
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got.diagnostics["coupling_entropy"]), np.log(OUT_CAPS),
                             rtol=1e-6)


def test_gradients_reach_votes_and_router_parameters_of_every_router():
  votes, children = _inputs()
  for name in NAMES:
    router, settings = routing.resolve({"name": name})
    specs = router.parameters(IN_CAPS, IN_DIM, OUT_CAPS, OUT_DIM, settings)
    params = {k: spec.create(jax.random.PRNGKey(0)) for k, spec in specs.items()}

    def objective(v, p):
      result = router.route(v, inputs=jnp.asarray(children),
                            activations=routing.safe_norm(jnp.asarray(children)), params=p,
                            settings=settings, rng=jax.random.PRNGKey(0), train=True)
      scores = result.activations if result.activations is not None else routing.safe_norm(
          result.capsules)
      return jnp.sum(scores * jnp.arange(OUT_CAPS)) + jnp.sum(result.capsules[:, 0])

    gradient = jax.jit(jax.grad(objective, argnums=(0, 1)))  # One program, not op by op.
    grad_votes, grad_params = gradient(jnp.asarray(votes), params)
    for key, g in grad_params.items():
      assert np.any(np.asarray(g)), (name, key)
    # The values: finite differences of the objective along the gradient and random
    # directions of the votes and the router's parameters together.
    check_directional_derivatives(jax.jit(objective), (np.asarray(votes, np.float32), params),
                                  (grad_votes, grad_params), argnums=(0, 1))


def _two_by_two(rows):
  """Votes of 2 children x 2 parents in 2-D, ``rows[i][j]`` = u_hat_{j|i}, batch 1."""
  return jnp.asarray([rows], jnp.float32)


def test_uniform_by_hand():
  # Both children vote (3, 4) for parent 1 and 0 for parent 2: s_1 = (3, 4), |s_1| = 5, and
  # Eq. 1 gives 25/26 * (3, 4)/5 = (15/26, 20/26); v_2 = 0.
  votes = _two_by_two([[[3, 4], [0, 0]], [[3, 4], [0, 0]]])
  got = routing.get("uniform").route(votes, settings={"squash_epsilon": 0.0}).capsules
  # Each child couples 1/2 to each parent: s_1 = (1/2)(3,4) + (1/2)(3,4) = (3, 4).
  np.testing.assert_allclose(np.asarray(got[0]), [[15 / 26, 20 / 26], [0, 0]], rtol=1e-6)


def test_random_by_hand():
  # With logit_scale 0 every logit is 0: the uniform hand case, v_1 = (15/26, 20/26).
  votes = _two_by_two([[[3, 4], [0, 0]], [[3, 4], [0, 0]]])
  router = routing.get("random")
  flat = router.route(votes, settings={"logit_scale": 0.0, "eval_seed": 0,
                                       "squash_epsilon": 0.0}).capsules
  np.testing.assert_allclose(np.asarray(flat[0]), [[15 / 26, 20 / 26], [0, 0]], rtol=1e-6)
  # At evaluation the logits are logit_scale x normal(PRNGKey(eval_seed), (batch, in, out))
  # (the router's documented draw). Child i couples c_i1 = 1 / (1 + e^{b_i2 - b_i1}) to
  # parent 1, so s_1 = (c_11 + c_21)(3, 4), |s_1| = 5 (c_11 + c_21), and Eq. 1 gives
  # v_1 = |s_1|^2 / (1 + |s_1|^2) (3, 4) / 5; parent 2 gets only zero votes.
  b = 2.0 * np.asarray(jax.random.normal(jax.random.PRNGKey(7), (1, 2, 2)), np.float64)[0]
  c1 = 1 / (1 + np.exp(b[:, 1] - b[:, 0]))
  norm = 5 * c1.sum()
  expected = norm ** 2 / (1 + norm ** 2) * np.array([3, 4]) / 5
  got = router.route(votes, settings={"logit_scale": 2.0, "eval_seed": 7,
                                      "squash_epsilon": 0.0}).capsules
  np.testing.assert_allclose(np.asarray(got[0]), [expected, [0, 0]], rtol=1e-5, atol=1e-7)
  assert not np.isclose(c1.sum(), 1.0, atol=0.05)  # The draw is not the uniform coupling.


def test_self_attention_by_hand():
  # Parent 1 gets (1,0) and (0,1), parent 2 gets (1,0) twice. Sums over children: (1,1) and
  # (2,0); A_i1 = 1/sqrt(2) for both children, A_i2 = 2/sqrt(2) = sqrt(2). Each child:
  # c = softmax(1/sqrt 2, sqrt 2) = (0.330238, 0.669762). s_1 = 0.330238 (1,1), |s_1| =
  # 0.467028, v_1 = (1 - e^-0.467028) (1,1)/sqrt(2) = (0.263848, 0.263848); s_2 =
  # 2 x 0.669762 (1,0) = (1.339523, 0), v_2 = (1 - e^-1.339523, 0) = (0.738029, 0).
  votes = _two_by_two([[[1, 0], [1, 0]], [[0, 1], [1, 0]]])
  got = routing.get("self_attention").route(
      votes, params={"bias": jnp.zeros((2, 2))}, diagnostics=True)
  np.testing.assert_allclose(np.asarray(got.capsules[0]),
                             [[0.263848, 0.263848], [0.738029, 0.0]], atol=1e-5)
  np.testing.assert_allclose(np.asarray(got.diagnostics["coupling_max"]), [[0.669762]],
                             atol=1e-5)


def test_inverted_dot_product_first_pass_by_hand():
  # Parents start at 0: uniform coupling 1/2, sum (1/2)((1,3) + (3,1)) = (2, 2) for parent 1,
  # (1/2)((0,2) + (0,0)) = (0, 1) for parent 2; LayerNorm (mean 2, var 0 -> 0; mean 1/2,
  # var 1/4 -> (-1, 1) / sqrt(1 + 4e-5)).
  votes = _two_by_two([[[1, 3], [0, 2]], [[3, 1], [0, 0]]])
  router, settings = routing.resolve({"name": "inverted_dot_product", "iterations": 1})
  params = {"layer_norm_scale": jnp.ones(2), "layer_norm_offset": jnp.zeros(2),
            "readout_weights": jnp.ones(2), "readout_bias": jnp.zeros(1)}
  got = router.route(votes, params=params, settings=settings).capsules
  np.testing.assert_allclose(np.asarray(got[0]),
                             [[0, 0], [-1 / np.sqrt(1 + 4e-5), 1 / np.sqrt(1 + 4e-5)]],
                             atol=1e-6)


def test_self_routing_by_hand():
  # Children u_1 = (3, 4), u_2 = (0, 1): activations |u_i| = 5 and 1. Child 1's routing bias
  # (ln 3, 0) couples it (3/4, 1/4); child 2's zeros (1/2, 1/2). c_ij a_i: (3.75, 1.25) and
  # (0.5, 0.5); per parent 4.25 and 1.75, so a = (4.25, 1.75) / 6 = (0.708333, 0.291667).
  # Votes: parent 1 gets (6, 0) and (0, 6): p_1 = (3.75 (6,0) + 0.5 (0,6)) / 4.25 =
  # (5.294118, 0.705882); parent 2 gets (0, 0) and (12, 0): p_2 = 0.5 (12, 0) / 1.75 =
  # (3.428571, 0).
  votes = _two_by_two([[[6, 0], [0, 0]], [[0, 6], [12, 0]]])
  children = jnp.asarray([[[3, 4], [0, 1]]], jnp.float32)
  params = {"route_weights": jnp.zeros((2, 2, 2)),
            "route_bias": jnp.asarray([[np.log(3), 0], [0, 0]], jnp.float32)}
  got = routing.get("self_routing").route(votes, inputs=children,
                                          activations=routing.safe_norm(children),
                                          params=params)
  np.testing.assert_allclose(np.asarray(got.activations[0]), [0.708333, 0.291667], atol=1e-5)
  np.testing.assert_allclose(np.asarray(got.capsules[0]),
                             [[5.294118, 0.705882], [3.428571, 0.0]], atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [0.0, 1e3])
def test_finite_jitted_gradients_at_zero_and_very_large_votes(name, scale):
  """Votes of std 1e3 give self-attention agreements of about 1e7 (trained models: order 1).
  At 1e4 (agreements 1e9) the jitted float32 softmax gradient of XLA:CPU overflows."""
  votes, children = _inputs()
  router, settings = routing.resolve({"name": name})
  specs = router.parameters(IN_CAPS, IN_DIM, OUT_CAPS, OUT_DIM, settings)
  params = {k: spec.create(jax.random.PRNGKey(0)) for k, spec in specs.items()}
  kids = jnp.asarray(children * (scale > 0))

  @jax.jit  # Children and parameters as arguments: both scales one program (a cache hit).
  def objective(v, kids, params):
    result = router.route(v, inputs=kids, activations=routing.safe_norm(kids), params=params,
                          settings=settings, rng=jax.random.PRNGKey(0), train=True)
    return jnp.sum(result.capsules ** 2) + (0.0 if result.activations is None
                                            else jnp.sum(result.activations))

  grad = jax.grad(objective)(jnp.asarray(votes * scale), kids, params)
  assert np.all(np.isfinite(np.asarray(grad))), name


# --- Settings ---


def test_resolve_fills_the_chosen_routers_defaults():
  assert routing.resolve({"name": "dynamic"})[1] == {
      "iterations": 3, "softmax_axis": "output", "stop_gradient": False, "leaky": False,
      "squash_epsilon": 0.0}
  config = ml_collections.ConfigDict({"name": "inverted_dot_product"})
  router, settings = routing.fill(config)
  assert router.name == "inverted_dot_product" and settings["iterations"] == 2
  assert config.iterations == 2 and "softmax_axis" not in config
  assert routing.resolve({"iterations": 5})[0].name == "dynamic"  # Configs before `name`.
  # Another router's setting, unset (a config.json of an earlier version holds them all).
  assert routing.resolve({"name": "uniform", "iterations": None})[1] == {"squash_epsilon": 0.0}


def test_resolve_refuses_misspelled_and_foreign_settings_naming_them():
  with pytest.raises(UsageError, match=r"routing\.iteratons is not a setting of router "
                                       r"'dynamic'; did you mean config\.model\.routing\."
                                       r"iterations\? \(its settings: iterations, leaky"):
    routing.resolve({"name": "dynamic", "iteratons": 2})
  with pytest.raises(UsageError, match=r"routing\.iterations=3 is not a setting of router "
                                       r"'uniform' \(it is router 'dynamic'"):
    routing.resolve({"name": "uniform", "iterations": 3})
  with pytest.raises(UsageError, match=r"routing.name='stochastic_routing' is not a registered "
                                       r"router"):
    routing.resolve({"name": "stochastic_routing"})
  with pytest.raises(UsageError, match=r"iterations=0 is out of range: it must be >= 1"):
    routing.resolve({"name": "inverted_dot_product", "iterations": 0})
  with pytest.raises(UsageError, match=r"agreement_scale='both' is out of range: it must be "
                                       r"one of"):
    routing.resolve({"name": "inverted_dot_product", "agreement_scale": "both"})


@pytest.mark.parametrize("name", NAMES)
def test_the_router_switches_from_the_command_line_alone(name):
  config = parse_config_flags(f"--config.model.routing.name={name}")
  router, settings = routing.resolve(config.model.routing)
  assert router.name == name and settings == routing.get(name).defaults


def test_todays_routing_flags_keep_their_meaning():
  config = parse_config_flags("--config.model.routing.iterations=1", "--config.model.routing.leaky=True",
                  "--config.model.routing.squash_epsilon=1e-7",
                  "--config.model.routing.softmax_axis=input")
  assert routing.resolve(config.model.routing)[1] == {
      "iterations": 1, "softmax_axis": "input", "stop_gradient": False, "leaky": True,
      "squash_epsilon": 1e-7}
  config = parse_config_flags("--config.model.routing.name=self_attention",
                  "--config.model.routing.iterations=2")
  with pytest.raises(UsageError, match="iterations=2 is not a setting of router"):
    routing.resolve(config.model.routing)
