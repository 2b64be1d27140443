"""Dynamic routing's written-out backward pass (experiments/dynamic_gradient.py, which
measures it against the router) equal to autodiff of the router (capsjax/routing/dynamic.py),
so that what the experiment times are two forms of one gradient."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from capsjax.routing import dynamic
from capsjax.config.runconfig import import_config_file

written_out = import_config_file(
    pathlib.Path(__file__).resolve().parents[1] / "experiments" / "dynamic_gradient.py")

OFF, ON = (False, False, 0.0, False), (True, True, 1e-3, True)
# (iterations, softmax_axis, stop_gradient, leaky, squash_epsilon, bias): at the paper's r = 3
# and softmax axis every switch off, each alone on, and all on; every switch on for the other
# axis and for r = 1, 2, 5 (each switch's branch of the backward pass taken at least once).
SWITCHES = ([(3, "output", *OFF), (3, "output", *ON)]
            + [(3, "output", *(ON[k] if k == n else OFF[k] for k in range(4))) for n in range(4)]
            + [(1, "output", *ON), (2, "input", *ON), (3, "input", *ON), (5, "output", *ON),
               (2, "output", *OFF)])


def value_and_gradients(votes, bias, cotangent, gradient, iterations, softmax_axis,
                        stop_gradient, leaky, squash_epsilon, use_bias):
  """``sum(v * cotangent)`` and its gradient in the votes and the bias, by the written-out
  pass (``gradient="analytic"``) or autodiff of the router."""

  form = written_out.routing if gradient == "analytic" else dynamic.dynamic_routing

  def objective(votes, bias):
    parents = form(votes, iterations, softmax_axis=softmax_axis, stop_gradient=stop_gradient,
                   leaky=leaky, bias=bias if use_bias else None, squash_epsilon=squash_epsilon)
    return jnp.sum(parents * cotangent)

  return jax.value_and_grad(objective, argnums=(0, 1))(votes, bias)


# One program per form and switches (op by op the 22 cases compiled ~200 small programs).
jitted_value_and_gradients = jax.jit(value_and_gradients, static_argnums=tuple(range(3, 10)))


def problem(shape, dtype, seed=0, scale=1.0):
  b, i, j, d = shape
  rng = np.random.default_rng(seed)
  return (jnp.asarray(scale * rng.normal(size=shape), dtype),
          jnp.asarray(0.3 * rng.normal(size=(j, d)), dtype),
          jnp.asarray(rng.normal(size=(b, j, d)), dtype))


def test_every_switch_gives_the_reference_gradient_in_float64():
  """The router's switches (:data:`SWITCHES`): value and gradients (votes, bias) equal autodiff
  of the router to 1e-12 relative, each gradient checked non-trivial where one exists."""
  with jax.enable_x64():
    votes, bias, cotangent = problem((3, 7, 4, 5), jnp.float64)
    for switches in SWITCHES:
      want_value, want = jitted_value_and_gradients(votes, bias, cotangent, "autodiff",
                                                    *switches)
      got_value, got = jitted_value_and_gradients(votes, bias, cotangent, "analytic", *switches)
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


def test_the_experiment_checks_and_measures_both_forms():
  """``measure`` (what the command prints): the gradients agree to float32 rounding, and the
  written-out pass moves no more bytes than autodiff (on XLA:CPU the same passes: its sum of
  outer products is written as broadcasts so that XLA fuses it into the one write of dV)."""
  result = written_out.measure(batch=2, calls=1, in_caps=96)
  assert result["max_difference"] <= 1e-5 * result["gradient_scale"]
  assert result["gradient_scale"] > 0
  assert result["analytic_bytes"] <= 1.001 * result["autodiff_bytes"]
  assert result["autodiff_median_s"] > 0 and result["analytic_median_s"] > 0
