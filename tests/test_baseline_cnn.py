"""models.baseline_cnn: the paper's baseline CNN against the paper's size and a NumPy forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import affnist
import mnist_baseline
from capsjax import models
from capsjax.common.errors import UsageError
from capsjax.config import schema
from capsjax.models.baseline_cnn import BaselineCNN
from helpers import abstract_model


def test_paper_parameter_count():
  config = mnist_baseline.get_config()
  model = abstract_model(config)
  assert isinstance(model, BaselineCNN)
  assert models.count_params(model) == 35_445_522


def test_affnist_baseline_has_about_capsnets_size():
  baseline = abstract_model(affnist.get_config("baseline"))
  capsnet = abstract_model(affnist.get_config())
  assert models.count_params(baseline) == 13_471_833
  assert models.count_params(capsnet) == 13_475_648


def tiny_config(**overrides):
  c = mnist_baseline.get_config("smoke")
  c.model.image_shape = (5, 5, 1)
  c.model.conv_features, c.model.kernel_size, c.model.pool = (2,), 3, (2,)
  c.model.hidden = (3,)
  c.model.num_classes = 4
  c.model.update(overrides)
  return c


def numpy_forward(params, images):
  """SAME 3x3 conv + bias + ReLU, SAME 2x2 max pool, dense ReLU, dense: plain loops."""
  kernel = np.asarray(params["convs"][0]["kernel"], np.float64)
  bias = np.asarray(params["convs"][0]["bias"], np.float64)
  n, h, w, _ = images.shape
  padded = np.pad(images, ((0, 0), (1, 1), (1, 1), (0, 0)))
  conv = np.zeros((n, h, w, kernel.shape[-1]))
  for i in range(h):
    for j in range(w):
      conv[:, i, j] = np.einsum("nabc,abcd->nd", padded[:, i:i + 3, j:j + 3], kernel) + bias
  conv = np.maximum(conv, 0)
  pooled = np.full((n, 3, 3, conv.shape[-1]), -np.inf)  # SAME: ceil(5 / 2) = 3, no padding
  for i in range(3):                                    # before; the odd row is alone.
    for j in range(3):
      pooled[:, i, j] = conv[:, 2 * i:2 * i + 2, 2 * j:2 * j + 2].max(axis=(1, 2))
  x = pooled.reshape(n, -1)
  dense = params["dense"]
  x = np.maximum(x @ np.asarray(dense[0]["kernel"]) + np.asarray(dense[0]["bias"]), 0)
  return x @ np.asarray(dense[1]["kernel"]) + np.asarray(dense[1]["bias"])


def test_loss_matches_a_hand_computation():
  config = tiny_config()
  model = models.create(config, rngs=nnx.Rngs(3))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  params["convs"][0]["bias"] = jnp.asarray([0.3, -0.2])
  nnx.update(model, params)
  images = np.random.default_rng(0).uniform(size=(3, 5, 5, 1))
  labels = np.array([0, 3, 1])
  batch = {"images": jnp.asarray(images, jnp.float32), "labels": jnp.asarray(labels)}
  outputs = model.apply(batch, train=False)
  loss, parts = model.loss(outputs, batch)
  logits = numpy_forward(params, images)
  expected = np.log(np.exp(logits).sum(1)) - logits[np.arange(3), labels]  # -log softmax.
  np.testing.assert_allclose(np.asarray(outputs.logits), logits, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(parts["cross_entropy"]), expected, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(outputs.scores).sum(1), 1.0, rtol=1e-6)
  accuracy = model.metrics(outputs, batch)["accuracy"]
  np.testing.assert_array_equal(np.asarray(accuracy), logits.argmax(1) == labels)


def test_dropout_only_in_training():
  config = tiny_config(dropout_rate=0.5, hidden=(64,))  # Wide: some units are always alive.
  model = models.create(config, rngs=nnx.Rngs(0))
  batch = {"images": jax.random.uniform(jax.random.key(0), (8, 5, 5, 1)),
           "labels": jnp.zeros(8, jnp.int32)}
  evaluation = [model.apply(batch, train=False, rng=jax.random.key(k)).logits for k in (1, 2)]
  np.testing.assert_array_equal(np.asarray(evaluation[0]), np.asarray(evaluation[1]))
  np.testing.assert_array_equal(np.asarray(model.apply(batch, train=False).logits),
                                np.asarray(evaluation[0]))
  training = [model.apply(batch, train=True, rng=jax.random.key(k)).logits for k in (1, 2)]
  assert np.abs(np.asarray(evaluation[0])).max() > 0
  assert not np.allclose(np.asarray(training[0]), np.asarray(training[1]))
  assert not np.allclose(np.asarray(training[0]), np.asarray(evaluation[0]))
  no_dropout = models.create(tiny_config(dropout_rate=0.0, hidden=(64,)), rngs=nnx.Rngs(0))
  np.testing.assert_allclose(
      np.asarray(no_dropout.apply(batch, train=True, rng=jax.random.key(1)).logits),
      np.asarray(evaluation[0]), rtol=1e-6)


@pytest.mark.parametrize("key,value,match", [
    ("pool", (2, 2), "pooling size .* for each of the 1 convolutions"),
    ("hidden", (), "conv_features and hidden must not be empty"),
])
def test_settings_that_do_not_fit_together_are_refused_naming_the_key(key, value, match):
  with pytest.raises(UsageError, match=match):
    models.create(tiny_config(**{key: value}), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("key,value,match", [
    ("dropout_rate", 1.0, r"dropout_rate=1\.0 is out of range: it must be in \[0, 1\)"),
    ("conv_impl", "fft", r"conv_impl='fft' is out of range: it must be one of"),
    ("padding", "FULL", r"padding='FULL' is out of range: it must be one of"),
    ("loss", "hinge", r"loss='hinge' is out of range: it must be one of"),
    ("hidden", (0,), r"hidden=\(0,\) is out of range: it must be each >= 1"),
])
def test_a_value_out_of_range_is_refused_naming_the_key(key, value, match):
  config = mnist_baseline.get_config("smoke")
  config.model[key] = value
  with pytest.raises(UsageError, match=rf"config\.model\.{match}"):
    schema.resolve_config(config)


def test_unknown_model_name():
  config = tiny_config(name="resnet")
  with pytest.raises(UsageError, match="config.model.name='resnet' is not a registered model"):
    models.get(config)


def test_two_labels_use_sigmoids_and_a_two_hot_target():
  import multimnist

  assert models.count_params(abstract_model(multimnist.get_config("baseline"))) == 24_549_212
  model = models.create(tiny_config(), rngs=nnx.Rngs(3))
  images = np.random.default_rng(1).uniform(size=(2, 5, 5, 1))
  batch = {"images": jnp.asarray(images, jnp.float32), "labels": jnp.asarray([[0, 3], [2, 1]])}
  outputs = model.apply(batch, train=False)
  loss, parts = model.loss(outputs, batch)
  logits = numpy_forward(nnx.to_pure_dict(nnx.state(model, nnx.Param)), images)
  target = np.zeros((2, 4))
  target[[0, 0, 1, 1], [0, 3, 2, 1]] = 1
  p = 1 / (1 + np.exp(-logits))
  expected = -(target * np.log(p) + (1 - target) * np.log(1 - p)).sum(1)
  np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(outputs.scores), p, rtol=1e-5)
  assert set(parts) == {"sigmoid_cross_entropy"}
  assert set(model.metrics(outputs, batch)) == {"accuracy", "at_least_one"}


def test_valid_padding_shrinks_each_convolution_by_its_kernel():
  """5x5 images, 3x3 VALID convolution -> 3x3, 2x2 SAME pooling -> 2x2: 2 x 2 x 2 inputs to
  the first dense layer (SAME: 3 x 3 x 2)."""
  for padding, inputs in (("VALID", 2 * 2 * 2), ("SAME", 3 * 3 * 2)):
    model = models.create(tiny_config(padding=padding), rngs=nnx.Rngs(0))
    assert model.dense[0].kernel[...].shape == (inputs, 3)
    batch = {"images": jnp.ones((2, 5, 5, 1)), "labels": jnp.zeros(2, jnp.int32)}
    assert model.apply(batch, train=False).logits.shape == (2, 4)
