"""Efficient-CapsNet: its parameter counts, its primary capsules against NumPy, BatchNorm as
model state (training and evaluation modes, synchronised over devices, resumed exactly), and
the whole run through the command line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import efficient_capsnet
from capsjax import models, train
from capsjax.common.errors import UsageError
from capsjax.models import efficient_capsnet as model_lib
from capsjax.training import train_step
from helpers import (REPO, abstract_model, final_state, read_summary, resolved, run_in_process,
                     run_main)

CONFIG = str(REPO / "configs" / "efficient_capsnet.py")


def smoke_model(seed=0):
  config = resolved(efficient_capsnet.get_config("smoke"))
  return model_lib.EfficientCapsNet.from_config(config, rngs=nnx.Rngs(seed))


def _images(n=8, seed=0):
  return jnp.asarray(np.random.RandomState(seed).rand(n, 28, 28, 1), jnp.float32)


def test_the_reference_parameter_counts():
  """The issue's breakdown: conv 832 + 18,496 + 36,928 + 73,856; BatchNorm 576; depthwise
  10,496; W 20,480; bias 160 = 161,824; decoder 1,411,344."""
  model = abstract_model(efficient_capsnet.get_config())
  sizes = lambda module: sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))
  assert [sizes(c) for c in model.convs] == [832, 18_496, 36_928, 73_856]
  assert sum(sizes(n) for n in model.norms) == 576
  assert sizes(model.primary_capsules) == 10_496
  assert model.class_capsules.weights.shape == (16, 10, 16, 8)
  assert sizes(model.class_capsules) == 20_480 + 160
  assert sizes(model.decoder) == 1_411_344
  assert models.count_params(model) == 1_573_168
  assert models.count_params(model) - sizes(model.decoder) == 161_824
  # BatchNorm statistics are state, not parameters: 2 x (32 + 64 + 64 + 128).
  stats = nnx.state(model, nnx.BatchStat)
  assert sum(x.size for x in jax.tree.leaves(stats)) == 576


def test_he_normal_class_capsule_weights_have_the_references_std():
  """Keras' he_normal on the reference's (10, 16, 8, 16) W: fan_in = 16 x 8 x 10 = 1280."""
  config = resolved(efficient_capsnet.get_config())
  model = model_lib.EfficientCapsNet.from_config(config, rngs=nnx.Rngs(0))
  std = float(np.std(np.asarray(model.class_capsules.weights[...])))
  assert abs(std - np.sqrt(2 / 1280)) < 0.03 * np.sqrt(2 / 1280)


def test_depthwise_primary_capsules_against_numpy():
  """One 9x9 filter per channel (no mixing of channels), bias, then (1 - e^-|s|) s / |s|."""
  layer = model_lib.DepthwisePrimaryCapsules(6, 3, 2, rngs=nnx.Rngs(0))
  layer.bias[...] = jnp.arange(6, dtype=jnp.float32) * 0.1
  features = np.random.RandomState(1).randn(2, 4, 5, 6)
  kernel = np.asarray(layer.kernel[...], np.float64)[:, :, 0, :]  # (3, 3, channels)
  conv = np.zeros((2, 2, 3, 6))
  for y in range(2):
    for x in range(3):
      conv[:, y, x, :] = np.einsum("bhwc,hwc->bc", features[:, y:y + 3, x:x + 3, :], kernel)
  s = (conv + 0.1 * np.arange(6)).reshape(2, -1, 2)  # Channels in order: 3 capsules per place.
  norm = np.linalg.norm(s, axis=-1, keepdims=True)
  expected = (1 - np.exp(-norm)) * s / norm
  got = np.asarray(layer(jnp.asarray(features, jnp.float32)).poses)
  assert got.shape == (2, 2 * 3 * 3, 2)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_the_model_has_finite_gradients_with_all_zero_capsules():
  """Zero images and zero kernels make every primary capsule the zero vector, where the
  squash's |s| has no derivative; the loss's gradient stays finite."""
  model = smoke_model()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = jax.tree.map(jnp.zeros_like, nnx.to_pure_dict(params))
  rest = nnx.to_pure_dict(rest)
  batch = {"images": jnp.zeros((4, 28, 28, 1)), "labels": jnp.arange(4),
           "reconstruction_targets": jnp.zeros((4, 28, 28, 1))}

  def loss(p, s):
    m = nnx.merge(graphdef, p, s)
    return jnp.mean(m.loss(m.apply(batch, train=True), batch)[0])

  grads = jax.jit(jax.grad(loss))(params, rest)  # Op by op it took 20 s.
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_batch_norm_in_training_uses_the_batch_and_updates_the_running_statistics():
  model = smoke_model()
  images = _images()
  conv_out = np.asarray(jax.nn.relu(model.convs[0](images)), np.float64)
  mean, var = conv_out.mean(axis=(0, 1, 2)), conv_out.var(axis=(0, 1, 2))
  momentum, epsilon = 0.99, 1e-3
  norm = model.norms[0]
  out = np.asarray(norm(jnp.asarray(conv_out, jnp.float32), use_running_average=False))
  expected = ((conv_out - mean) / np.sqrt(var + epsilon) * np.asarray(norm.scale[...])
              + np.asarray(norm.bias[...]))
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
  # Running statistics start at mean 0 and variance 1 and move by 1 - momentum.
  np.testing.assert_allclose(np.asarray(norm.mean[...]), (1 - momentum) * mean, rtol=1e-4,
                             atol=1e-7)
  np.testing.assert_allclose(np.asarray(norm.var[...]), momentum + (1 - momentum) * var,
                             rtol=1e-4)


def test_batch_norm_in_evaluation_uses_the_running_statistics_and_changes_nothing():
  model = smoke_model()
  # Whole passes as programs (op by op: ~10 s of compiling); nnx.jit writes back whatever a
  # pass changes in the module, so a statistic that moves is seen as it is eagerly.
  apply = nnx.jit(lambda m, batch, train: m.apply(batch, train=train), static_argnums=2)
  apply(model, {"images": _images(), "labels": jnp.arange(8) % 10}, True)  # Moves them.
  before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)))
  norm = model.norms[0]
  conv_out = jax.nn.relu(model.convs[0](_images(seed=3)))
  expected = ((np.asarray(conv_out) - before["norms"][0]["mean"])
              / np.sqrt(before["norms"][0]["var"] + 1e-3) * np.asarray(norm.scale[...])
              + np.asarray(norm.bias[...]))
  np.testing.assert_allclose(np.asarray(norm(conv_out, use_running_average=True)), expected,
                             rtol=1e-4, atol=1e-5)
  # An evaluation pass of the whole model leaves every statistic as it was ...
  first = apply(model, {"images": _images(seed=3), "labels": jnp.arange(8) % 10}, False)
  after = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)))
  jax.tree.map(np.testing.assert_array_equal, before, after)
  # ... and one example's scores do not depend on the rest of its batch.
  alone = apply(model, {"images": _images(seed=3)[:1], "labels": jnp.zeros(1, jnp.int32)},
                False)
  np.testing.assert_allclose(np.asarray(alone.scores[0]), np.asarray(first.scores[0]),
                             rtol=1e-5, atol=1e-6)


def test_batch_norm_statistics_over_four_devices_equal_those_over_one():
  """Synchronised BatchNorm: the batch sharded over 4 devices gives the statistics (and the
  loss) of the same batch on one device."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  graphdef, params, rest = nnx.split(smoke_model(), nnx.Param, ...)
  batch = {"images": _images(16), "labels": jnp.arange(16) % 10,
           "reconstruction_targets": _images(16)}

  @jax.jit
  def forward(p, s, b):
    m = nnx.merge(graphdef, p, s)
    loss = jnp.mean(m.loss(m.apply(b, train=True), b)[0])
    return loss, nnx.to_pure_dict(nnx.state(m, nnx.BatchStat))

  results = []
  assert len(jax.devices()) >= 4
  for devices in (jax.devices()[:1], jax.devices()[:4]):
    mesh = Mesh(np.asarray(devices), ("data",))
    replicate = lambda x: jax.device_put(x, NamedSharding(mesh, P()))
    sharded = jax.device_put(batch, NamedSharding(mesh, P("data")))
    results.append(jax.tree.map(np.asarray, forward(replicate(params), replicate(rest),
                                                    sharded)))
  (loss_1, stats_1), (loss_4, stats_4) = results
  np.testing.assert_allclose(loss_4, loss_1, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               stats_4, stats_1)
  # The statistics moved: a per-device statistic would differ from the global one.
  assert not np.allclose(stats_1["norms"][0]["mean"], 0)


def _smoke(idx_dir, **train_settings):
  config = efficient_capsnet.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  config.train.update(train_settings)
  return config


def test_a_resumed_run_continues_with_bit_identical_state(idx_dir, tmp_path):
  full = train.train_and_evaluate(_smoke(idx_dir), str(tmp_path / "full"))
  train.train_and_evaluate(_smoke(idx_dir, num_steps=4), str(tmp_path / "resumed"))
  resumed = train.train_and_evaluate(_smoke(idx_dir), str(tmp_path / "resumed"))
  assert resumed["step"] == full["step"] == 8
  a, b = final_state(tmp_path / "full"), final_state(tmp_path / "resumed")
  assert jax.tree.leaves(a.model_state), "the checkpoint holds the BatchNorm statistics"
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert resumed["test_loss"] == full["test_loss"]
  # The statistics were trained: not the initial mean 0.
  assert not np.allclose(a.model_state["norms"][0]["mean"], 0)


def test_the_train_step_updates_the_state_and_evaluation_uses_it(idx_dir):
  """The jitted train step moves the BatchNorm statistics; evaluating the same parameters with
  other statistics gives other metrics, so evaluators do use the state."""
  from capsjax.training.setup import Setup

  setup = Setup(_smoke(idx_dir))
  examples, shared = setup.on_devices(setup.splits["train"])
  fresh = setup.fresh_state()
  # One step: the program the runs below compile (test_train_step.py checks 4 in one dispatch).
  state, _ = setup.make_train_step()(jax.tree.map(jnp.copy, fresh), examples, shared, 1)
  moved = jax.tree.map(lambda a, b: not np.allclose(a, b), fresh.model_state, state.model_state)
  assert all(jax.tree.leaves(moved))
  evals = setup.evaluations()
  with_state = evals["test"].run(state.variables)
  with_fresh_stats = evals["test"].run(
      train_step.merge_variables(state.params, fresh.model_state))
  assert with_state["loss"] != with_fresh_stats["loss"]


def test_settings_that_cannot_work_are_refused():
  config = efficient_capsnet.get_config("smoke")
  config.model.batch_norm.position = "sideways"
  with pytest.raises(UsageError, match=r"batch_norm\.position='sideways' is out of range"):
    resolved(config)
  config = resolved(efficient_capsnet.get_config("smoke"))
  config.model.convs.strides = (1, 1)
  with pytest.raises(UsageError, match="convs.features, kernel_sizes and strides"):
    model_lib.validate_config(config.model)
  config = resolved(efficient_capsnet.get_config("smoke"))
  config.model.primary.dim = 5
  with pytest.raises(UsageError, match="primary.dim=5"):
    model_lib.validate_config(config.model)


def test_the_smoke_config_runs_end_to_end_and_evaluate_agrees(idx_dir, tmp_path, capsys):
  """``python -m capsjax.main --config=configs/efficient_capsnet.py:smoke``, then
  ``python -m capsjax.evaluate`` on its workdir (in this process: helpers.run_in_process):
  the same test accuracy as the summary."""
  workdir = tmp_path / "run"
  result = run_main(workdir, data_dir=idx_dir, config=CONFIG + ":smoke")
  assert result.returncode == 0, result.stdout + result.stderr
  summary = read_summary(workdir)
  assert summary["num_params"] == models.count_params(smoke_model())
  evaluated = run_in_process(capsys, "capsjax.evaluate", f"--workdir={workdir}")
  assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
  evaluation = json.loads((workdir / "evaluation.json").read_text())
  assert evaluation["test_accuracy"] == summary["test_accuracy"]
  np.testing.assert_allclose(evaluation["test_loss"], summary["test_loss"], rtol=1e-5)
