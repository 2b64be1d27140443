"""Routing against an independent NumPy re-derivation of Procedure 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax import routing
from helpers import largest_intermediate


def np_squash(s, eps=0.0):
  sq = np.sum(s * s, axis=-1, keepdims=True)
  return sq / (1.0 + sq) * s / np.sqrt(sq + eps)


def np_softmax(x, axis):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def np_routing(votes, iterations, softmax_axis="output", leaky=False, bias=None,
               return_norms=False):
  """Procedure 1, written out with explicit loops over i and j; ``(v, couplings)`` and, with
  ``return_norms``, ``|s_j|`` of each iteration."""
  batch, in_caps, out_caps, _ = votes.shape
  axis = 2 if softmax_axis == "output" else 1
  b = np.zeros((batch, in_caps, out_caps))
  couplings, preactivation_norms = [], []
  for _ in range(iterations):
    if leaky:
      pad_shape = list(b.shape)
      pad_shape[axis] = 1
      padded = np.concatenate([b, np.zeros(pad_shape)], axis=axis)
      c = np.take(np_softmax(padded, axis), np.arange(b.shape[axis]), axis=axis)
    else:
      c = np_softmax(b, axis)
    couplings.append(c)
    s = np.zeros((batch, out_caps, votes.shape[-1]))
    for i in range(in_caps):
      for j in range(out_caps):
        s[:, j] += c[:, i, j, None] * votes[:, i, j]
    if bias is not None:
      s = s + bias
    preactivation_norms.append(np.sqrt(np.sum(s * s, axis=-1)))
    v = np_squash(s)
    for i in range(in_caps):
      for j in range(out_caps):
        b[:, i, j] += np.sum(votes[:, i, j] * v[:, j], axis=-1)
  return (v, couplings, preactivation_norms) if return_norms else (v, couplings)


def random_votes(seed=0, shape=(3, 7, 4, 5), scale=1.0):
  return np.random.default_rng(seed).normal(size=shape) * scale


@pytest.mark.parametrize("iterations", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("softmax_axis", ["output", "input"])
def test_matches_numpy_procedure_1(iterations, softmax_axis):
  votes = random_votes(iterations)
  expected, _ = np_routing(votes, iterations, softmax_axis)
  got = routing.dynamic_routing(jnp.asarray(votes, jnp.float32), iterations,
                                softmax_axis=softmax_axis)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("softmax_axis", ["output", "input"])
def test_leaky_and_bias_match_numpy(softmax_axis, iterations):
  votes = random_votes(7)
  bias = np.random.default_rng(8).normal(size=(4, 5)) * 0.1
  expected, _ = np_routing(votes, iterations, softmax_axis, leaky=True, bias=bias)
  got = routing.dynamic_routing(jnp.asarray(votes, jnp.float32), iterations,
                                softmax_axis=softmax_axis,
                                leaky=True, bias=jnp.asarray(bias, jnp.float32))
  np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-6)


def test_routing_differs_by_axis_and_leak():
  """The switches change the function (guards against a switch being ignored)."""
  votes = jnp.asarray(random_votes(3), jnp.float32)
  base = routing.dynamic_routing(votes, 3)
  for kwargs in [dict(softmax_axis="input"), dict(leaky=True), dict(bias=jnp.ones((4, 5)))]:
    other = routing.dynamic_routing(votes, 3, **kwargs)
    assert float(jnp.max(jnp.abs(other - base))) > 1e-3, kwargs


@pytest.mark.parametrize("softmax_axis,axis,size", [("output", 2, 4), ("input", 1, 7)])
def test_coupling_sums_to_one_and_starts_uniform(softmax_axis, axis, size):
  votes = jnp.asarray(random_votes(1), jnp.float32)
  _, trace = routing.dynamic_routing(votes, 4, softmax_axis=softmax_axis, return_trace=True)
  np.testing.assert_allclose(np.asarray(trace.coupling).sum(axis=axis + 1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(trace.coupling[0]), 1.0 / size, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(trace.logits[0]), 0.0)
  # Later iterations are not uniform: routing did something.
  assert float(jnp.std(trace.coupling[-1])) > 1e-3


def test_leaky_coupling_sums_below_one():
  votes = jnp.asarray(random_votes(2), jnp.float32)
  _, trace = routing.dynamic_routing(votes, 3, leaky=True, return_trace=True)
  sums = np.asarray(trace.coupling).sum(axis=3)
  assert np.all(sums < 1.0) and np.all(sums > 0.0)
  np.testing.assert_allclose(np.asarray(trace.coupling[0]), 1.0 / 5, rtol=1e-6)


@pytest.mark.parametrize("iterations", [1, 3])
def test_trace_matches_numpy_couplings_and_preactivation_norms(iterations):
  votes = random_votes(4)
  bias = np.random.default_rng(9).normal(size=(4, 5)) * 0.1
  _, expected, norms = np_routing(votes, iterations, bias=bias, return_norms=True)
  _, trace = routing.dynamic_routing(jnp.asarray(votes, jnp.float32), iterations,
                                     bias=jnp.asarray(bias, jnp.float32), return_trace=True)
  assert trace.preactivation_norm.shape == (iterations, 3, 4)
  for r in range(iterations):
    np.testing.assert_allclose(np.asarray(trace.coupling[r]), expected[r], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(trace.preactivation_norm[r]), norms[r], rtol=1e-5)


def test_stop_gradient_changes_gradients_not_outputs():
  votes = jnp.asarray(random_votes(5), jnp.float32)
  plain = routing.dynamic_routing(votes, 3)
  stopped = routing.dynamic_routing(votes, 3, stop_gradient=True)
  np.testing.assert_allclose(np.asarray(plain), np.asarray(stopped), rtol=1e-6)

  def loss(v, stop):
    return jnp.sum(routing.dynamic_routing(v, 3, stop_gradient=stop) ** 2)

  g_plain = jax.grad(loss)(votes, False)
  g_stop = jax.grad(loss)(votes, True)
  assert float(jnp.max(jnp.abs(g_plain - g_stop))) > 1e-4
  # With one iteration there is nothing intermediate to stop.
  g1 = jax.grad(lambda v: jnp.sum(routing.dynamic_routing(v, 1) ** 2))(votes)
  g1s = jax.grad(lambda v: jnp.sum(routing.dynamic_routing(v, 1, stop_gradient=True) ** 2))(votes)
  np.testing.assert_allclose(np.asarray(g1), np.asarray(g1s), rtol=1e-6)


@pytest.mark.parametrize("scale", [0.0, 1e4])
@pytest.mark.parametrize("stop", [False, True])
def test_gradients_finite_for_zero_and_huge_votes(scale, stop):
  votes = jnp.asarray(random_votes(6) * scale, jnp.float32)

  def loss(v):
    out = routing.dynamic_routing(v, 3, stop_gradient=stop)
    return jnp.sum(routing.safe_norm(out))

  g = jax.grad(loss)(votes)
  assert np.all(np.isfinite(np.asarray(g)))


def test_squash_matches_equation_1_and_is_safe_at_zero():
  s = np.random.default_rng(0).normal(size=(6, 8))
  np.testing.assert_allclose(np.asarray(routing.squash(jnp.asarray(s))), np_squash(s), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(routing.squash(jnp.asarray(s), epsilon=1e-3)),
                             np_squash(s, 1e-3), rtol=1e-5)
  zero = jnp.zeros((3, 8))
  np.testing.assert_array_equal(np.asarray(routing.squash(zero)), 0.0)
  g = jax.grad(lambda x: jnp.sum(routing.squash(x)))(zero)
  assert np.all(np.isfinite(np.asarray(g)))
  g = jax.grad(lambda x: jnp.sum(routing.safe_norm(routing.squash(x))))(zero)
  assert np.all(np.isfinite(np.asarray(g)))


def test_squash_lengths_below_one_and_direction_kept():
  s = jnp.asarray(np.random.default_rng(1).normal(size=(50, 16)) * 3, jnp.float32)
  v = routing.squash(s)
  lengths = np.asarray(routing.safe_norm(v))
  assert np.all(lengths < 1.0) and np.all(lengths >= 0.0)
  cos = np.sum(np.asarray(v) * np.asarray(s), -1) / (lengths * np.linalg.norm(s, axis=-1))
  np.testing.assert_allclose(cos, 1.0, rtol=1e-5)


def test_safe_norm_value_and_gradient():
  x = jnp.asarray([[3.0, 4.0], [0.0, 0.0]])
  np.testing.assert_allclose(np.asarray(routing.safe_norm(x)), [5.0, 0.0])
  g = jax.grad(lambda x: jnp.sum(routing.safe_norm(x)))(x)
  np.testing.assert_allclose(np.asarray(g), [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(routing.safe_norm(x, epsilon=1.0)), [np.sqrt(26), 1.0])


def test_diagnostics_hand_computed():
  # Two children, two parents; uniform coupling then a peaked one.
  coupling = jnp.asarray([[[[0.5, 0.5], [0.5, 0.5]]], [[[1.0, 0.0], [0.5, 0.5]]]])
  logits = jnp.asarray([[[[0.0, 0.0], [0.0, 0.0]]], [[[2.0, -2.0], [0.0, 0.0]]]])
  diag = routing.routing_diagnostics(routing.RoutingTrace(logits=logits, coupling=coupling))
  np.testing.assert_allclose(np.asarray(diag["coupling_entropy"]),
                             [np.log(2), np.log(2) / 2], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(diag["logit_change"]), [0.0, 1.0], rtol=1e-6)
  assert "preactivation_norm" not in diag  # A trace without norms (hand-made) has none.
  norms = jnp.asarray([[[3.0, 4.0]], [[1.0, 0.0]]])  # (iterations, batch, parents)
  diag = routing.routing_diagnostics(routing.RoutingTrace(logits, coupling, norms))
  np.testing.assert_allclose(np.asarray(diag["preactivation_norm"]), [3.5, 0.5], rtol=1e-6)


def test_bad_arguments_raise_clear_errors():
  votes = jnp.zeros((2, 3, 4, 5))
  with pytest.raises(ValueError, match="num_iterations must be >= 1, got 0"):
    routing.dynamic_routing(votes, 0)
  with pytest.raises(ValueError, match="softmax_axis"):
    routing.dynamic_routing(votes, 2, softmax_axis="parents")
  with pytest.raises(ValueError, match="shape"):
    routing.dynamic_routing(jnp.zeros((3, 4, 5)), 2)


def test_jit_and_no_five_dimensional_intermediate():
  """Forward and grad under jit; the largest array is the votes themselves."""
  votes = jnp.asarray(random_votes(9, shape=(2, 6, 3, 4)), jnp.float32)
  f = jax.jit(lambda v: jnp.sum(routing.dynamic_routing(v, 3) ** 2))
  assert largest_intermediate(jax.grad(f), votes) <= votes.size
  # The walker does look inside the loop: there a trace of 3 iterations of
  # (batch, in, out) is built, 1.5x the size of these 2-D votes.
  thin_votes = votes[..., :2]
  g = lambda v: routing.dynamic_routing(v, 3, return_trace=True)[1].logits.sum()
  assert largest_intermediate(jax.jit(g), thin_votes) == 3 * thin_votes.size // 2
  assert np.isfinite(float(f(votes)))


def test_diagnostics_weights_ignore_padding():
  votes = jnp.asarray(random_votes(11), jnp.float32)
  _, trace = routing.dynamic_routing(votes, 3, return_trace=True)
  first_two = routing.RoutingTrace(trace.logits[:, :2], trace.coupling[:, :2])
  expected = routing.routing_diagnostics(first_two)
  weighted = routing.routing_diagnostics(trace, weights=jnp.asarray([1.0, 1.0, 0.0]))
  for key in expected:
    np.testing.assert_allclose(np.asarray(weighted[key]), np.asarray(expected[key]), rtol=1e-5)
  # Routing sharpens the coupling: entropy falls after the first (uniform) iteration.
  diag = routing.routing_diagnostics(trace)
  np.testing.assert_allclose(float(diag["coupling_entropy"][0]), np.log(4), rtol=1e-5)
  assert float(diag["coupling_entropy"][2]) < float(diag["coupling_entropy"][0])


def test_capsule_votes_values_and_hand_written_gradients_match_autodiff():
  rng = np.random.default_rng(3)
  u = jnp.asarray(rng.normal(size=(3, 7, 4)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(7, 5, 6, 4)), jnp.float32)
  cotangent = jnp.asarray(rng.normal(size=(3, 7, 5, 6)), jnp.float32)
  expected = np.einsum("bik,ijdk->bijd", np.asarray(u), np.asarray(w))
  np.testing.assert_allclose(np.asarray(routing.capsule_votes(u, w)), expected,
                             rtol=1e-5, atol=1e-5)
  plain = lambda u, w: jnp.sum(jnp.einsum("bik,ijdk->bijd", u, w) * cotangent)
  custom = lambda u, w: jnp.sum(routing.capsule_votes(u, w) * cotangent)
  for a, b in zip(jax.grad(custom, argnums=(0, 1))(u, w), jax.grad(plain, argnums=(0, 1))(u, w)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
  # Through routing as well, under jit.
  route = lambda v: jnp.sum(routing.dynamic_routing(v, 3) ** 2)
  g_custom = jax.jit(jax.grad(lambda w: route(routing.capsule_votes(u, w))))(w)
  g_plain = jax.jit(jax.grad(lambda w: route(jnp.einsum("bik,ijdk->bijd", u, w))))(w)
  np.testing.assert_allclose(np.asarray(g_custom), np.asarray(g_plain), rtol=1e-4, atol=1e-5)
