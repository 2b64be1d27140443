"""Dynamic routing's written-out backward pass (capsjax/routing/dynamic_gradient.py) against
autodiff of the reference loop (capsjax/routing/dynamic.py)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from capsjax import routing
from capsjax.models import capsule_layers
from capsjax.routing import core, dynamic
from capsjax.perf import hlo_traffic
from capsjax.common.errors import UsageError

AXES = ["output", "input"]
BINARY = list(itertools.product([False, True], [False, True], [0.0, 1e-3], [False, True]))
# (iterations, softmax_axis, stop_gradient, leaky, squash_epsilon, bias): every combination of
# the binary switches at the paper's r = 3 and softmax axis; for the other axis and for r = 1,
# 2, 5 the two combinations that set every switch one way and the other.
SWITCHES = ([(3, "output", *rest) for rest in BINARY]
            + [(r, axis, *rest) for r in (1, 2, 3, 5) for axis in AXES
               for rest in [BINARY[0], BINARY[-1]] if (r, axis) != (3, "output")])


def value_and_gradients(votes, bias, cotangent, gradient, iterations, softmax_axis,
                        stop_gradient, leaky, squash_epsilon, use_bias):
  """``sum(v * cotangent)`` and its gradient in the votes and the bias."""

  def objective(votes, bias):
    parents = dynamic.dynamic_routing(
        votes, iterations, softmax_axis=softmax_axis, stop_gradient=stop_gradient, leaky=leaky,
        bias=bias if use_bias else None, squash_epsilon=squash_epsilon, gradient=gradient)
    return jnp.sum(parents * cotangent)

  return jax.value_and_grad(objective, argnums=(0, 1))(votes, bias)


def problem(shape, dtype, seed=0, scale=1.0):
  b, i, j, d = shape
  rng = np.random.default_rng(seed)
  return (jnp.asarray(scale * rng.normal(size=shape), dtype),
          jnp.asarray(0.3 * rng.normal(size=(j, d)), dtype),
          jnp.asarray(rng.normal(size=(b, j, d)), dtype))


def test_every_switch_gives_the_reference_gradient_in_float64():
  """The router's switches (:data:`SWITCHES`): value and gradients (votes, bias) equal autodiff
  of the reference to 1e-12 relative, each gradient checked non-trivial where one exists."""
  with jax.enable_x64():
    votes, bias, cotangent = problem((3, 7, 4, 5), jnp.float64)
    for switches in SWITCHES:
      want_value, want = value_and_gradients(votes, bias, cotangent, "autodiff", *switches)
      got_value, got = value_and_gradients(votes, bias, cotangent, "analytic", *switches)
      np.testing.assert_allclose(got_value, want_value, rtol=1e-12, err_msg=str(switches))
      for name, g, w in zip(("votes", "bias"), got, want):
        scale = float(jnp.max(jnp.abs(w)))
        uses_bias = switches[-1]
        if name == "votes" or uses_bias:
          assert scale > 0, f"{name} gradient is zero for {switches}: the test would be vacuous"
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12 * max(scale, 1.0),
                                   err_msg=f"{name} {switches}")


def test_stop_gradient_leaves_only_the_last_iterations_vote_term():
  """A hand check of the derivation's one-term case: with stop_gradient, no bias and r = 3,
  dV_ij = c_ij ds_j with c the last iteration's coupling (from the forward's trace) and ds the
  squash's cotangent of the last s_j (NumPy)."""
  with jax.enable_x64():
    votes, _, cotangent = problem((2, 6, 3, 4), jnp.float64, seed=1)
    _, (d_votes, _) = value_and_gradients(votes, None, cotangent, "analytic", 3, "output",
                                          True, False, 0.0, False)
    _, trace = dynamic.dynamic_routing(votes, 3, stop_gradient=True, return_trace=True)
    c = np.asarray(trace.coupling[-1])                               # (b, i, j)
    s = np.einsum("bijd,bij->bjd", np.asarray(votes), c)
    n2 = np.sum(s ** 2, axis=-1, keepdims=True)
    n = np.sqrt(n2)
    g = np.asarray(cotangent)
    # v = f(n) s / n, f = n^2 / (1 + n^2): dv/ds = (f/n) I + (f' - f/n) s s^T / n^2.
    f, f_prime = n2 / (1 + n2), 2 * n / (1 + n2) ** 2
    ds = f / n * g + (f_prime - f / n) * s * np.sum(s * g, axis=-1, keepdims=True) / n2
    np.testing.assert_allclose(d_votes, c[..., None] * ds[:, None], rtol=1e-12, atol=1e-14)


def test_in_float32_the_two_agree_to_its_rounding():
  """At the paper's vote sizes scaled down (1152 -> 288 children, 10 parents, 16D) and the
  paper's settings, both float32 forms are within float32 rounding of a float64 reference."""
  votes, bias, cotangent = problem((2, 288, 10, 16), jnp.float32, seed=2, scale=0.05)
  args = (3, "output", False, False, 0.0, False)
  with jax.enable_x64():
    _, exact = value_and_gradients(votes.astype(jnp.float64), bias.astype(jnp.float64),
                                   cotangent.astype(jnp.float64), "autodiff", *args)
  exact = np.asarray(exact[0])
  for gradient in ("analytic", "autodiff"):
    _, (d_votes, _) = value_and_gradients(votes, bias, cotangent, gradient, *args)
    error = float(np.max(np.abs(np.asarray(d_votes, np.float64) - exact)))
    assert error < 1e-5 * float(np.max(np.abs(exact))), (gradient, error)


def test_under_vmap_each_run_gets_its_own_gradient():
  """Vectorised sweeps (capsjax.sweep --vectorize) vmap the train step over runs."""
  votes, bias, cotangent = problem((2, 9, 3, 4), jnp.float32, seed=3)
  stacked = jnp.stack([votes, 2.0 * votes, -votes])
  args = (3, "output", False, False, 0.0, True)

  def gradient_of(v, gradient):
    return value_and_gradients(v, bias, cotangent, gradient, *args)[1][0]

  got = jax.vmap(lambda v: gradient_of(v, "analytic"))(stacked)
  for k in range(3):
    np.testing.assert_allclose(got[k], gradient_of(stacked[k], "autodiff"), rtol=1e-5,
                               atol=1e-6)


def test_the_class_capsule_layer_trains_the_same_with_either_gradient():
  """The paper's DigitCaps layer (votes W_ij u_i, a bias on s_j): gradients in its input
  capsules, transforms and bias equal to float32 rounding."""
  capsules = jnp.asarray(np.random.default_rng(5).normal(size=(3, 40, 8)) * 0.5, jnp.float32)

  def gradients(gradient):
    layer = capsule_layers.ClassCapsules(
        40, 8, 5, 16, use_bias=True, rngs=nnx.Rngs(0),
        routing=dict(dynamic.SETTINGS, name="dynamic", gradient=gradient))
    graph, params = nnx.split(layer)

    def loss(params, capsules):
      parents = nnx.merge(graph, params)(capsules)
      parents = parents[0] if isinstance(parents, tuple) else parents
      return jnp.sum(jnp.sin(3.0 * parents))

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(params, capsules)

  got, want = gradients("analytic"), gradients("autodiff")
  leaves = list(zip(jax.tree.leaves(got), jax.tree.leaves(want)))
  assert len(leaves) == 3    # Transforms, bias, input capsules.
  for g, w in leaves:
    scale = float(jnp.max(jnp.abs(w)))
    assert scale > 0
    np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * scale)


def test_the_written_out_pass_moves_no_more_bytes_than_autodiff():
  """What XLA:CPU makes of either (docs/performance.md): the same number of products with the
  votes and one write of their cotangent. The form's sum of outer products is written as
  broadcasts so that XLA fuses it into that one write; as one batched product of the stacked
  terms it cost a dot and a copy more (+4% of the bytes)."""
  votes, _, cotangent = problem((2, 1152, 10, 16), jnp.float32)

  def traffic(gradient):
    settings = dict(dynamic.SETTINGS, gradient=gradient)
    step = jax.jit(jax.grad(
        lambda v: jnp.sum(dynamic.route(v, settings=settings).capsules * cotangent)))
    return hlo_traffic.program_traffic(step.lower(votes).compile().as_text()).total_bytes

  analytic, autodiff = traffic("analytic"), traffic("autodiff")
  assert analytic <= 1.001 * autodiff, analytic / autodiff


def test_the_setting_is_checked_and_diagnostics_still_come():
  with pytest.raises(UsageError, match="routing.gradient must be one of"):
    routing.resolve({"name": "dynamic", "gradient": "fused"})
  with pytest.raises(ValueError, match="gradient must be one of"):
    dynamic.dynamic_routing(jnp.ones((1, 2, 2, 2)), 2, gradient="fused")
  votes, _, _ = problem((2, 6, 3, 4), jnp.float32)
  settings = dict(dynamic.SETTINGS, gradient="analytic")
  result = dynamic.route(votes, settings=settings, diagnostics=True)
  assert set(result.diagnostics) == {"coupling_entropy", "coupling_max", "logit_change",
                                     "preactivation_norm"}
  plain = dynamic.route(votes, settings=settings)
  np.testing.assert_allclose(plain.capsules, result.capsules, rtol=1e-6, atol=1e-7)


def test_auto_is_autodiff_until_the_written_out_form_is_measured_faster(monkeypatch):
  """On XLA:CPU the two are the same program's cost (docs/performance.md), so ``auto`` keeps
  the reference everywhere; EM's form is the CPU's default because it was measured faster."""
  assert dynamic.resolved_gradient("auto") == "autodiff"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert dynamic.resolved_gradient("auto") == "autodiff"
  assert dynamic.resolved_gradient("analytic") == "analytic"
  assert core.resolved_gradient("auto", analytic_on=("gpu",)) == "analytic"


def test_auto_is_resolved_once_into_the_runs_config(monkeypatch):
  """``routing.fill`` (what a run's config resolution calls) writes the form that runs here,
  so config.json says which backward pass ran; a chosen form is kept as given."""
  import ml_collections

  from capsjax import routing

  def filled(name, gradient="auto"):
    config = ml_collections.ConfigDict(routing.config_keys())
    config.name, config.gradient = name, gradient
    routing.fill(config)
    return config.gradient

  assert filled("dynamic") == "autodiff" and filled("em") == "analytic"  # On the CPU.
  assert filled("dynamic", "analytic") == "analytic" and filled("em", "autodiff") == "autodiff"
  monkeypatch.setattr(dynamic, "ANALYTIC_ON", ("cpu",))
  assert filled("dynamic") == "analytic"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert filled("em") == "autodiff"
  assert filled("uniform", None) is None  # A router without the setting leaves it unset.
