"""The one capsule-layer stack (capsjax/models/capsule_layers.py, conv_capsules.py): every
router at every routed layer of matrix capsules, a convolutional layer's per-receptive-field
routing against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from capsjax import routing
from capsjax.common.errors import UsageError
from capsjax.models import conv_capsules, em_capsnet
from test_em_capsnet import model_config
from test_em_routing import np_conv_votes
from test_routing_dynamic import np_routing
from helpers import REPO, check_directional_derivatives, sweep_in_process, write_idx_dataset


def conv_layer(router: str, **settings):
  routing_config = {"name": router, **routing.resolve({"name": router, **settings})[1]}
  return conv_capsules.ConvCapsules(2, 3, 3, 2, 4, init_scale=0.3, routing=routing_config,
                                     rngs=nnx.Rngs(0))


@pytest.mark.parametrize("iterations", [1, 3])
def test_dynamic_routing_routes_each_receptive_field_as_procedure_1(iterations):
  """Dynamic routing in a convolutional layer: each parent position's 2 x 3 x 3 children
  routed on their own by Procedure 1 (the NumPy re-derivation of tests/test_routing_dynamic.py), the
  parents' lengths their activations; the children's activations play no part."""
  rng = np.random.default_rng(0)
  poses = rng.normal(size=(2, 7, 7, 2, 16)) * 0.5
  layer = conv_layer("dynamic", iterations=iterations)
  got_poses, got_acts, measured = layer(jnp.asarray(poses, jnp.float32),
                                        jnp.asarray(rng.uniform(size=(2, 7, 7, 2)), jnp.float32),
                                        diagnostics=True)
  votes, (oh, ow) = np_conv_votes(poses, np.asarray(layer.weights[...], np.float64), 2)
  assert got_poses.shape == (2, oh, ow, 3, 16) and got_acts.shape == (2, oh, ow, 3)
  for y, x in np.ndindex(oh, ow):
    parents, _ = np_routing(votes[:, :, :, y * ow + x], iterations)
    np.testing.assert_allclose(got_poses[:, y, x], parents, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(got_acts[:, y, x], np.linalg.norm(parents, axis=-1),
                               rtol=2e-4, atol=1e-6)
  assert measured["coupling_entropy"].shape == (2, iterations)
  # Other children's activations change nothing: dynamic routing reads the votes only.
  again, _, _ = layer(jnp.asarray(poses, jnp.float32), jnp.zeros((2, 7, 7, 2)))
  np.testing.assert_allclose(again, got_poses, rtol=1e-6)


def test_a_router_without_activation_logits_refuses_the_routing_norms():
  with pytest.raises(UsageError, match="router 'dynamic' gives none"):
    conv_capsules.ConvCapsules(2, 3, 3, 2, 4, init_scale=0.3,
                                routing={"name": "dynamic", **routing.resolve({})[1]},
                                routing_norms=True, rngs=nnx.Rngs(0))


def _researchers_layer_router(calls: list):
  """A researcher's router that routes a convolutional layer as a whole: each parent the
  activation-weighted mean of its votes over the layer's children, normalised by
  ``layer.child_sum`` of the activations; it records what the layer handed it."""
  def route_layer(votes, *, activations, params, settings, layer, diagnostics=False):
    calls.append(layer)
    weights = activations / layer.child_sum(jnp.broadcast_to(activations, votes.shape[:4]))
    parents = jnp.sum(weights[..., None] * votes, axis=1)
    logits = jnp.sum(parents, axis=-1)
    return routing.RoutingResult(parents, jax.nn.sigmoid(logits), {}, activation_logits=logits)

  dynamic = routing.get("dynamic")
  return routing.Router(name="layer_mean", settings={"iterations": 1}, route=dynamic.route,
                        route_layer=route_layer, activation_logits=True)


def test_a_router_declaring_route_layer_routes_a_convolutional_layer_as_a_whole(monkeypatch):
  """The layer asks the router, not its name: a researcher's router with ``route_layer`` gets
  the whole layer's votes and a :class:`capsjax.routing.ConvLayer` whose ``child_sum`` sums
  over every receptive field a child is in (a 1-pixel child at stride 1, kernel 3: 9 fields
  at the centre, 1 at a corner), and its activation logits go to the routing norms."""
  calls = []
  router = _researchers_layer_router(calls)
  monkeypatch.setattr(routing, "get", lambda name, _get=routing.get: (
      router if name == "layer_mean" else _get(name)))
  layer = conv_capsules.ConvCapsules(1, 2, 3, 1, 2, init_scale=0.3,
                                      routing={"name": "layer_mean", "iterations": 1},
                                      rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  poses = jnp.asarray(rng.normal(size=(1, 5, 5, 1, 4)), jnp.float32)
  got, activations, _ = layer(poses, jnp.ones((1, 5, 5, 1)))
  (conv_layer_seen,) = calls
  assert conv_layer_seen.num_children == 25 and conv_layer_seen.normalisation == "code"
  counts = conv_layer_seen.child_sum(jnp.ones((1, 9, 2, 9)))   # (b, children, out, positions)
  covering = np.zeros((5, 5))       # Per pixel: the (field, output type) pairs that hold it.
  for y, x, dy, dx in np.ndindex(3, 3, 3, 3):
    covering[y + dy, x + dx] += 2
  # Child (dy, dx) of the field at (y, x) is the pixel (y + dy, x + dx).
  expected = np.array([[[covering[y + dy, x + dx] for y in range(3) for x in range(3)]] * 2
                       for dy in range(3) for dx in range(3)])
  np.testing.assert_allclose(counts[0], expected)
  assert got.shape == (1, 3, 3, 2, 4) and activations.shape == (1, 3, 3, 2)
  normed = conv_capsules.ConvCapsules(1, 2, 3, 1, 2, init_scale=0.3, routing_norms=True,
                                       routing={"name": "layer_mean", "iterations": 1},
                                       rngs=nnx.Rngs(0))
  _, normed_activations, _ = normed(poses, jnp.ones((1, 5, 5, 1)), train=True)
  # The same weights: the router's logits, batch-normalised per type over the positions
  # (no affine, epsilon 1e-5), then the sigmoid.
  logits = np.log(np.asarray(activations) / (1 - np.asarray(activations)))
  centred = logits - logits.mean(axis=(0, 1, 2))
  expected = 1 / (1 + np.exp(-centred / np.sqrt(np.mean(centred ** 2, axis=(0, 1, 2)) + 1e-5)))
  np.testing.assert_allclose(normed_activations, expected, rtol=1e-3, atol=1e-4)


# EM and variational Bayes, em_capsnet's own routers, are checked the same way (a gradient
# into each routed layer's transforms equal to finite differences, scores, caps1_/caps2_
# diagnostics) by tests/test_em_capsnet.py::test_it_learns_to_separate_two_classes, on the
# program it trains with: their programs here compiled for 12-16 s each.
OWN_ROUTERS = ("em", "variational_bayes")


@pytest.mark.parametrize("router", [r for r in routing.ROUTERS.names() if r not in OWN_ROUTERS])
def test_every_router_runs_at_every_routed_layer_of_em_capsnet(router):
  """``em_capsnet`` with ``routing.name`` = each other router: training gives a finite loss
  and a gradient into both convolutional capsule layers' and the class layer's transforms;
  evaluation gives one score per class and each layer's diagnostics (``caps1_...``)."""
  config = model_config((20, 20, 1), 3, conv1=8, primary=4, caps=(4, 4))
  config.routing.name = router
  model = em_capsnet.EMCapsNet(config, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  batch = {"images": jnp.asarray(rng.uniform(size=(4, 20, 20, 1)), jnp.float32),
           "labels": jnp.arange(4) % 3}
  graphdef, params, state = nnx.split(model, nnx.Param, ...)
  params, state = nnx.to_pure_dict(params), nnx.to_pure_dict(state)  # state: VB's norms.

  lengths_scored = not routing.get(router).yields_activations

  @jax.jit  # One program for the whole check (op by op it takes minutes).
  def check(params):
    def objective(p):
      m = nnx.merge(graphdef, p, state)
      out = m.apply(batch, train=True, rng=jax.random.key(1))
      return jnp.mean(m.loss(out, batch, step=jnp.asarray(0))[0])
    value, grads = jax.value_and_grad(objective)(params)
    evaluation = nnx.merge(graphdef, params, state)
    # The class capsules' poses, for the scores' check below (op by op: 200 small programs).
    poses = evaluation.capsules(batch["images"])[0] if lengths_scored else None
    evaluation = evaluation.apply(batch, train=False)
    return value, grads, evaluation.scores, evaluation.diagnostics, poses

  value, grads, scores, diagnostics, poses = check(params)
  assert scores.shape == (4, 3) and np.all(np.isfinite(scores))
  for layer in (grads["conv_capsules"][0], grads["conv_capsules"][1], grads["class_capsules"]):
    assert np.abs(layer["weights"]).sum() > 0
  # The gradient's values: finite differences of the loss along it and random directions.
  # Steps of 1e-3 (ReLU kinks: a shift of conv1's bias of 1e-2 crosses them).
  check_directional_derivatives(lambda p: check(p)[0], (params,), grads, epsilon=1e-3)
  assert {k.split("_")[0] for k in diagnostics} >= {"caps1", "caps2"}, sorted(diagnostics)
  if lengths_scored:  # Scores are the class capsules' lengths.
    np.testing.assert_allclose(scores, np.linalg.norm(poses, axis=-1), rtol=1e-5)


def test_the_capsule_type_experiment_runs_both_types_through_the_sweep(tmp_path, capsys,
                                                                       monkeypatch):
  """``experiments/capsule_type_vs_routing.py``: vector x matrix capsules x four routers;
  ``:tiny`` runs a vector and a matrix point from the command line, and results.md names each
  row's capsule type."""
  from capsjax import sweep
  path = "experiments/capsule_type_vs_routing.py"
  module = sweep.load_experiment(path)
  points = sweep.expand(sweep.experiment_sweep(module, path))
  assert [(p.overrides["config"], p.overrides["model.routing.name"]) for p in points] == [
      (config, router) for config in ("configs/mnist.py", "configs/em_mnist.py:small")
      for router in ("dynamic", "em", "variational_bayes", "uniform")]
  data = write_idx_dataset(tmp_path / "idx", num_train=64, num_test=16)
  monkeypatch.chdir(REPO)  # The experiment names its config files from the repository.
  # Vector capsules with dynamic routing (the smoke config's own program, compiled by other
  # tests on 64 examples) and matrix capsules with uniform coupling (no routing iterations: the
  # cheapest matrix program to compile).
  result = sweep_in_process(capsys, path + ":tiny", tmp_path / "runs", "--index=0,7",
                            "--config.eval.num_figure_examples=0", data_dir=data)
  assert result.returncode == 0, result.stderr
  tiny = sweep.expand(sweep.experiment_sweep(module, path + ":tiny"))
  sweep.collect(tiny, str(tmp_path / "runs"), references=module.REFERENCES)
  table = (tmp_path / "runs" / "results.md").read_text()
  assert "| capsules |" in table.splitlines()[0]
  rows = [line for line in table.splitlines()[2:] if line.startswith("| ")]
  assert len(rows) == 2 and "| vector |" in rows[0] and "| matrix |" in rows[1], table
  assert "Not finished (6)" in table
