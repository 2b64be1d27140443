"""The jitted train step: k steps in one dispatch (lax.scan) are k single steps."""

import jax
import numpy as np
import pytest

import efficient_capsnet
import mnist
from capsjax.training.setup import Setup


@pytest.mark.parametrize("config_module, train_limit, start, num_steps, order", [
    (mnist, 0, 0, 3, "permutation"),
    # 16 steps per epoch on idx_dir's 256: the dispatch of steps 14..16 crosses into the next
    # epoch (with its permutations drawn once; the 3-step program of the case above). With 4
    # steps per epoch (64 examples), one of 5 steps is longer than an epoch.
    (mnist, 0, 14, 3, "permutation"),
    (mnist, 64, 0, 5, "permutation"),
    # BatchNorm statistics carried along; on idx_dir's 256, as test_efficient_capsnet.py's runs.
    (efficient_capsnet, 0, 0, 4, "permutation"),
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
  setup = Setup(config)
  examples, shared = setup.on_devices(setup.splits["train"])
  step = setup.make_train_step()

  scanned = setup.fresh_state()
  for _ in range(start):  # Each waited for: XLA:CPU's collectives deadlock under a deep queue
    scanned, _ = jax.block_until_ready(step(scanned, examples, shared, 1))  # (inflight.py),
  # and so before a copy per leaf is queued behind them.
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
  fresh = setup.fresh_state()
  assert any(not np.allclose(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree.leaves(fresh.params), jax.tree.leaves(scanned.params)))


@pytest.fixture
def seen_by_the_model(monkeypatch):
  """What the train step hands the model: each training forward pass's images and labels (in
  order) and the sharding the compiler gave the batch's images."""
  from capsjax.training import tasks

  batches, shardings = [], []
  original = tasks.forward

  def forward(graphdef, variables, batch, *, train, **kwargs):
    if train:
      jax.debug.inspect_array_sharding(batch["images"], callback=shardings.append)
      jax.debug.callback(lambda i, l: batches.append((np.asarray(i), np.asarray(l))),
                         batch["images"], batch["labels"])
    return original(graphdef, variables, batch, train=train, **kwargs)

  monkeypatch.setattr(tasks, "forward", forward)
  return batches, shardings, original


def shifted_copies(images: np.ndarray, max_shift: int) -> dict[bytes, tuple[int, int, int]]:
  """``{pixels: (example, dx, dy)}`` for every copy of every image moved by ``dx`` right and
  ``dy`` down (``|dx|, |dy| <= max_shift``), zero fill: written here with NumPy alone."""
  found = {}
  n, h, w = images.shape[:3]
  for k in range(n):
    for dy in range(-max_shift, max_shift + 1):
      for dx in range(-max_shift, max_shift + 1):
        moved = np.zeros_like(images[k])
        moved[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
            images[k][max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
        found[moved.tobytes()] = (k, dx, dy)
  return found


def test_the_batches_the_step_builds_are_fresh_shifts_of_each_epochs_examples_sharded(
    idx_dir, seen_by_the_model):
  """Each step's batch, as the model receives it: every image one train digit moved by at
  most 2 px with zero fill and its label; a new draw of shifts at every step and for every
  example; each epoch every example once; the batch split over the 4 devices, a slice each."""
  batches, shardings, _ = seen_by_the_model
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir, config.data.train_limit = "idx", str(idx_dir), 48
  setup = Setup(config)
  train = setup.splits["train"]
  examples, shared = setup.on_devices(train)
  step = setup.make_train_step()
  state = setup.fresh_state()
  for _ in range(6):  # Two epochs of 3 steps.
    state, _ = step(state, examples, shared, 1)
  jax.block_until_ready(state)
  assert len(batches) == 6
  copies = shifted_copies(train.examples["images"], config.data.shift_pixels)
  drawn = []
  for images, labels in batches:
    assert images.shape == (16, 28, 28, 1)
    pixels = np.rint(images * 255).astype(np.uint8)
    found = [copies.get(p.tobytes()) for p in pixels]
    assert None not in found, "an image is no train digit moved by <= 2 px with zero fill"
    which = np.array([f[0] for f in found])
    np.testing.assert_array_equal(labels, train.examples["labels"][which])
    drawn.append((which, np.array([f[1:] for f in found])))
  for epoch in (drawn[:3], drawn[3:]):
    assert sorted(np.concatenate([w for w, _ in epoch])) == list(range(48))
  shifts = [s for _, s in drawn]
  assert all(len({tuple(s) for s in step_shifts}) > 1 for step_shifts in shifts)
  for a in range(6):
    for b in range(a + 1, 6):
      assert not np.array_equal(shifts[a], shifts[b]), f"steps {a} and {b} drew the same shifts"
  # Sharded over the mesh's 4 devices: each holds 4 of the 16 images.
  assert shardings and jax.device_count() == 4
  for sharding in shardings:
    assert not sharding.is_fully_replicated
    assert sharding.shard_shape((16, 28, 28, 1)) == (4, 28, 28, 1)


@pytest.mark.parametrize("order, steps_per_dispatch", [("permutation", 3), ("stream", 1)])
def test_the_step_receives_the_examples_its_data_order_picks(idx_dir, seen_by_the_model, order,
                                                             steps_per_dispatch):
  """Which train digits the model receives at each step (found from the pixels, as above):
  those the data order picks by its own functions, from the run's data key: the epoch's
  permutation (also when a dispatch of 3 steps draws it once for all three) or the official
  code's stream (capsjax/datasets/stream_order.py)."""
  from capsjax.datasets import augment, stream_order
  from capsjax.training.train_step import TrainOrder

  batches, _, _ = seen_by_the_model
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir, config.data.train_limit = "idx", str(idx_dir), 48
  config.data.order, config.data.stream_window = order, 24
  setup = Setup(config)
  train = setup.splits["train"]
  examples, shared = setup.on_devices(train)
  step = setup.make_train_step()
  state = setup.fresh_state()
  data_key = np.asarray(TrainOrder.keys(state.rng)[0])
  for _ in range(6 // steps_per_dispatch):  # Two epochs of 3 steps.
    state, _ = step(state, examples, shared, steps_per_dispatch)
  jax.block_until_ready(state)
  assert len(batches) == 6
  copies = shifted_copies(train.examples["images"], config.data.shift_pixels)
  for k, (images, labels) in enumerate(batches):
    received = [copies[p.tobytes()][0] for p in np.rint(images * 255).astype(np.uint8)]
    if order == "stream":
      positions = stream_order.batch_positions(data_key, k, 16, 24)
      expected, _ = stream_order.examples_and_copies(positions, 48, setup.task.dataset
                                                     .stream_copies())
    else:
      expected = augment.epoch_batch_indices(data_key, k, 48, 16)
    np.testing.assert_array_equal(received, np.asarray(expected), err_msg=f"step {k}")
    np.testing.assert_array_equal(labels, train.examples["labels"][received])


def test_the_logged_train_metrics_are_the_batch_means_recomputed_outside_the_step(
    idx_dir, seen_by_the_model):
  """The loss, its parts and the accuracy a step returns (what the log writes) are the means
  over its batch of the model's per-example values with the parameters before the step:
  recomputed here from the batch the model received."""
  batches, _, forward = seen_by_the_model
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  setup = Setup(config)
  examples, shared = setup.on_devices(setup.splits["train"])
  step = setup.make_train_step()
  state = setup.fresh_state()
  recompute = jax.jit(lambda variables, batch, key, k: forward(  # One program, not op by op.
      setup.task.graphdef, variables, setup.task.complete_batch(batch), train=True, rng=key,
      step=k))
  for k in range(3):
    before = jax.tree.map(np.asarray, state.variables)  # The state is donated to the step.
    noise_key = jax.random.fold_in(jax.random.fold_in(state.rng, 1), k)
    state, metrics = step(state, examples, shared, 1)
    jax.block_until_ready(state)
    images, labels = batches[k]
    again = recompute(before, {"images": images, "labels": labels}, noise_key, np.int32(k))
    expected = {"loss": again.loss, **again.loss_parts, **again.metrics}
    assert set(expected) <= set(metrics)
    for name, values in expected.items():
      np.testing.assert_allclose(np.asarray(metrics[name])[0],
                                 np.mean(np.asarray(values, np.float64), axis=0),
                                 rtol=2e-5, atol=1e-6, err_msg=f"{name} at step {k}")
