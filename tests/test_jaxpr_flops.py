"""capsjax/perf/jaxpr_flops.py against hand counts and against XLA's cost analysis on the CPU."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from capsjax.perf import jaxpr_flops


def xla_flops(fn, *args) -> float:
  """XLA's count of the program before optimisation (the CPU backend gives one)."""
  cost = jax.jit(fn).lower(*args).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


X = jnp.ones((32, 64))
W = jnp.ones((64, 16))


def test_matmul_is_two_flops_per_multiply_add():
  count = jaxpr_flops.count(lambda x, w: x @ w, X, W)
  assert count.matmul == 2 * 32 * 64 * 16 and count.elementwise == 0 and count.exact
  assert count.flops == xla_flops(lambda x, w: x @ w, X, W)


def test_batched_dot_general_counts_batch_free_and_contracted_dimensions():
  votes, weights = jnp.ones((5, 3, 7, 4)), jnp.ones((5, 4, 6))
  fn = lambda a, b: jnp.einsum("bijk,bkl->bijl", a, b)  # noqa: E731
  assert jaxpr_flops.count(fn, votes, weights).matmul == 2 * 5 * (3 * 7) * 6 * 4
  assert jaxpr_flops.count(fn, votes, weights).flops == xla_flops(fn, votes, weights)


@pytest.mark.parametrize("groups", [1, 4])
def test_convolution_counts_window_and_input_features_of_a_group(groups):
  image, kernel = jnp.ones((2, 28, 28, 8)), jnp.ones((9, 9, 8 // groups, 16))
  fn = lambda a, k: jax.lax.conv_general_dilated(  # noqa: E731
      a, k, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
      feature_group_count=groups)
  hand = 2 * (2 * 10 * 10 * 16) * (9 * 9 * 8 // groups)
  assert jaxpr_flops.count(fn, image, kernel).matmul == hand
  assert jaxpr_flops.count(fn, image, kernel).flops == xla_flops(fn, image, kernel)


@pytest.mark.parametrize("padding", ["VALID", "SAME"])
def test_a_strided_convolutions_gradients_skip_padding_and_the_holes_of_a_dilated_input(
    padding):
  """The input's gradient is a convolution of the output's gradient dilated by the stride:
  counting every tap would be 3x too many here. Each gradient does the forward's work."""
  image, kernel = jnp.ones((2, 28, 28, 8)), jnp.ones((9, 9, 8, 16))
  conv = lambda a, k: jax.lax.conv_general_dilated(  # noqa: E731
      a, k, (2, 2), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
  loss = lambda a, k: jnp.sum(conv(a, k) ** 2)  # noqa: E731
  forward = jaxpr_flops.count(conv, image, kernel).matmul
  if padding == "VALID":
    assert forward == 2 * (2 * 10 * 10 * 16) * (9 * 9 * 8)
  else:  # 14 x 14 outputs; taps on the border's padding skipped.
    assert forward < 2 * (2 * 14 * 14 * 16) * (9 * 9 * 8)
  assert forward == xla_flops(conv, image, kernel)
  gradients = jaxpr_flops.count(jax.grad(loss, argnums=(0, 1)), image, kernel).matmul
  assert gradients == 3 * forward
  assert gradients == pytest.approx(xla_flops(jax.grad(loss, argnums=(0, 1)), image, kernel),
                                    rel=1e-3)


def test_elementwise_reductions_and_transcendentals_as_xla_counts_them():
  fn = lambda x, w: jnp.sum(jnp.tanh(x @ w) * 2.0)  # noqa: E731
  count = jaxpr_flops.count(fn, X, W)
  # The product, one multiply per element, a sum over the 512 elements; tanh apart.
  assert count.elementwise == 512 + 512 and count.transcendentals == 512
  assert abs(count.flops - xla_flops(fn, X, W)) <= 1  # XLA's sum of n takes n - 1 adds.


def test_loops_with_known_trip_counts_count_every_iteration_where_xla_counts_one():
  square = jnp.ones((64, 64))
  body = lambda i, c: c @ square  # noqa: E731
  one = 2 * 32 * 64 * 64
  for trips in (3, 5):
    fn = lambda x: jax.lax.fori_loop(0, trips, body, x)  # noqa: E731
    count = jaxpr_flops.count(fn, X)
    assert count.matmul == trips * one and count.exact
    assert xla_flops(fn, X) < 2 * one  # XLA: the body once.
  scanned = lambda x: jax.lax.scan(lambda c, _: (c @ square, None), x, None, length=4)[0]  # noqa
  assert jaxpr_flops.count(scanned, X).matmul == 4 * one
  # An offset fori_loop, its bounds known while tracing: a scan of 6.
  offset = lambda x: jax.lax.fori_loop(2, 2 + 6, body, x)  # noqa: E731
  assert jaxpr_flops.count(offset, X).matmul == 6 * one


def test_a_loop_of_unknown_length_is_counted_once_and_marked_inexact():
  fn = lambda x, n: jax.lax.fori_loop(0, n, lambda i, c: c @ jnp.ones((64, 64)), x)  # noqa
  count = jaxpr_flops.count(fn, X, 3)
  assert not count.exact and count.unknown
  assert count.matmul == 2 * 32 * 64 * 64


def test_calls_gradients_remat_and_custom_vjp_are_entered():
  @jax.custom_vjp
  def product(x):
    return x @ jnp.eye(64)

  product.defvjp(lambda x: (product(x), None), lambda _, g: (g @ jnp.eye(64).T,))
  fn = lambda x: jnp.sum(product(jax.jit(lambda y: y * 3.0)(x)))  # noqa: E731
  one = 2 * 32 * 64 * 64
  assert jaxpr_flops.count(fn, X).matmul == one
  # The forward and the custom backward's product.
  assert jaxpr_flops.count(jax.grad(fn), X).matmul == 2 * one
  # Rematerialised: the forward again in the backward pass, then the input's gradient.
  square = jnp.ones((64, 64))
  plain = lambda x: jnp.sum(jnp.sin(jnp.tanh(x @ square)))  # noqa: E731
  remat = lambda x: jnp.sum(jnp.sin(jax.checkpoint(lambda y: jnp.tanh(y @ square))(x)))  # noqa
  assert jaxpr_flops.count(jax.grad(plain), X).matmul == 2 * one
  assert jaxpr_flops.count(jax.grad(remat), X).matmul == 3 * one


def test_cond_counts_its_largest_branch_and_says_so_when_they_differ():
  fn = lambda p, x: jax.lax.cond(p, lambda y: y @ W, lambda y: y[:, :16], x)  # noqa: E731
  count = jaxpr_flops.count(fn, True, X)
  assert count.matmul == 2 * 32 * 64 * 16 and not count.exact


def test_shard_map_counts_each_shard():
  from jax.sharding import NamedSharding

  mesh = jax.make_mesh((jax.device_count(),), ("batch",))
  fn = jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("batch"), P()),
                     out_specs=P("batch"))
  x = jax.device_put(jnp.ones((8 * jax.device_count(), 64)), NamedSharding(mesh, P("batch")))
  w = jax.device_put(W, NamedSharding(mesh, P()))
  # Each shard multiplies its 8 rows; all shards together the whole batch's.
  assert jaxpr_flops.count(fn, x, w).matmul == 2 * x.shape[0] * 64 * 16
