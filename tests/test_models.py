"""CapsNet assembled from configs: sizes, masking, jit, invariants."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

import mnist
from capsjax import models
from capsjax.models import losses
from capsjax.models import capsnet
from helpers import (abstract_model, check_directional_derivatives, largest_intermediate,
                     resolved)


def paper_config():
  return resolved(mnist.get_config()).model


def smoke_config():
  return resolved(mnist.get_config("smoke")).model


def test_paper_parameter_counts():
  c = paper_config()
  def paper_size(c):
    return models.count_params(nnx.eval_shape(lambda: capsnet.CapsNet(c, rngs=nnx.Rngs(0))))

  # The default has the official code's (10, 16) bias on s_j; the paper's text has none.
  assert paper_size(c) == 8_215_728
  text = resolved(mnist.get_config("text")).model
  assert paper_size(text) == 8_215_568
  c.decoder.enabled = text.decoder.enabled = False
  assert paper_size(c) == 6_804_384
  assert paper_size(text) == 6_804_224


def test_paper_primary_capsule_grid():
  assert capsnet.primary_grid(paper_config()) == (6, 6)
  model = capsnet.CapsNet(paper_config(), rngs=nnx.Rngs(0))
  assert model.class_capsules.weights.shape == (1152, 10, 16, 8)


def test_config_without_decoder_init_keys_builds_the_default_decoder():
  # A config that leaves model.decoder.init_scale/bias_init out (the text's, and config.json of
  # workdirs written before the keys existed) gets the declared defaults: LeCun, biases 0.
  config = mnist.get_config("text,smoke")
  assert "init_scale" not in config.model.decoder
  left_out = resolved(config).model
  config.model.decoder.update(dict(init_scale=0.0, bias_init=0.0))
  restored = capsnet.CapsNet(left_out, rngs=nnx.Rngs(0))
  current = capsnet.CapsNet(resolved(config).model, rngs=nnx.Rngs(0))
  for a, b in zip(jax.tree.leaves(nnx.state(restored.decoder)),
                  jax.tree.leaves(nnx.state(current.decoder))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("image_shape,num_classes,in_caps", [
    ((36, 36, 1), 10, 10 * 10 * 4), ((32, 32, 3), 7, 8 * 8 * 4), ((28, 28, 1), 10, 6 * 6 * 4)])
def test_shapes_come_from_config(image_shape, num_classes, in_caps):
  c = smoke_config()
  c.image_shape = image_shape
  c.num_classes = num_classes
  model = nnx.eval_shape(lambda: capsnet.CapsNet(c, rngs=nnx.Rngs(0)))
  assert model.class_capsules.weights.shape[:2] == (in_caps, num_classes)
  out = nnx.eval_shape(lambda m, x, y: m(x, y, train=True), model,
                       jnp.zeros((2, *image_shape)), jnp.asarray([0, 1]))
  assert out.class_capsules.shape == (2, num_classes, c.class_capsules.dim)
  assert out.reconstructions.shape == (2, *image_shape)


def test_decoder_masks_with_labels_in_training_and_predictions_in_eval():
  model = capsnet.CapsNet(smoke_config(), rngs=nnx.Rngs(0))
  images = jax.random.uniform(jax.random.key(1), (4, 28, 28, 1))
  evaluated = model(images)
  predictions = evaluated.predictions
  wrong = (predictions + 1) % 10
  trained = model(images, wrong, train=True)
  np.testing.assert_allclose(np.asarray(trained.reconstructions),
                             np.asarray(model.decode(trained.class_capsules, wrong)), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(evaluated.reconstructions),
                             np.asarray(model.decode(evaluated.class_capsules, predictions)),
                             rtol=1e-6)
  assert not np.allclose(np.asarray(trained.reconstructions),
                         np.asarray(evaluated.reconstructions))
  # Labels are ignored at evaluation.
  np.testing.assert_allclose(np.asarray(model(images, wrong).reconstructions),
                             np.asarray(evaluated.reconstructions), rtol=1e-6)
  with pytest.raises(ValueError, match="pass labels"):
    model(images, train=True)


def test_jit_forward_and_grad_with_lengths_in_unit_interval():
  model = capsnet.CapsNet(smoke_config(), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  images = jax.random.uniform(jax.random.key(2), (8, 28, 28, 1))
  labels = jnp.arange(8) % 10

  params = nnx.to_pure_dict(params)

  @jax.jit
  def loss_fn(params):
    out = nnx.merge(graphdef, params)(images, labels, train=True)
    return (losses.margin_loss(out.lengths, labels)
            + losses.reconstruction_loss(out.reconstructions, images)), (out.lengths,
                                                                          out.reconstructions)

  (loss, (lengths, reconstructions)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  lengths = np.asarray(lengths, np.float64)
  assert np.all((lengths >= 0) & (lengths < 1))
  # Eq. 4 summed over the classes and 0.0005 x the summed squared error, batch means, by hand.
  present = np.eye(10)[np.asarray(labels)]
  margin = np.sum(present * np.maximum(0, 0.9 - lengths) ** 2
                  + 0.5 * (1 - present) * np.maximum(0, lengths - 0.1) ** 2, axis=1)
  squared = np.sum((np.asarray(reconstructions, np.float64).reshape(8, -1)
                    - np.asarray(images, np.float64).reshape(8, -1)) ** 2, axis=1)
  assert float(loss) == pytest.approx(np.mean(margin + 0.0005 * squared), rel=1e-5)
  check_directional_derivatives(lambda p: loss_fn(p)[0], (params,), grads)


def test_no_tiled_weights_in_train_step():
  """Nothing of size batch x in_caps x out_caps x out_dim x in_dim is formed."""
  c = smoke_config()
  c.primary.dim, c.class_capsules.dim = 8, 16  # The paper's capsule sizes, small convs.
  model = capsnet.CapsNet(c, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  batch = 4
  images = jnp.zeros((batch, 28, 28, 1))
  labels = jnp.zeros((batch,), jnp.int32)

  def loss_fn(params):
    out = nnx.merge(graphdef, params)(images, labels, train=True)
    return losses.margin_loss(out.lengths, labels)

  in_caps, out_caps, out_dim, in_dim = model.class_capsules.weights.shape
  tiled = batch * in_caps * out_caps * out_dim * in_dim
  assert largest_intermediate(jax.grad(loss_fn), params) < tiled


def test_stop_gradient_in_model_changes_gradients_not_outputs():
  c = smoke_config()
  images = jax.random.uniform(jax.random.key(3), (4, 28, 28, 1))
  labels = jnp.asarray([1, 2, 3, 4])
  results = []
  for stop in (False, True):
    c.routing.stop_gradient = stop
    graphdef, params = nnx.split(capsnet.CapsNet(c, rngs=nnx.Rngs(0)))

    def loss_fn(params):
      out = nnx.merge(graphdef, params)(images, labels, train=True)
      return losses.margin_loss(out.lengths, labels), out.lengths

    (_, lengths), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    results.append((lengths, grads))
  np.testing.assert_allclose(np.asarray(results[0][0]), np.asarray(results[1][0]), rtol=1e-6)
  diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), results[0][1], results[1][1])
  assert max(jax.tree.leaves(diff)) > 1e-6


def test_bfloat16_compute_is_close_to_float32():
  c = smoke_config()
  images = jax.random.uniform(jax.random.key(4), (4, 28, 28, 1))
  forward = nnx.jit(lambda model, x: model(x))
  f32 = forward(capsnet.CapsNet(c, rngs=nnx.Rngs(0)), images)
  c.compute_dtype = "bfloat16"
  bf16 = forward(capsnet.CapsNet(c, rngs=nnx.Rngs(0)), images)
  assert bf16.lengths.dtype == jnp.float32
  # The untrained lengths are 0.002-0.02: relative to each (bf16 keeps 8 bits of mantissa;
  # measured at most 1.1% here), and not equal, or bf16 did not compute them.
  np.testing.assert_allclose(np.asarray(bf16.lengths), np.asarray(f32.lengths), rtol=0.03,
                             atol=0)
  assert not np.array_equal(np.asarray(bf16.lengths), np.asarray(f32.lengths))


@pytest.mark.parametrize("key,value,match", [
    ("iterations", 0, r"iterations=0 is out of range: it must be >= 1"),
    ("iterations", -2, r"iterations=-2 is out of range: it must be >= 1"),
    ("softmax_axis", "children", r"softmax_axis='children' is out of range: it must be one of"),
])
def test_bad_routing_config(key, value, match):
  c = smoke_config()
  c.routing[key] = value
  with pytest.raises(ValueError, match=rf"config\.model\.routing\.{match}"):
    capsnet.CapsNet(c, rngs=nnx.Rngs(0))


def test_image_too_small():
  c = smoke_config()
  c.image_shape = (12, 12, 1)
  with pytest.raises(ValueError, match="too small"):
    capsnet.CapsNet(c, rngs=nnx.Rngs(0))


def test_multimnist_capsnet_size_and_per_digit_objective():
  import multimnist

  config = multimnist.get_config()
  assert models.count_params(abstract_model(config)) == 11_361_808
  small = resolved(multimnist.get_config("smoke"))
  model = models.create(small, rngs=nnx.Rngs(0))
  keys = jax.random.split(jax.random.key(5), 2)
  digits = jax.random.uniform(keys[0], (3, 2, 36, 36, 1))
  batch = {"images": jnp.minimum(digits.sum(1), 1.0), "labels": jnp.asarray([[1, 7], [0, 3],
                                                                              [9, 2]]),
           "reconstruction_targets": digits}

  @nnx.jit(static_argnames="train")  # One program per mode (op by op: ~10 s of compiling).
  def objective_and_reference(model, batch, train):
    out = model.apply(batch, train=train)
    loss, parts = model.loss(out, batch)
    # By hand: Eq. 4 with both classes present, plus each digit decoded from its label's
    # capsule against its own image, the two sums of squares added, times 0.0005.
    t = jax.nn.one_hot(batch["labels"], 10).sum(1)
    lengths = out.lengths
    margin = jnp.sum(t * jnp.maximum(0, 0.9 - lengths) ** 2
                     + 0.5 * (1 - t) * jnp.maximum(0, lengths - 0.1) ** 2, axis=-1)
    recon = sum(jnp.sum((model.decode(out.class_capsules, batch["labels"][:, k])
                         - digits[:, k]) ** 2, axis=(1, 2, 3)) for k in range(2)) * 0.0005
    decoded = model.decode(out.class_capsules, out.predictions)
    return loss, parts, margin, recon, (lengths, out.predictions, out.reconstructions, decoded)

  for train in (True, False):
    loss, parts, margin, recon, evaluation = objective_and_reference(model, batch, train)
    np.testing.assert_allclose(np.asarray(parts["margin_loss"]), np.asarray(margin), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(parts["reconstruction_loss"]), np.asarray(recon),
                               rtol=1e-5)
    np.testing.assert_allclose(np.asarray(loss), np.asarray(margin + recon), rtol=1e-5)
  # At evaluation (the loop's last mode) the figures' reconstructions follow the two longest
  # capsules.
  lengths, predictions, reconstructions, decoded = evaluation
  top2 = np.argsort(-np.asarray(lengths), axis=1)[:, :2]
  np.testing.assert_array_equal(np.sort(np.asarray(predictions), 1), np.sort(top2, 1))
  np.testing.assert_allclose(np.asarray(reconstructions), np.asarray(decoded), rtol=1e-6)


@pytest.mark.parametrize("name,padding,grid,count", [
    # CIFAR-10 (24x24x3, 64 primary types): SAME keeps 24 after conv1, ceil(24/2) = 12 after
    # PrimaryCaps: 12*12*64 = 9216 capsules; VALID: 24-8 = 16, (16-9)//2+1 = 4.
    ("cifar10", "SAME", (12, 12), 22_476_288),
    ("cifar10", "VALID", (4, 4), 11_990_528),
    # SVHN (32x32x3, conv1 64, 16 primary types of 6D, 8D class capsules): VALID 32-8 = 24,
    # (24-9)//2+1 = 8; SAME 32 then 16.
    ("svhn", "VALID", (8, 8), 4_720_480),
    ("svhn", "SAME", (16, 16), 6_195_040),
])
def test_padding_shapes_and_sizes_of_the_image_configs(name, padding, grid, count):
  import importlib

  config = importlib.import_module(name).get_config()
  config.model.padding = padding
  model = abstract_model(config)
  config = resolved(config)
  assert capsnet.primary_grid(config.model) == grid
  assert model.class_capsules.weights.shape[0] == grid[0] * grid[1] * config.model.primary.num_types
  assert models.count_params(model) == count
  image = jnp.zeros((1, *config.model.image_shape))
  features = nnx.eval_shape(lambda m, x: m.conv1(x), model, image)
  assert features.shape[1:3] == ((24, 24) if (name, padding) == ("cifar10", "SAME") else
                                 (16, 16) if name == "cifar10" else
                                 (32, 32) if padding == "SAME" else (24, 24))
  assert nnx.eval_shape(lambda m, x: m(x).lengths, model, image).shape == (1, 10)


def test_a_batch_without_reconstruction_targets_is_refused_not_reconstructed_from_its_images():
  """The head never falls back to ``batch["images"]`` (which an attack may have moved)."""
  config = resolved(mnist.get_config("smoke"))
  model = capsnet.CapsNet.from_config(config, rngs=nnx.Rngs(0))
  images = jnp.full((2, 28, 28, 1), 0.5)
  batch = {"images": images, "labels": jnp.arange(2)}
  outputs = model.apply(batch, train=True)
  with pytest.raises(ValueError, match="no 'reconstruction_targets'.*Task.complete_batch"):
    model.loss(outputs, batch)
  loss, parts = model.loss(outputs, {**batch, "reconstruction_targets": images})
  assert np.all(np.asarray(parts["reconstruction_loss"]) > 0)


def test_capsnet_writes_its_forward_pass_out_and_shares_the_heads_loss_and_metrics():
  """CapsNet's __call__ is the paper's order written out (issue 90); it equals the head's
  composition of its backbone and class capsules, and the loss and metrics are the head's,
  which Efficient-CapsNet shares without defining any of them."""
  from capsjax.models import efficient_capsnet

  for cls in (capsnet.CapsNet, efficient_capsnet.EfficientCapsNet):
    assert issubclass(cls, capsnet.CapsuleModel)
    assert not {"apply", "loss", "metrics", "decode", "classify"} & set(vars(cls)), cls
  assert "__call__" not in vars(efficient_capsnet.EfficientCapsNet)
  model = capsnet.CapsNet(smoke_config(), rngs=nnx.Rngs(0))
  images = jax.random.uniform(jax.random.PRNGKey(1), (2, 28, 28, 1))
  batch = {"images": images, "labels": jnp.array([3, 7]), "reconstruction_targets": images}
  out = model.apply(batch, train=True)
  composed = capsnet.CapsuleModel.__call__(model, images, batch["labels"], train=True)
  np.testing.assert_array_equal(np.asarray(out.scores), np.asarray(composed.scores))
  np.testing.assert_array_equal(np.asarray(out.reconstructions),
                                np.asarray(composed.reconstructions))
  loss, parts = model.loss(out, batch)
  head_loss, _ = capsnet.capsule_loss(out, batch, model.loss_settings)
  np.testing.assert_array_equal(np.asarray(loss), np.asarray(head_loss))
  assert set(parts) == {"margin_loss", "reconstruction_loss"}
  assert float(jnp.min(parts["reconstruction_loss"])) > 0  # Targets given: reconstructed.
