"""EM routing's written-out backward pass (capsjax/routing/em_gradient.py) against autodiff of
the reference (capsjax/routing/em.py, ``gradient="autodiff"``): values and gradients of every
input, for the class layer's softmax and each convolutional normalisation, in float64 to
1e-10 and in float32 to float32's rounding; under vmap; in a whole network's train step; and
the passes over the votes it saves, counted in the compiled program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from capsjax import routing
from capsjax.models import conv_capsules
from capsjax.models import receptive_fields as fields
from capsjax.routing import em
from capsjax.perf import hlo_traffic
from capsjax.common.errors import UsageError

CODE = dict(em.ROUTER.defaults)


def softmax_over_parents(log_p):
  return jax.nn.softmax(log_p, axis=2)


def problem(shape, dtype, seed=0, offset=0.0):
  """Votes ``shape`` (b, n, o, p, D), activations (b, n, 1, p), betas, and random cotangents
  of the two outputs (so every output element weighs in the gradient differently)."""
  b, n, o, p, d = shape
  rng = np.random.default_rng(seed)
  arrays = dict(
      votes=rng.normal(size=shape) + offset,
      activations=rng.uniform(0.05, 1.0, size=(b, n, 1, p)),
      beta_u=rng.normal(size=o),
      beta_a=0.01 * rng.normal(size=o),
      pose_weights=rng.normal(size=(b, o, p, d)),
      activation_weights=rng.normal(size=(b, o, p)))
  return {k: jnp.asarray(v, dtype) for k, v in arrays.items()}


def value_and_gradients(x, settings, normalise, initial=None):
  """The weighted sum of the outputs and its gradient in votes, activations, beta_u, beta_a."""

  def objective(votes, activations, beta_u, beta_a):
    result = em.em_routing(votes, activations, beta_u, beta_a, settings=settings,
                           normalise=normalise, initial=initial)
    return (jnp.sum(result.poses * x["pose_weights"])
            + jnp.sum(result.activations * x["activation_weights"]))

  return jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2, 3)))(
      x["votes"], x["activations"], x["beta_u"], x["beta_a"])


def assert_same(analytic, autodiff, rtol, atol=0.0):
  (value, grads), (expected_value, expected_grads) = analytic, autodiff
  np.testing.assert_allclose(value, expected_value, rtol=rtol, atol=atol)
  for name, got, want in zip(("votes", "activations", "beta_u", "beta_a"), grads,
                             expected_grads):
    scale = float(jnp.max(jnp.abs(want)))
    assert scale > 0, f"the gradient in {name} is zero: the comparison would be vacuous"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale + atol,
                               err_msg=f"gradient in {name}")


CONV = (2, 3, 2, 2, 2)   # in_types, kernel, stride, oh, ow


def conv_case(mode):
  i, k, s, oh, ow = CONV
  normalise = fields.conv_normaliser(mode, i, k, s, oh, ow, 1e-7)
  shape = (2, i * k * k, 3, oh * ow, 16)
  initial = normalise(jnp.zeros(shape[:4], jnp.float64)) if mode == "child" else None
  return shape, normalise, initial


CASES = {
    "class layer": lambda: ((2, 7, 5, 1, 16), softmax_over_parents, None),
    "code": lambda: conv_case("code"),
    "child": lambda: conv_case("child"),
    "patch": lambda: conv_case("patch"),
}
CHANGES = {
    "defaults": {},
    "one iteration": {"iterations": 1},
    "five iterations, stop-gradient": {"iterations": 5, "stop_gradient": True},
    "no damping, sharp": {"mean_damping": 0.0, "inverse_temperature": 1.0},
}


@pytest.mark.parametrize("changes", CHANGES)
@pytest.mark.parametrize("case", CASES)
def test_the_written_out_gradient_equals_autodiff_in_float64(case, changes):
  with jax.enable_x64(True):
    shape, normalise, initial = CASES[case]()
    if initial is not None:
      initial = initial.astype(jnp.float64)
    x = problem(shape, jnp.float64)
    settings = dict(CODE, **CHANGES[changes])
    analytic = value_and_gradients(x, dict(settings, gradient="analytic"), normalise, initial)
    autodiff = value_and_gradients(x, dict(settings, gradient="autodiff"), normalise, initial)
    assert analytic[0].dtype == jnp.float64
    assert_same(analytic, autodiff, rtol=1e-10)


def test_in_float32_the_two_agree_to_its_rounding_even_far_from_the_origin():
  """Votes offset by 30 (their spread 1): the analytic form sums products with the votes and
  their squares, which would lose the spread to cancellation without its shift."""
  shape, normalise, _ = conv_case("code")
  for offset in (0.0, 30.0):
    x = problem(shape, jnp.float32, seed=1, offset=offset)
    with jax.enable_x64(True):
      x64 = {k: v.astype(jnp.float64) for k, v in x.items()}
      reference = value_and_gradients(x64, dict(CODE, gradient="autodiff"), normalise)
    analytic = value_and_gradients(x, dict(CODE, gradient="analytic"), normalise)
    autodiff = value_and_gradients(x, dict(CODE, gradient="autodiff"), normalise)
    # Both float32 forms are as close to float64 as each other, within float32 rounding.
    for got in (analytic, autodiff):
      assert_same(got, reference, rtol=2e-4, atol=1e-6)


def test_identical_votes_far_from_the_origin_route_as_the_reference():
  """Every child agrees (votes ~1e3, spread 0): the sums of w V and w V^2 would leave
  rounding of ~1e6 x 1e-7 in place of a zero spread without the shift; with it the parents
  are the reference's and the gradients finite."""
  x = problem((2, 9, 3, 1, 16), jnp.float32)
  x["votes"] = jnp.broadcast_to(x["votes"][:, :1] * 1e3, x["votes"].shape)
  value, grads = value_and_gradients(x, dict(CODE, gradient="analytic"), softmax_over_parents)
  assert np.isfinite(value) and all(np.all(np.isfinite(g)) for g in grads)
  results = [em.em_routing(x["votes"], x["activations"], x["beta_u"], x["beta_a"],
                           settings=dict(CODE, gradient=g), normalise=softmax_over_parents)
             for g in ("analytic", "autodiff")]
  # The shift (the mean of nine equal float32 numbers) is itself rounded, leaving ~1e-4 of
  # each vote and ~1e-8 of variance against the 5e-4 floor: activations within 1.5e-6 of the
  # reference. Without the shift they were 5.9e-4 off (measured with the shift set to 0).
  np.testing.assert_allclose(results[0].poses, results[1].poses, rtol=1e-6)
  np.testing.assert_allclose(results[0].activations, results[1].activations, rtol=1e-5)
  # The damped mean after three iterations: (1 - 0.1^3) of the vote, less the mass epsilon's
  # share (1e-5 / mass: below 1e-3 here).
  np.testing.assert_allclose(results[0].poses, x["votes"][:, 0] * (1 - 0.1 ** 3), rtol=1e-3)


def test_under_vmap_each_run_gets_its_own_gradient():
  """Vectorised sweeps vmap the train step over runs."""
  xs = [problem((2, 7, 4, 1, 16), jnp.float32, seed=s) for s in (2, 3)]
  settings = dict(CODE, gradient="analytic")

  def gradient(x):
    return value_and_gradients(x, settings, softmax_over_parents)[1][0]

  stacked = jax.tree.map(lambda *v: jnp.stack(v), *xs)
  together = jax.vmap(gradient)(stacked)
  for k, x in enumerate(xs):
    np.testing.assert_allclose(together[k], gradient(x), rtol=1e-5, atol=1e-7)


def test_a_convolutional_layer_trains_the_same_with_either_gradient():
  """The whole layer (votes from poses and transforms, the code's normalisation): gradients
  in its poses, activations and weights."""
  i, k, s, o = 3, 3, 2, 4
  rng = np.random.default_rng(4)
  poses = jnp.asarray(rng.normal(size=(2, 7, 7, i, 16)), jnp.float32)
  acts = jnp.asarray(rng.uniform(size=(2, 7, 7, i)), jnp.float32)

  def gradients(gradient):
    layer = conv_capsules.ConvCapsules(
        i, o, k, s, 4, init_scale=0.3, rngs=nnx.Rngs(0),
        routing=dict(CODE, name="em", inverse_temperature=0.01, mass_epsilon=1e-7,
                     gradient=gradient))
    graph, params = nnx.split(layer)

    def loss(params, poses, acts):
      out_poses, out_acts, _ = nnx.merge(graph, params)(poses, acts)
      return jnp.sum(jnp.sin(out_poses)) + jnp.sum(out_acts * jnp.arange(o))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(params, poses, acts)

  for got, want in zip(jax.tree.leaves(gradients("analytic")),
                       jax.tree.leaves(gradients("autodiff"))):
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * float(jnp.max(jnp.abs(want))))


def test_the_train_step_reads_the_votes_fewer_times():
  """What the form is for: bytes moved by the compiled gradient (hlo_traffic), at a size where
  the votes dominate (the mass of ConvCaps1 of configs/em_mnist.py at batch 1)."""
  x = problem((1, 288, 32, 25, 16), jnp.float32)
  normalise = fields.conv_normaliser("code", 32, 3, 2, 5, 5, 1e-7)

  def traffic(gradient):
    step = jax.jit(lambda v, a, u, b: jax.grad(
        lambda *args: jnp.sum(em.em_routing(*args, settings=dict(CODE, gradient=gradient),
                                            normalise=normalise).activations),
        argnums=(0, 1))(v, a, u, b))
    text = step.lower(x["votes"], x["activations"], x["beta_u"], x["beta_a"]).compile()
    return hlo_traffic.program_traffic(text.as_text()).total_bytes

  votes_bytes = x["votes"].size * 4
  analytic, autodiff = traffic("analytic"), traffic("autodiff")
  assert analytic < 0.6 * autodiff, (analytic / votes_bytes, autodiff / votes_bytes)


def test_the_setting_is_checked_and_diagnostics_still_come():
  with pytest.raises(UsageError, match="routing.gradient must be one of"):
    routing.resolve({"name": "em", "gradient": "fused"})
  x = problem((2, 6, 4, 1, 16), jnp.float32)
  result = em.em_routing(x["votes"], x["activations"], x["beta_u"], x["beta_a"],
                         settings=dict(CODE, gradient="analytic"),
                         normalise=softmax_over_parents, diagnostics=True)
  assert set(result.diagnostics) == {"activation_mean", "activation_spread", "coupling_entropy",
                                     "log_sigma"}
  plain = em.em_routing(x["votes"], x["activations"], x["beta_u"], x["beta_a"],
                        settings=dict(CODE, gradient="analytic"),
                        normalise=softmax_over_parents)
  np.testing.assert_allclose(plain.activations, result.activations, rtol=1e-5)
  np.testing.assert_allclose(plain.poses, result.poses, rtol=1e-5, atol=1e-6)


def test_auto_is_the_analytic_form_on_a_cpu_only(monkeypatch):
  assert em.resolved_gradient("auto") == "analytic"     # The tests run on the CPU.
  assert em.ROUTER.defaults["gradient"] == "auto"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert em.resolved_gradient("auto") == "autodiff"
  assert em.resolved_gradient("analytic") == "analytic"


def test_auto_is_resolved_once_into_the_runs_config(monkeypatch):
  """``routing.fill`` (what a run's config resolution calls) writes the form that runs here,
  so config.json says which backward pass ran; a chosen form is kept as given; routers without
  the setting (dynamic routing's is differentiated by JAX) leave it unset."""
  import ml_collections

  def filled(name, gradient="auto"):
    config = ml_collections.ConfigDict(routing.config_keys())
    config.name, config.gradient = name, gradient
    routing.fill(config)
    return config.gradient

  assert filled("em") == "analytic" and filled("em", "autodiff") == "autodiff"  # On the CPU.
  assert filled("dynamic", None) is None and filled("uniform", None) is None
  with pytest.raises(UsageError, match="gradient='auto' is not a setting of router 'dynamic'"):
    filled("dynamic")
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert filled("em") == "autodiff"
