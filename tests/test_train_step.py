"""The jitted train step: k steps in one dispatch (lax.scan) are k single steps."""

import jax
import numpy as np

import mnist
from capsjax.runtime import Runtime


def test_steps_per_dispatch_gives_the_state_and_metrics_of_single_steps(idx_dir):
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  runtime = Runtime(config).load()
  examples, shared = runtime.on_devices(runtime.splits["train"])
  step = runtime.make_train_step()

  single, metrics = runtime.fresh_state(), []
  for _ in range(3):
    single, m = step(single, examples, shared, 1)
    metrics.append(jax.tree.map(np.asarray, m))
  scanned, scanned_metrics = step(runtime.fresh_state(), examples, shared, 3)

  assert int(single.step) == int(scanned.step) == 3
  for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(scanned)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
  for key, values in scanned_metrics.items():
    assert np.asarray(values).shape[0] == 3
    np.testing.assert_allclose(np.asarray(values), np.concatenate([m[key] for m in metrics]),
                               rtol=2e-5, atol=1e-6)
  # The steps did something: the loss changed and the parameters moved.
  assert not np.allclose(metrics[0]["loss"], metrics[2]["loss"])
  fresh = runtime.fresh_state()
  assert any(not np.allclose(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree.leaves(fresh.params), jax.tree.leaves(scanned.params)))
