"""Task: the resolved config (the caller's never written), the one forward function (clean
reconstruction targets, float images, the step reaching the loss) and the model contract
checked at the start of a run."""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

import efficient_capsnet
import em_mnist
import mnist
from capsjax import models, routing
from capsjax.config import registries, schema
from capsjax.common import registry
from capsjax.common.errors import UsageError
from capsjax.models.head_settings import LossSettings
from capsjax.training import tasks, train_step
from helpers import write_idx_dataset

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def bars_32_16(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 32 train, 16 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=32, num_test=16)


def smoke(bars_32_16):
  c = mnist.get_config("smoke")
  c.data.source, c.data.dir = "idx", str(bars_32_16)
  return c


def jitted_forward(task, train):
  """``task.forward`` under jit (eagerly, a capsule model's ops dispatch one by one: slow)."""
  return jax.jit(lambda v, b, step=None: task.forward(v, b, train=train, step=step))


def variables_and_batch(task, n=4):
  params, state = task.init_variables(jax.random.PRNGKey(0))
  test = task.dataset.load()["test"]
  examples = {k: v[:n] for k, v in test.examples.items()}
  return train_step.merge_variables(params, state), task.dataset.eval_batch(examples, {})


def test_the_callers_config_is_never_written(bars_32_16):
  config = smoke(bars_32_16)
  before = config.to_json_best_effort()
  task = tasks.Task.from_config(config)
  assert config.to_json_best_effort() == before
  assert "iterations" not in config.model.routing  # Left out of the file: its default.
  assert task.config.model.routing.iterations == 3 and task.config.model.routing.name == "dynamic"
  assert tuple(task.config.model.image_shape) == (28, 28, 1)
  assert task.config.model.num_classes == 10


def test_reconstruction_targets_stay_clean_when_the_images_move(bars_32_16):
  """The loss's reconstruction part against the images the batch was built from, computed in
  NumPy from the outputs, not against the moved images that went into the network."""
  task = tasks.Task.from_config(smoke(bars_32_16))
  variables, batch = variables_and_batch(task)
  clean = np.asarray(batch["images"], np.float64)
  batch = task.complete_batch(batch)
  noise = np.random.default_rng(0).uniform(-0.3, 0.3, clean.shape).astype(np.float32)
  moved = {**batch, "images": jnp.clip(batch["images"] + noise, 0.0, 1.0)}
  forward = jitted_forward(task, train=False)
  result = forward(variables, moved)
  reconstructions = np.asarray(result.outputs.reconstructions, np.float64)
  expected = 0.0005 * np.sum((reconstructions - clean) ** 2, axis=(1, 2, 3))
  np.testing.assert_allclose(np.asarray(result.loss_parts["reconstruction_loss"]), expected,
                             rtol=1e-5)
  # A batch without targets (built by hand) reconstructs what went in.
  unmarked = {k: v for k, v in moved.items() if k != "reconstruction_targets"}
  against_moved = forward(variables, unmarked)
  assert not np.allclose(np.asarray(against_moved.loss_parts["reconstruction_loss"]), expected,
                         rtol=1e-3)


def test_evaluation_batches_take_float_images_as_they_are(bars_32_16):
  task = tasks.Task.from_config(smoke(bars_32_16))
  variables, batch = variables_and_batch(task)
  test = task.dataset.load()["test"].examples
  pixels = {"images": test["images"][:4], "labels": test["labels"][:4]}
  floats = {"images": test["images"][:4] / np.float32(255.0), "labels": test["labels"][:4]}
  from_pixels = task.dataset.eval_batch(pixels, {})["images"]
  from_floats = task.dataset.eval_batch(floats, {})["images"]
  assert from_floats.dtype == np.float32 and float(np.max(from_floats)) <= 1.0
  np.testing.assert_allclose(np.asarray(from_floats), np.asarray(from_pixels), rtol=1e-6)


def test_the_loss_sees_the_training_step(bars_32_16):
  """The example model's spread-loss margin grows with the step (0.2 -> 0.9 over
  margin_steps): its loss at step 0 is below its loss at margin_steps, the final margin's,
  which evaluation (no step) uses. CapsNet's margin loss has no schedule: the step is unused."""
  task = tasks.Task.from_config(_tiny(bars_32_16, f"{EXAMPLES / 'tiny_capsnet.py'}:TinyCapsNet",
                                      margin_steps=100))
  variables, batch = variables_and_batch(task)
  train = jitted_forward(task, train=True)
  losses = [float(jnp.sum(train(variables, batch, step).loss)) for step in (0, 50, 100, 1000)]
  final = float(jnp.sum(jitted_forward(task, train=False)(variables, batch).loss))
  assert losses[0] < losses[1] < losses[2] == pytest.approx(losses[3]) == pytest.approx(final)

  capsnet = tasks.Task.from_config(smoke(bars_32_16))
  variables, batch = variables_and_batch(capsnet)
  forward = jitted_forward(capsnet, train=False)
  at = [np.asarray(forward(variables, batch, s).loss) for s in (0, 9)]
  np.testing.assert_array_equal(at[0], at[1])


def _model_configs(bars_32_16):
  """CapsNet, Efficient-CapsNet, EM's CapsNet (their smoke configs) and the example model (by
  path), on the generated digits."""
  configs = [smoke(bars_32_16), efficient_capsnet.get_config("smoke"), em_mnist.get_config("smoke"),
             _tiny(bars_32_16, f"{EXAMPLES / 'tiny_capsnet.py'}:TinyCapsNet")]
  for c in configs[1:3]:
    c.data.source, c.data.dir = "idx", str(bars_32_16)
  return configs


def test_a_resolved_config_builds_its_model_without_looking_a_name_up(bars_32_16, monkeypatch):
  """Resolving found the dataset, the model and the router; building the task and the model
  from the resolved config (config.json's) asks no registry, and the layers route with the very
  router resolving chose."""
  resolved = [schema.resolve_config(c) for c in _model_configs(bars_32_16)]

  def refuse(name, *args, **kwargs):
    raise AssertionError(f"{name!r} looked up after the config was resolved")
  monkeypatch.setattr(schema, "router", refuse)
  for table in (registries.ROUTERS, registries.MODELS, registries.DATASETS):
    monkeypatch.setattr(table, "get", refuse)
  for config in resolved:
    task = tasks.Task.from_config(config)
    assert task.model_class is config.choices.model
    assert type(task.dataset) is config.choices.dataset
    router = config.choices.routers["model.routing"]
    assert router.name == config.model.routing.name
    model = task.abstract_model
    routed = [model.class_capsules, *getattr(model, "conv_capsules", [])]
    assert all(layer.router is router for layer in routed)
    assert type(models.create(config, rngs=nnx.Rngs(0))) is config.choices.model


def test_a_model_built_from_a_config_not_resolved_resolves_its_router(bars_32_16):
  """The other way in (a mutable copy, its routing section edited): the section is resolved
  where it is read, the router's defaults filled in."""
  config = schema.resolve_config(smoke(bars_32_16)).as_configdict()
  config.model.routing = ml_collections.ConfigDict({"name": "dynamic"})
  assert routing.chosen_router(config) is None
  model = models.create(config, rngs=nnx.Rngs(0))
  assert model.class_capsules.router is routing.get("dynamic")
  assert dict(model.class_capsules.routing_items)["iterations"] == 3


class _Broken:
  """Models that break one promise each (named by import path in the tests below)."""


def _tiny(bars_32_16, name, margin_steps=10):
  """The smoke config with the example model (or one named ``name``) of tiny sizes."""
  c = smoke(bars_32_16)
  c.model = ml_collections.ConfigDict(dict(
      name=name, image_shape=None, num_classes=None, features=8, types=4, dim=4, class_dim=4,
      margin_steps=margin_steps, routing=dict(name="dynamic")))
  del c["loss"]
  return c


@pytest.mark.parametrize("model,match", [
    ("WrongScores", r"outputs.scores has shape \(2, 9\), not \(batch, num_classes\)"),
    ("NoAccuracy", "metrics has no 'accuracy'"),
    ("ClaimsReconstruction", "declares 'reconstruction' but outputs.reconstructions is None"),
    ("UnknownCapability", r"declares \['telepathy'\]"),
    ("NotOutputs", "apply returned dict, not capsjax.models.Outputs"),
    ("LossWithoutStep", r"LossWithoutStep.loss takes no step= keyword"),
    ("ApplyWithoutRng", r"ApplyWithoutRng.apply takes no rng= keyword"),
    ("NumbersNotTaken", r"NumbersNotTaken.loss takes no numbers= keyword"),
    ("PartsNotADict", "loss returned its parts as tuple, not a dict"),
    ("FloatPredictions", "outputs.predictions has dtype float32, not integer class ids"),
    ("WrongVoteScores", r"vote_scores has shape \(2, 9\), not \(batch, num_classes\)"),
])
def test_a_model_that_breaks_the_contract_is_refused_at_the_start(bars_32_16, model, match):
  with pytest.raises(UsageError, match=match):  # By the class (signatures) or its trace.
    task = tasks.Task.from_config(_tiny(bars_32_16, f"{pathlib.Path(__file__)}:{model}"))
    task.check_outputs(task.dataset.load())


def test_training_is_traced_on_a_train_batch_as_the_train_step_builds_it(bars_32_16,
                                                                        monkeypatch):
  monkeypatch.setattr(tasks, "_CHECKED", set())  # Traced here even if checked before.
  task = tasks.Task.from_config(_tiny(bars_32_16, str(EXAMPLES / "tiny_capsnet.py:TinyCapsNet")))
  built, original = [], task.dataset.train_batch

  def train_batch(key, indices, examples, shared):
    built.append(indices.shape)
    return original(key, indices, examples, shared)

  task.dataset.train_batch = train_batch
  task.check_outputs(task.dataset.load())
  assert built == [(2,)]


def test_a_passed_check_is_not_traced_again_for_the_same_config_and_shapes(bars_32_16,
                                                                           monkeypatch):
  """The second identical check is not traced; a changed setting, or examples of another
  shape, are."""
  monkeypatch.setattr(tasks, "_CHECKED", set())
  config = _tiny(bars_32_16, str(EXAMPLES / "tiny_capsnet.py:TinyCapsNet"))
  traced = []

  def checks(config, splits=None):
    task = tasks.Task.from_config(config)
    monkeypatch.setattr(task, "_check_outputs", traced.append)
    splits = splits or task.dataset.load()
    task.check_outputs(splits)
    return splits

  splits = checks(config)
  checks(config)
  assert len(traced) == 1
  config.model.dim = 8
  checks(config)
  assert len(traced) == 2
  test = splits["test"]
  fewer_rows = dataclasses.replace(test, examples={**test.examples,
                                                  "images": test.examples["images"][:, :-1]})
  checks(config, {**splits, "test": fewer_rows})
  assert len(traced) == 3


def test_a_class_without_the_interface_is_refused_naming_what_it_lacks(bars_32_16):
  with pytest.raises(UsageError, match="_Broken lacks from_config, apply, loss, metrics"):
    tasks.Task.from_config(_tiny(bars_32_16, f"{pathlib.Path(__file__)}:_Broken"))


def _tiny_capsnet():
  return registry.import_module(str(EXAMPLES / "tiny_capsnet.py"), "test").TinyCapsNet


class WrongScores(_tiny_capsnet()):
  def apply(self, batch, *, train, rng=None):
    out = super().apply(batch, train=train, rng=rng)
    return out.replace(scores=out.scores[:, :9])


class NoAccuracy(_tiny_capsnet()):
  def metrics(self, outputs, batch):
    return {"correct": super().metrics(outputs, batch)["accuracy"]}


class ClaimsReconstruction(_tiny_capsnet()):
  def capabilities(self):
    return frozenset({"reconstruction"})


class UnknownCapability(_tiny_capsnet()):
  def capabilities(self):
    return frozenset({"telepathy"})


class LossWithoutStep(_tiny_capsnet()):
  def loss(self, outputs, batch):
    return super().loss(outputs, batch)


class NumbersNotTaken(_tiny_capsnet()):
  per_run_numbers = LossSettings  # Declared per-run, but its loss cannot be given them.

  def loss(self, outputs, batch, *, step=None):
    return super().loss(outputs, batch, step=step)


class ApplyWithoutRng(_tiny_capsnet()):
  def apply(self, batch, *, train):
    return super().apply(batch, train=train)


class PartsNotADict(_tiny_capsnet()):
  def loss(self, outputs, batch, *, step=None):
    loss, parts = super().loss(outputs, batch, step=step)
    return loss, tuple(parts.values())


class FloatPredictions(_tiny_capsnet()):
  def apply(self, batch, *, train, rng=None):
    out = super().apply(batch, train=train, rng=rng)
    return out.replace(predictions=out.predictions.astype(jnp.float32))


class WrongVoteScores(_tiny_capsnet()):
  def capabilities(self):
    return frozenset({"votes"})

  def vote_scores(self, batch):
    return jnp.zeros((batch["images"].shape[0], 9))


class NotOutputs(_tiny_capsnet()):
  def apply(self, batch, *, train, rng=None):
    out = super().apply(batch, train=train, rng=rng)
    return {"scores": out.scores}

  def loss(self, outputs, batch, *, step=None):
    return jnp.zeros(outputs["scores"].shape[:1]), {}

  def metrics(self, outputs, batch):
    return {"accuracy": jnp.zeros(outputs["scores"].shape[:1])}
