"""The timer the benchmark uses, and the device's two bounds measured on it: the rate of a
dense f32 matmul and the bandwidth of an elementwise pass (docs/benchmarking.md)."""

import time


def time_repeated(fn, min_seconds: float, min_repeats: int = 3) -> float:
  """Seconds per call of ``fn`` (which blocks), over at least ``min_seconds``."""
  fn()  # Warm-up.
  repeats, start = 0, time.perf_counter()
  while repeats < min_repeats or time.perf_counter() - start < min_seconds:
    fn()
    repeats += 1
  return (time.perf_counter() - start) / repeats


def matmul_gflop_per_s(n: int, min_seconds: float) -> float:
  """Rate of an ``n x n`` f32 matmul on the default device (chained, so it is not cached)."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32) / n ** 0.5
  step = jax.jit(lambda x: x @ a)
  x = [a]

  def run():
    x[0] = step(x[0])
    x[0].block_until_ready()

  return 2 * n ** 3 / time_repeated(run, min_seconds) / 1e9


def copy_gb_per_s(num_bytes: int, min_seconds: float) -> float:
  """Bandwidth of an elementwise pass over an f32 array of ``num_bytes`` on the default device
  (each call reads it and writes a new one: 2 x ``num_bytes`` moved; chained, so it is not
  cached), in GB/s."""
  import jax
  import jax.numpy as jnp

  x = [jnp.zeros((num_bytes // 4,), jnp.float32)]
  step = jax.jit(lambda v: v * 0.5 + 1.0)

  def run():
    x[0] = step(x[0])
    x[0].block_until_ready()

  return 2 * (num_bytes // 4) * 4 / time_repeated(run, min_seconds) / 1e9
