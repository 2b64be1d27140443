"""The matrix-capsule model (capsjax/models/em_capsnet.py): sizes from the layer shapes, the
spread loss and its margin schedules, weight decay, and runs that learn."""

import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from capsjax import models, train
from capsjax.common.errors import UsageError
from capsjax.models import em_capsnet, losses
from capsjax.config.runconfig import import_config_file
from helpers import assert_trained, check_directional_derivatives, em_smoke_run, read_summary

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
em_mnist = import_config_file(CONFIGS / "em_mnist.py")


def model_config(image_shape=(32, 32, 2), classes=5, **sizes):
  c = em_mnist.em_model(**sizes)
  c.image_shape, c.num_classes = image_shape, classes
  return c


def parts(model):
  return {name: sum(x.size for x in jax.tree.leaves(nnx.state(getattr(model, name), nnx.Param)))
          for name in ("conv1", "primary_capsules", "conv_capsules", "class_capsules")}


def test_parameter_counts_of_the_papers_networks():
  # smallNORB, both stereo images, A=B=C=D=32: 5x5x2x32 + 32; 32x32x17; 32x9x32x16 + 2x32
  # (twice); 32x16x5 + 2x5.
  # Shapes only (nnx.eval_shape): initialising the full network compiled its initialisers for
  # 13 s of a cold test run.
  model = nnx.eval_shape(lambda: em_capsnet.EMCapsNet(model_config(), rngs=nnx.Rngs(0)))
  assert parts(model) == {"conv1": 1632, "primary_capsules": 17408,
                          "conv_capsules": 2 * 147520, "class_capsules": 2570}
  assert models.count_params(model) == 316650
  small = nnx.eval_shape(lambda: em_capsnet.EMCapsNet(
      model_config(conv1=64, primary=8, caps=(16, 16)), rngs=nnx.Rngs(0)))
  assert parts(small) == {"conv1": 5 * 5 * 2 * 64 + 64, "primary_capsules": 64 * 8 * 17,
                          "conv_capsules": 8 * 9 * 16 * 16 + 32 + 16 * 9 * 16 * 16 + 32,
                          "class_capsules": 16 * 16 * 5 + 10}
  assert models.count_params(small) == 68618


def test_the_spread_loss_by_hand():
  activations = jnp.array([[0.9, 0.5, 0.1], [0.2, 0.6, 0.3]])
  labels = jnp.array([0, 2])
  # Example 0: class 1 within the margin 0.5 by 0.1 -> 0.01; class 2 outside. Example 1: class 0
  # 0.5 - 0.1 = 0.4 -> 0.16; class 1: 0.5 + 0.3 = 0.8 -> 0.64.
  np.testing.assert_allclose(losses.spread_loss_per_example(activations, labels, 0.5, "sum"),
                             [0.01, 0.80], rtol=1e-5)
  np.testing.assert_allclose(losses.spread_loss_per_example(activations, labels, 0.5),
                             [0.01 / 3, 0.80 / 3], rtol=1e-5)


def test_margin_schedules():
  sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
  for step, expected in ((0, 0.2 + 0.79 * sigmoid(-4)), (200_000, 0.595),
                         (10**7, 0.2 + 0.79 * sigmoid(10))):
    np.testing.assert_allclose(losses.spread_margin(jnp.asarray(step)), expected, rtol=1e-6)
  np.testing.assert_allclose(losses.spread_margin(None), 0.2 + 0.79 * sigmoid(10), rtol=1e-6)
  for step, expected in ((0, 0.2), (100, 0.55), (200, 0.9), (400, 0.9)):
    np.testing.assert_allclose(losses.spread_margin(jnp.asarray(step), "linear", 200),
                               expected, rtol=1e-6)


def test_weight_decay_covers_the_weights_not_the_biases():
  model = em_capsnet.EMCapsNet(model_config(conv1=4, primary=2, caps=(2, 2)), rngs=nnx.Rngs(0))
  state = nnx.to_flat_state(nnx.state(model, nnx.Param))
  expected = sum(0.5 * float(np.sum(np.square(v[...]))) for path, v in state
                 if path[-1] in ("kernel", "pose_kernel", "activation_kernel", "weights"))
  np.testing.assert_allclose(float(model.weight_decay()), expected, rtol=1e-5)
  images = jnp.zeros((2, 32, 32, 2))
  batch = {"images": images, "labels": jnp.array([0, 1])}
  loss, named = nnx.jit(lambda m, b: m.loss(m.apply(b, train=True), b, step=jnp.asarray(0)))(
      model, batch)  # One program (op by op: ~15 s of compiling).
  np.testing.assert_allclose(named["weight_decay"], 2e-7 * expected, rtol=1e-5)
  np.testing.assert_allclose(loss, named["spread_loss"] + named["weight_decay"], rtol=1e-6)


def test_bad_settings_are_refused_naming_the_key():
  import em_mnist  # configs/, on the path in conftest.

  from capsjax.config import schema

  for key, value, message in (
      ("conv_caps.normalisation", "stride", "normalisation='stride' is out of range"),
      ("class_capsules.coordinate_addition", "left", "coordinate_addition='left' is out of "
                                                     "range"),
      ("primary.layout", "mixed", "layout='mixed' is out of range"),
      ("conv_caps.inverse_temperature", 0.0, "inverse_temperature=0.0 is out of range: it "
                                             "must be > 0")):
    config = em_mnist.get_config("smoke")
    section, name = key.split(".")
    config.model[section][name] = value
    with pytest.raises(UsageError, match=rf"config\.model\.{section}\.{message}"):
      schema.resolve_config(config)
  config = model_config()
  config.routing.name = "dynamc"
  with pytest.raises(UsageError, match="is not a registered router"):
    em_capsnet.EMCapsNet(config, rngs=nnx.Rngs(0))
  with pytest.raises(UsageError, match="too small"):
    em_capsnet.EMCapsNet(model_config(image_shape=(12, 12, 1)), rngs=nnx.Rngs(0))
  loss = em_capsnet.default_loss()
  loss.margin_schedule = "cosine"
  with pytest.raises(UsageError, match="margin_schedule='cosine' is out of range"):
    em_capsnet.EMCapsNet(model_config(), rngs=nnx.Rngs(0), loss=loss)


@pytest.mark.parametrize("router,separated,fall", [("em", 0.02, 0.93),
                                                   ("variational_bayes", 0.2, 0.05)])
def test_it_learns_to_separate_two_classes(router, separated, fall):
  """Adam at the code's rate classifies one batch of two classes and pulls the true class's
  activation above the other's; its first gradient reaches every routed layer and equals
  finite differences (tests/test_capsule_layers.py's every-router check, for these two
  routers here, on the program that trains). (At the EM code's small inverse temperatures
  the activations move slowly: the spread loss falls about 10% in 100 steps, as in the
  code's long runs; VB routing's batch-normalised activations move fast.)"""
  config = model_config((20, 20, 1), 2, conv1=8, primary=4, caps=(4, 4))
  config.routing.name = router
  model = em_capsnet.EMCapsNet(config, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  labels = np.arange(16) % 2
  images = rng.uniform(size=(16, 20, 20, 1)) * 0.2
  images[labels == 1, 4:16, 8:12] += 0.8          # A bar for class 1.
  batch = {"images": jnp.asarray(images, jnp.float32), "labels": jnp.asarray(labels)}
  graphdef, params, state = nnx.split(model, nnx.Param, ...)
  params, state = nnx.to_pure_dict(params), nnx.to_pure_dict(state)   # state: VB's norms.
  tx = optax.adam(0.01)
  opt = tx.init(params)

  @jax.jit
  def step(params, state, opt):
    def objective(p):
      m = nnx.merge(graphdef, p, state)
      value = jnp.mean(m.loss(m.apply(batch, train=True), batch,
                              step=jnp.asarray(200_000))[0])
      return value, nnx.to_pure_dict(nnx.state(m, nnx.BatchStat))
    (value, state), grads = jax.value_and_grad(objective, has_aux=True)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), state, opt, value, grads

  @jax.jit
  def evaluation(params, state):
    model = nnx.merge(graphdef, params, state)
    outputs = model.apply(batch, train=False)
    return outputs.scores, model.metrics(outputs, batch)

  def separation(params):
    scores = np.asarray(evaluation(params, state)[0])
    true = scores[np.arange(16), labels]
    return np.mean(true - scores[np.arange(16), 1 - labels]), np.mean(true > scores[
        np.arange(16), 1 - labels])

  before, _ = separation(params)
  initial_params, initial_state, initial_opt, losses_seen = params, state, opt, []
  for n in range(100):
    params, state, opt, value, grads = step(params, state, opt)
    losses_seen.append(float(value))
    if n == 0:  # The first gradient reaches every routed layer's transforms.
      for layer in (*grads["conv_capsules"].values(), grads["class_capsules"]):
        assert np.isfinite(layer["weights"]).all() and np.abs(layer["weights"]).sum() > 0
      first_grads = grads
  # The first gradient's values (what tests/test_capsule_layers.py checks for the other
  # routers): finite differences of the loss, by the same compiled step, along it and random
  # directions; VB as there (steps of 1e-4, along the gradient only: float32 noise of its
  # betas' tiny gradients exceeds the derivative along random directions).
  vb = router == "variational_bayes"
  check_directional_derivatives(lambda p: step(p, initial_state, initial_opt)[3],
                                (initial_params,), first_grads, epsilon=1e-4 if vb else 1e-3,
                                directions=1 if vb else 3, per_leaf=not vb)
  after, accuracy = separation(params)
  # VB's batch norms (none under EM): training moved every running statistic.
  moved = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(initial_state),
                                                 jax.tree.leaves(state))]
  assert len(moved) == (12 if router == "variational_bayes" else 0) and all(moved)
  scores, metrics = evaluation(params, state)
  assert np.all((np.asarray(scores) > 0) & (np.asarray(scores) < 1))
  names = {"em": ("caps1_coupling_entropy", "caps2_activation_mean"),
           "variational_bayes": ("caps1_coupling_entropy", "caps2_mixing_entropy", "log_sigma")}
  for name in names[router]:
    assert metrics[name].shape[0] == 16 and np.isfinite(metrics[name]).all(), name
  assert abs(before) < 0.01 and after > separated and accuracy == 1.0
  # Measured: EM's spread loss 0.177 -> 0.159 (-10%), still at its lowest at the end; VB's
  # 0.479 -> 0.009 (-98%).
  assert losses_seen[-1] < fall * losses_seen[0]
  assert losses_seen[-1] <= min(losses_seen[:-10])


def test_a_smoke_run_trains_evaluates_and_logs_the_routing(idx_dir, tmp_path_factory):
  workdir = em_smoke_run(idx_dir, tmp_path_factory)
  assert read_summary(workdir)["step"] == 8
  assert_trained(workdir)
  metrics = (workdir / "metrics.jsonl").read_text()
  for name in ("caps1_coupling_entropy", "caps2_activation_mean", "log_sigma", "spread_loss"):
    assert name in metrics


def test_variational_bayes_routes_the_same_layers_with_batch_norms():
  """routing.name='variational_bayes': the same parameters (beta_u, beta_a per type), plus
  the running statistics of each routing layer's two batch norms (that training updates them
  and that the gradient reaches every layer: :func:`test_it_learns_to_separate_two_classes`).
  Shapes only (``nnx.eval_shape``): nothing is compiled."""
  config = model_config((20, 20, 1), 3, conv1=8, primary=4, caps=(4, 4))
  em_model = nnx.eval_shape(lambda: em_capsnet.EMCapsNet(config, rngs=nnx.Rngs(0)))
  config.routing.name = "variational_bayes"
  model = nnx.eval_shape(lambda: em_capsnet.EMCapsNet(config, rngs=nnx.Rngs(0)))
  assert models.count_params(model) == models.count_params(em_model)
  stats = nnx.state(model, nnx.BatchStat)
  assert len(jax.tree.leaves(stats)) == 3 * 2 * 2     # 3 layers x 2 norms x (mean, var).
  assert not jax.tree.leaves(nnx.state(em_model, nnx.BatchStat))


def test_the_vb_variant_trains_with_its_cross_entropy(idx_dir, tmp_path):
  """``configs/em_mnist.py:smoke,vb``: variational Bayes routing trained as its authors' code,
  with the softmax cross-entropy over the class activations (``loss.kind``) and no decay."""
  config = em_mnist.get_config("smoke,vb")
  config.data.source, config.data.dir = "idx", str(idx_dir)
  summary = train.train_and_evaluate(config, str(tmp_path))
  assert summary["step"] == 8
  assert_trained(tmp_path)
  assert summary["config"]["model"]["routing"]["name"] == "variational_bayes"
  assert summary["config"]["model"]["routing"]["prior_nu_offset"] == 1.0
  assert summary["config"]["loss"]["kind"] == "cross_entropy"
  test = summary["evaluations"]["test"]
  assert "cross_entropy" in test and "spread_loss" not in test
  np.testing.assert_allclose(test["loss"], test["cross_entropy"] + test["weight_decay"],
                             rtol=1e-5)
  assert "caps1_mixing_entropy" in (tmp_path / "metrics.jsonl").read_text()
