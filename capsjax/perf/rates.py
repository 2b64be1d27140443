"""The timers the benchmark and the experiments use, and the device's two bounds measured on them:
the rate of a dense f32 matmul and the bandwidth of an elementwise pass (docs/benchmarking.md)."""

import statistics
import time


def time_repeated(fn, min_seconds: float, min_repeats: int = 3) -> float:
  """Seconds per call of ``fn`` (which blocks), over at least ``min_seconds``."""
  fn()  # Warm-up.
  repeats, start = 0, time.perf_counter()
  while repeats < min_repeats or time.perf_counter() - start < min_seconds:
    fn()
    repeats += 1
  return (time.perf_counter() - start) / repeats


def median_seconds(programs: dict, args: tuple, calls: int) -> dict[str, float]:
  """``{name: median seconds}`` of each jitted program of ``programs`` called on ``args``
  ``calls`` times, the programs alternating so that a drift of the machine's speed falls on
  all alike (each already compiled and run once)."""
  import jax  # Only for the programs that return arrays.

  seconds = {name: [] for name in programs}
  for _ in range(calls):
    for name, fn in programs.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      seconds[name].append(time.perf_counter() - start)
  return {name: statistics.median(s) for name, s in seconds.items()}


def matmul_gflop_per_s(n: int, min_seconds: float) -> float:
  """Rate of an ``n x n`` f32 matmul on the default device (chained, so it is not cached)."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32) / n ** 0.5
  return 2 * n ** 3 / _chained_seconds(jax.jit(lambda x: x @ a), a, min_seconds) / 1e9


def copy_gb_per_s(num_bytes: int, min_seconds: float) -> float:
  """Bandwidth of an elementwise pass over an f32 array of ``num_bytes`` on the default device
  (each call reads it and writes a new one: 2 x ``num_bytes`` moved; chained, so it is not
  cached), in GB/s."""
  import jax
  import jax.numpy as jnp

  x = jnp.zeros((num_bytes // 4,), jnp.float32)
  seconds = _chained_seconds(jax.jit(lambda v: v * 0.5 + 1.0), x, min_seconds)
  return 2 * (num_bytes // 4) * 4 / seconds / 1e9


def _chained_seconds(step, x, min_seconds: float) -> float:
  """Seconds per call of ``step`` on its own last output (chained, so it is not cached)."""
  x = [x]

  def run():
    x[0] = step(x[0])
    x[0].block_until_ready()

  return time_repeated(run, min_seconds)
