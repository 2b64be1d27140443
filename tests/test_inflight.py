"""capsjax/training/inflight.py: at most a few dispatches in flight, so that XLA:CPU's
collectives between the devices of one process do not deadlock (and abort the process)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from capsjax.training import inflight


class Output:
  """Stands for a dispatch's outputs; records when it is waited for."""

  def __init__(self, name, log):
    self.name, self.log = name, log

  def block_until_ready(self):
    self.log.append(self.name)
    return self


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_the_window_waits_for_the_oldest_beyond_its_depth(depth):
  log = []
  window = inflight.Window(depth)
  for k in range(6):
    window.add(Output(k, log))
    assert log == list(range(max(0, k + 1 - depth)))  # Oldest first; the newest `depth` not.


def test_a_window_needs_a_positive_depth():
  with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
    inflight.Window(0)


def test_a_multi_device_collective_dispatched_in_a_loop_through_the_window_finishes():
  """The pattern that aborted test workers (a train step's all-reduce dispatched again and
  again without waiting): through a window of 2 it runs to the end, equal to the same steps
  waited for one by one. (Without the window this process deadlocks within a few hundred
  dispatches and XLA aborts it after 60 s: the module docstring's measurement.)"""
  devices = jax.device_count()
  assert devices > 1, "tests/conftest.py gives each worker several CPU devices"
  mesh = jax.make_mesh((devices,), ("d",))

  def body(x, w):
    for _ in range(3):
      x = jnp.tanh(x @ w)
      x = x - jax.lax.pmean(jnp.mean(x, axis=0, keepdims=True), "d")
    return x

  step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d")))
  start = jax.device_put(jnp.asarray(np.random.default_rng(0).normal(size=(devices * 8, 64)),
                                     jnp.float32), NamedSharding(mesh, P("d")))
  w = jnp.eye(64) * 0.9
  window, x = inflight.Window(2), start
  for _ in range(400):
    x = step(x, w)
    window.add(x)
  expected = start
  for _ in range(400):
    expected = jax.block_until_ready(step(expected, w))
  np.testing.assert_array_equal(np.asarray(x), np.asarray(expected))
