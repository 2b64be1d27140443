"""The jitted train step: k steps in one dispatch (lax.scan) are k single steps."""

import jax
import numpy as np
import pytest

import efficient_capsnet
import mnist
from capsjax.training.runtime import Runtime


@pytest.mark.parametrize("config_module, train_limit, start, num_steps, order", [
    (mnist, 0, 0, 3, "permutation"),
    # 4 steps per epoch: the dispatch of steps 2..5 crosses into the next epoch (with its
    # permutations drawn once), and one of 5 steps is longer than an epoch.
    (mnist, 64, 2, 4, "permutation"),
    (mnist, 64, 0, 5, "permutation"),
    (efficient_capsnet, 64, 0, 4, "permutation"),  # BatchNorm statistics carried along.
    (mnist, 64, 1, 4, "stream"),  # Windows of 24 examples: batches of 16 straddle two.
], ids=["capsnet", "capsnet-across-epochs", "capsnet-longer-than-an-epoch",
        "efficient_capsnet", "capsnet-stream"])
def test_steps_per_dispatch_gives_the_state_and_metrics_of_single_steps(
    idx_dir, config_module, train_limit, start, num_steps, order):
  config = config_module.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.data.order, config.data.stream_window = order, 24
  if train_limit:
    config.data.train_limit = train_limit
  runtime = Runtime(config)
  examples, shared = runtime.on_devices(runtime.splits["train"])
  step = runtime.make_train_step()

  scanned = runtime.fresh_state()
  for _ in range(start):
    scanned, _ = step(scanned, examples, shared, 1)
  # Waited for before a copy per leaf is queued behind them: XLA:CPU's collectives deadlock
  # under a deep queue (capsjax/training/inflight.py).
  scanned = jax.block_until_ready(scanned)
  single, metrics = jax.tree.map(jax.numpy.copy, scanned), []
  for _ in range(num_steps):
    single, m = step(single, examples, shared, 1)
    metrics.append(jax.tree.map(np.asarray, m))
  scanned, scanned_metrics = step(scanned, examples, shared, num_steps)

  assert int(single.step) == int(scanned.step) == start + num_steps
  assert (jax.tree.structure(single.model_state) == jax.tree.structure(scanned.model_state))
  for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(scanned)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
  for key, values in scanned_metrics.items():
    assert np.asarray(values).shape[0] == num_steps
    np.testing.assert_allclose(np.asarray(values), np.concatenate([m[key] for m in metrics]),
                               rtol=2e-5, atol=1e-6)
  # The steps did something: the loss changed and the parameters moved.
  assert not np.allclose(metrics[0]["loss"], metrics[-1]["loss"])
  fresh = runtime.fresh_state()
  assert any(not np.allclose(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree.leaves(fresh.params), jax.tree.leaves(scanned.params)))
