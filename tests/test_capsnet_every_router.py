"""CapsNet with each router: today's model unchanged under ``dynamic``, router parameters in
the parameter tree, class scores, and the settings a router cannot use refused."""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import mnist
from capsjax import models, routing, train
from capsjax.common.errors import UsageError
from capsjax.models import capsnet
from helpers import (ROUTER_NAMES, assert_trained, check_directional_derivatives,
                     main_in_process, parse_config_flags, read_summary, resolved,
                     write_idx_dataset)

NAMES = ROUTER_NAMES


def smoke_config(router="dynamic"):
  config = mnist.get_config("smoke")
  config.model.routing.name = router
  return resolved(config).model


def _batch(n=4):
  images = jnp.asarray(np.random.RandomState(0).rand(n, 28, 28, 1), jnp.float32)
  return {"images": images, "labels": jnp.arange(n) % 10, "reconstruction_targets": images}


def test_the_models_class_capsules_are_procedure_1_computed_in_numpy():
  """Votes u_hat_{j|i} = W_ij u_i (Eq. 2) and three iterations of Procedure 1 (softmax over
  the parents, Eq. 3; squash, Eq. 1), in float64 NumPy from the layer's W alone."""
  c = smoke_config()
  model = capsnet.CapsNet(c, rngs=nnx.Rngs(0))
  assert set(nnx.to_pure_dict(nnx.state(model.class_capsules, nnx.Param))) == {"weights"}
  weights = np.asarray(model.class_capsules.weights[...], np.float64)  # (in, out, d_out, d_in)
  in_caps = weights.shape[0]
  children = np.random.RandomState(1).normal(size=(2, in_caps, c.primary.dim)).astype(
      np.float32)
  votes = np.einsum("ijdk,bik->bijd", weights, children.astype(np.float64))
  logits = np.zeros(votes.shape[:3])
  for _ in range(3):
    coupling = np.exp(logits - logits.max(axis=2, keepdims=True))
    coupling /= coupling.sum(axis=2, keepdims=True)
    s = np.einsum("bij,bijd->bjd", coupling, votes)
    norm2 = np.sum(s * s, axis=-1, keepdims=True)
    parents = norm2 / (1 + norm2) * s / np.sqrt(norm2)
    logits = logits + np.einsum("bijd,bjd->bij", votes, parents)
  got = model.class_capsules(jnp.asarray(children))
  np.testing.assert_allclose(np.asarray(got), parents, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name,extra", [
    ("dynamic", 0), ("uniform", 0), ("random", 0),
    ("self_attention", 10 * 144),                  # b: (out_caps, in_caps).
    ("inverted_dot_product", 3 * 8 + 1),           # LayerNorm scale, offset; readout w, c.
    ("self_routing", 144 * 10 * 4 + 144 * 10),     # W_route (in, out, in_dim), b_route.
    ("em", 10 + 10),                               # beta_u, beta_a per class.
    ("variational_bayes", 10 + 10),                # beta_u, beta_a per class.
])
def test_router_parameters_are_model_parameters(name, extra):
  base = models.count_params(capsnet.CapsNet(smoke_config(), rngs=nnx.Rngs(0)))
  model = capsnet.CapsNet(smoke_config(name), rngs=nnx.Rngs(0))
  assert model.class_capsules.weights.shape[0] == 144  # 6x6 grid x 4 types (smoke).
  assert models.count_params(model) == base + extra


@pytest.mark.parametrize("name", NAMES)
def test_every_router_trains_and_evaluates_in_the_model(name):
  model = capsnet.CapsNet(smoke_config(name), rngs=nnx.Rngs(0))
  batch = _batch()
  graphdef, params = nnx.split(model, nnx.Param)
  params = nnx.to_pure_dict(params)

  def objective(p):
    m = nnx.merge(graphdef, p)
    return jnp.mean(m.loss(m.apply(batch, train=True, rng=jax.random.PRNGKey(0)), batch)[0])

  grads = jax.jit(jax.grad(objective))(params)
  # The gradient's values, through every layer and the router: finite differences of the
  # loss along the gradient and random directions of all the parameters.
  check_directional_derivatives(jax.jit(objective), (params,), grads)
  outputs = model.apply(batch, train=False)
  metrics = model.metrics(outputs, batch)
  scores = np.asarray(outputs.scores)
  assert scores.shape == (4, 10)
  np.testing.assert_array_equal(np.asarray(metrics["accuracy"]),
                                np.argmax(scores, axis=1) == np.asarray(batch["labels"]))
  measured = set(metrics) - {"accuracy", "class_capsule_length", "saturated_fraction"}
  assert "coupling_entropy" in measured and all(metrics[k].ndim == 2 for k in measured)
  # Coupling entropy per iteration: of a distribution over the 10 parents at most log 10.
  entropy = np.asarray(metrics["coupling_entropy"])
  assert np.all((entropy >= -1e-6) & (entropy <= np.log(10) + 1e-5)), entropy
  # Saturation is watched where the squash bounds the scores.
  assert ("saturated_fraction" in metrics) == routing.get(name).squashes


def test_self_routing_scores_by_parent_activations_unless_told_lengths():
  batch = _batch()
  model = capsnet.CapsNet(smoke_config("self_routing"), rngs=nnx.Rngs(0))
  outputs = model.apply(batch, train=False)
  routed = model.class_capsules.route(model.primary_capsules(jax.nn.relu(
      model.conv1(batch["images"]))))
  np.testing.assert_allclose(np.asarray(outputs.scores), np.asarray(routed.activations),
                             rtol=1e-6)
  c = smoke_config("self_routing")
  c.class_capsules.scores = "lengths"
  by_lengths = capsnet.CapsNet(c, rngs=nnx.Rngs(0)).apply(batch, train=False)
  np.testing.assert_array_equal(np.asarray(by_lengths.scores), np.asarray(by_lengths.lengths))


@pytest.mark.parametrize("router,key,value,match", [
    ("dynamic", "class_capsules.scores", "activations", "computes no parent activations"),
    ("dynamic", "class_capsules.scores", "probabilities", "scores='probabilities' is out of "
                                                         "range: it must be one of"),
    ("self_attention", "class_capsules.use_bias", True, "does not form"),
    ("uniform", "routing.iterations", 2, "iterations=2 is not a setting of router 'uniform'"),
])
def test_settings_the_router_cannot_use_are_refused(router, key, value, match):
  """Refused when the config is resolved (a value out of its declared range) or when the model
  is built (a value this router cannot use), naming the key."""
  config = mnist.get_config("smoke")
  config.model.routing.name = router
  section, name = key.split(".")
  config.model[section][name] = value
  with pytest.raises(UsageError, match=match):
    capsnet.CapsNet(resolved(config).model, rngs=nnx.Rngs(0))


DATA = pathlib.Path(__file__).with_name("data")


def test_dynamic_gives_the_outputs_of_the_code_before_routers():
  """tests/data/dynamic_reference.npz: the smoke CapsNet (nnx.Rngs(0)) on fixed images, saved
  by the code before the routing package. Same parameters and the same operations; the
  tolerance allows only for XLA picking other vector widths on another CPU."""
  reference = np.load(DATA / "dynamic_reference.npz")
  model = capsnet.CapsNet(smoke_config(), rngs=nnx.Rngs(0))
  got = model(jnp.asarray(reference["images"])).class_capsules
  np.testing.assert_allclose(np.asarray(got), reference["class_capsules"], rtol=1e-6,
                             atol=1e-7)


def test_a_run_written_before_routers_resumes(tmp_path, capsys):
  """tests/data/pre_router_run: a tiny run's config.json and step-2 checkpoint, written by the
  code before the routing package; this code resumes it and trains on."""
  workdir = tmp_path / "run"
  shutil.copytree(DATA / "pre_router_run", workdir)
  config = mnist.get_config("smoke")
  config.model.conv1.features = 4
  config.model.primary.num_types, config.model.primary.dim = 2, 2
  config.model.class_capsules.dim = 2
  config.model.decoder.hidden = (4, 4)
  config.train.num_steps, config.train.checkpoint_every_steps = 3, 2
  config.data.train_limit, config.data.test_limit = 64, 32
  config.data.source = "idx"
  config.data.dir = str(write_idx_dataset(tmp_path / "idx", 128, 64))
  before = json.loads((workdir / "config.json").read_text())
  assert "name" not in before["model"]["routing"]  # Written before routers had names.
  summary = train.train_and_evaluate(config, str(workdir))
  assert "Resuming from the checkpoint at step 2" in capsys.readouterr().out
  assert summary["step"] == 3
  assert not list(workdir.glob("config.before_step_*.json"))  # No setting changed.


@pytest.mark.parametrize("name", NAMES)
def test_a_batch_sharded_on_four_devices_gives_the_loss_of_one_device(name):
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  model = capsnet.CapsNet(smoke_config(name), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  batch = _batch(8)

  @jax.jit
  def loss(p, b):
    m = nnx.merge(graphdef, p)
    return jnp.mean(m.loss(m.apply(b, train=True, rng=jax.random.PRNGKey(0)), b)[0])

  losses = []
  for devices in (jax.devices()[:1], jax.devices()[:4]):
    mesh = Mesh(np.asarray(devices), ("batch",))
    sharded = jax.device_put(batch, NamedSharding(mesh, P("batch")))
    losses.append(float(loss(jax.device_put(params, NamedSharding(mesh, P())), sharded)))
  assert len(jax.devices()) >= 4
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


def test_the_smoke_config_runs_end_to_end_with_a_router_named_on_the_command_line(tmp_path,
                                                                                  capsys):
  """``python -m capsjax.main --config=configs/mnist.py:smoke`` with a router named on the
  command line alone, end to end (one router: the loop does not depend on which; every
  router's loss, gradient and evaluation in the model are checked above, and every router's
  command line below). Its command line in this process (helpers.main_in_process: the same
  flags and entry point, without a second JAX import)."""
  data = write_idx_dataset(tmp_path / "idx", 64, 32)
  result = main_in_process(capsys, tmp_path / "run", "--config.model.routing.name=self_attention",
                           "--config.train.num_steps=2", data_dir=data)
  assert result.returncode == 0, result.stdout + result.stderr
  summary = read_summary(tmp_path / "run")
  assert summary["config"]["model"]["routing"]["name"] == "self_attention"
  assert "coupling_entropy" in summary["evaluations"]["test"]
  assert_trained(tmp_path / "run")


@pytest.mark.parametrize("name", NAMES)
def test_a_router_named_alone_on_the_command_line_gets_its_own_settings(name):
  """``--config.model.routing.name=NAME`` and nothing else: the task builds (every setting
  checked, the model's shapes traced) and the resolved config, what config.json records,
  holds that router's settings at their defaults and leaves the other routers' unset."""
  from capsjax.training import tasks

  config = parse_config_flags(f"--config.model.routing.name={name}",
                              config="configs/mnist.py:smoke")
  task = tasks.Task.from_config(config)
  recorded = task.config.model.routing.to_dict()
  _, own = routing.resolve({"name": name})
  assert recorded["name"] == name
  assert {k: recorded[k] for k in own} == own
  assert all(v is None for k, v in recorded.items() if k not in own and k != "name")
