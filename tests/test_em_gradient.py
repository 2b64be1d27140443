"""EM routing's gradient (capsjax/routing/em.py, its one loop differentiated by JAX): against
central finite differences in float64, for the class layer's softmax and each convolutional
normalisation; in float32 as close to float64 as float32's rounding allows, also far from the
origin and for identical votes; under vmap; and the passes over the votes its layout saves,
counted in the compiled program against the child-major loop it replaced. The comparison with
the two removed forms (the custom VJP and the reference loop) in float64 is
tests/test_experiment_em_loop_forms.py's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax import routing
from capsjax.common.errors import UsageError
from capsjax.models import receptive_fields as fields
from capsjax.perf import hlo_traffic
from capsjax.routing import em
from helpers import check_directional_derivatives
# The class layer and the three convolutional normalisations, and the experiment's forms.
from test_experiment_em_loop_forms import CASES, conv_case, forms

CODE = dict(em.ROUTER.defaults)


def softmax_over_parents(log_p):
  return jax.nn.softmax(log_p, axis=2)


def objective(x, settings, normalise, initial=None):
  """The weighted sum of the outputs, a function of votes, activations, beta_u and beta_a
  (random weights: every output element weighs in the gradient differently)."""

  def f(votes, activations, beta_u, beta_a):
    result = em.em_routing(votes, activations, beta_u, beta_a, settings=settings,
                           normalise=normalise, initial=initial)
    return (jnp.sum(result.poses * x["pose_weights"])
            + jnp.sum(result.activations * x["activation_weights"]))

  return f


def value_and_gradients(x, settings, normalise, initial=None):
  """The objective and its gradient in votes, activations, beta_u, beta_a."""
  return jax.jit(jax.value_and_grad(objective(x, settings, normalise, initial),
                                    argnums=(0, 1, 2, 3)))(
      x["votes"], x["activations"], x["beta_u"], x["beta_a"])


@pytest.mark.parametrize("case", CASES)
def test_the_gradient_equals_finite_differences_in_float64(case):
  """The four inputs' gradient along its own direction in each, the whole gradient's and two
  random ones, to 1e-6 (float64's rounding in the differences: ~1e-9 of the objective).
  Stop-gradient changes the gradient and not the function: the float64 comparison with the
  removed forms (tests/test_experiment_em_loop_forms.py) checks it."""
  with jax.enable_x64(True):
    shape, normalise, initial = CASES[case]()
    x = forms.problem(*shape, seed=3, dtype=jnp.float64)
    f = jax.jit(objective(x, CODE, normalise, initial))
    args = (x["votes"], x["activations"], x["beta_u"], x["beta_a"])
    _, grads = value_and_gradients(x, CODE, normalise, initial)
    check_directional_derivatives(f, args, grads, argnums=(0, 1, 2, 3), epsilon=1e-4,
                                  rtol=1e-6)


def assert_same(got, want, rtol, atol=0.0):
  (value, grads), (expected_value, expected_grads) = got, want
  np.testing.assert_allclose(value, expected_value, rtol=rtol, atol=atol)
  for name, g, w in zip(("votes", "activations", "beta_u", "beta_a"), grads, expected_grads):
    scale = float(np.max(np.abs(w)))
    assert scale > 0, f"the gradient in {name} is zero: the comparison would be vacuous"
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale + atol,
                               err_msg=f"gradient in {name}")


def test_in_float32_it_agrees_with_float64_to_its_rounding_even_far_from_the_origin():
  """Votes offset by 30 (their spread 1): the loop sums products with the votes and their
  squares, which would lose the spread to cancellation without its shift."""
  shape, normalise, _ = conv_case("code")
  for offset in (0.0, 30.0):
    x = forms.problem(*shape, seed=1)
    x["votes"] = x["votes"] + offset
    with jax.enable_x64(True):
      reference = value_and_gradients({k: v.astype(jnp.float64) for k, v in x.items()}, CODE,
                                      normalise)
    assert_same(value_and_gradients(x, CODE, normalise), reference, rtol=2e-4, atol=1e-6)


def test_identical_votes_far_from_the_origin_route_as_the_reference_loop():
  """Every child agrees (votes ~1e3, spread 0): the sums of w V and w V^2 would leave
  rounding of ~1e6 x 1e-7 in place of a zero spread without the shift; with it the parents
  are the child-major reference loop's (experiments/em_loop_forms.py) and the gradients
  finite."""
  x = forms.problem(2, 9, 3, 1, 16)
  x["votes"] = jnp.broadcast_to(x["votes"][:, :1] * 1e3, x["votes"].shape)
  value, grads = value_and_gradients(x, CODE, softmax_over_parents)
  assert np.isfinite(value) and all(np.all(np.isfinite(g)) for g in grads)
  args = (x["votes"], x["activations"], x["beta_u"], x["beta_a"])
  result = em.em_routing(*args, settings=CODE, normalise=softmax_over_parents)
  poses, activations = forms.reference_loop(*args, settings=CODE,
                                            normalise=softmax_over_parents)
  # The shift (the mean of nine equal float32 numbers) is itself rounded, leaving ~1e-4 of
  # each vote and ~1e-8 of variance against the 5e-4 floor: activations within 1.5e-6 of the
  # reference loop's.
  np.testing.assert_allclose(result.poses, poses, rtol=1e-6)
  np.testing.assert_allclose(result.activations, activations, rtol=1e-5)
  # The damped mean after three iterations: (1 - 0.1^3) of the vote, less the mass epsilon's
  # share (1e-5 / mass: below 1e-3 here).
  np.testing.assert_allclose(result.poses, x["votes"][:, 0] * (1 - 0.1 ** 3), rtol=1e-3)


def test_under_vmap_each_run_gets_its_own_gradient():
  """Vectorised sweeps vmap the train step over runs."""
  xs = [forms.problem(2, 7, 4, 1, 16, seed=s) for s in (2, 3)]

  def gradient(x):
    return value_and_gradients(x, CODE, softmax_over_parents)[1][0]

  stacked = jax.tree.map(lambda *v: jnp.stack(v), *xs)
  together = jax.vmap(gradient)(stacked)
  for k, x in enumerate(xs):
    np.testing.assert_allclose(together[k], gradient(x), rtol=1e-5, atol=1e-7)


def test_the_train_step_reads_the_votes_fewer_times_than_the_reference_loop():
  """What the layout is for: bytes moved by the compiled gradient (hlo_traffic), at a size
  where the votes dominate (the mass of ConvCaps1 of configs/em_mnist.py at batch 1), against
  the child-major loop with the sums as reductions that it replaced."""
  x = forms.problem(1, 288, 32, 25, 16)
  normalise = fields.conv_normaliser("code", 32, 3, 2, 5, 5, 1e-7)

  def traffic(route):
    step = jax.jit(lambda v, a, u, b: jax.grad(
        lambda *args: jnp.sum(route(*args, settings=CODE, normalise=normalise)[1]),
        argnums=(0, 1))(v, a, u, b))
    text = step.lower(x["votes"], x["activations"], x["beta_u"], x["beta_a"]).compile()
    return hlo_traffic.program_traffic(text.as_text()).total_bytes

  votes_bytes = x["votes"].size * 4
  router, reference = traffic(forms.router), traffic(forms.reference_loop)
  assert router < 0.6 * reference, (router / votes_bytes, reference / votes_bytes)


def test_diagnostics_come_from_the_same_loop_and_the_old_setting_is_refused():
  x = forms.problem(2, 6, 4, 1, 16)
  args = (x["votes"], x["activations"], x["beta_u"], x["beta_a"])
  result = em.em_routing(*args, settings=CODE, normalise=softmax_over_parents,
                         diagnostics=True)
  assert set(result.diagnostics) == {"activation_mean", "activation_spread", "coupling_entropy",
                                     "log_sigma"}
  plain = em.em_routing(*args, settings=CODE, normalise=softmax_over_parents)
  np.testing.assert_allclose(plain.activations, result.activations, rtol=1e-6)
  np.testing.assert_allclose(plain.poses, result.poses, rtol=1e-6, atol=1e-7)
  # EM's gradient setting (until 2026-11-29; old workdirs drop it: capsjax/config/migrations.py).
  assert "gradient" not in em.SETTINGS
  with pytest.raises(UsageError, match="routing.gradient is not a setting of router 'em'"):
    routing.resolve({"name": "em", "gradient": "analytic"})
