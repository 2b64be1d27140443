"""CapsNet assembled from configs: sizes, masking, jit, invariants."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

import mnist
from capsjax import losses, models
from helpers import largest_intermediate


def paper_config():
  return mnist.get_config().model


def smoke_config():
  return mnist.get_config("smoke").model


def test_paper_parameter_counts():
  c = paper_config()
  assert models.count_params(models.CapsNet(c, rngs=nnx.Rngs(0))) == 8_215_568
  c.decoder.enabled = False
  assert models.count_params(models.CapsNet(c, rngs=nnx.Rngs(0))) == 6_804_224


def test_paper_primary_capsule_grid():
  assert models.primary_grid(paper_config()) == (6, 6)
  model = models.CapsNet(paper_config(), rngs=nnx.Rngs(0))
  assert model.class_capsules.weights.shape == (1152, 10, 16, 8)


def test_config_without_decoder_init_keys_builds_the_default_decoder():
  # config.json of workdirs written before model.decoder.init_scale/bias_init existed.
  old = smoke_config().to_dict()
  del old["decoder"]["init_scale"], old["decoder"]["bias_init"]
  restored = models.CapsNet(ml_collections.ConfigDict(old), rngs=nnx.Rngs(0))
  current = models.CapsNet(smoke_config(), rngs=nnx.Rngs(0))
  for a, b in zip(jax.tree.leaves(nnx.state(restored.decoder)),
                  jax.tree.leaves(nnx.state(current.decoder))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("image_shape,num_classes,in_caps", [
    ((36, 36, 1), 10, 10 * 10 * 4), ((32, 32, 3), 7, 8 * 8 * 4), ((28, 28, 1), 10, 6 * 6 * 4)])
def test_shapes_come_from_config(image_shape, num_classes, in_caps):
  c = smoke_config()
  c.image_shape = image_shape
  c.num_classes = num_classes
  model = models.CapsNet(c, rngs=nnx.Rngs(0))
  assert model.class_capsules.weights.shape[:2] == (in_caps, num_classes)
  out = model(jnp.zeros((2, *image_shape)), jnp.asarray([0, 1]), train=True)
  assert out.class_capsules.shape == (2, num_classes, c.class_capsules.dim)
  assert out.reconstructions.shape == (2, *image_shape)


def test_decoder_masks_with_labels_in_training_and_predictions_in_eval():
  model = models.CapsNet(smoke_config(), rngs=nnx.Rngs(0))
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
  model = models.CapsNet(smoke_config(), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  images = jax.random.uniform(jax.random.key(2), (8, 28, 28, 1))
  labels = jnp.arange(8) % 10

  @jax.jit
  def loss_fn(params):
    out = nnx.merge(graphdef, params)(images, labels, train=True)
    return (losses.margin_loss(out.lengths, labels)
            + losses.reconstruction_loss(out.reconstructions, images)), out.lengths

  (loss, lengths), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  assert np.isfinite(float(loss))
  assert np.all((np.asarray(lengths) >= 0) & (np.asarray(lengths) < 1))
  leaves = jax.tree.leaves(grads)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
  assert sum(float(jnp.sum(jnp.abs(g))) for g in leaves) > 0


def test_no_tiled_weights_in_train_step():
  """Nothing of size batch x in_caps x out_caps x out_dim x in_dim is formed."""
  c = smoke_config()
  c.primary.dim, c.class_capsules.dim = 8, 16  # The paper's capsule sizes, small convs.
  model = models.CapsNet(c, rngs=nnx.Rngs(0))
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
    graphdef, params = nnx.split(models.CapsNet(c, rngs=nnx.Rngs(0)))

    def loss_fn(params):
      out = nnx.merge(graphdef, params)(images, labels, train=True)
      return losses.margin_loss(out.lengths, labels), out.lengths

    (_, lengths), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    results.append((lengths, grads))
  np.testing.assert_allclose(np.asarray(results[0][0]), np.asarray(results[1][0]), rtol=1e-6)
  diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), results[0][1], results[1][1])
  assert max(jax.tree.leaves(diff)) > 1e-6


def test_bfloat16_compute_is_close_to_float32():
  c = smoke_config()
  images = jax.random.uniform(jax.random.key(4), (4, 28, 28, 1))
  f32 = models.CapsNet(c, rngs=nnx.Rngs(0))(images)
  c.compute_dtype = "bfloat16"
  bf16 = models.CapsNet(c, rngs=nnx.Rngs(0))(images)
  assert bf16.lengths.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(bf16.lengths), np.asarray(f32.lengths), atol=0.03)


@pytest.mark.parametrize("key,value,match", [
    ("iterations", 0, "iterations must be an integer >= 1"),
    ("iterations", -2, "iterations must be an integer >= 1"),
    ("softmax_axis", "children", "softmax_axis must be one of"),
])
def test_bad_routing_config(key, value, match):
  c = smoke_config()
  c.routing[key] = value
  with pytest.raises(ValueError, match=match):
    models.CapsNet(c, rngs=nnx.Rngs(0))


def test_image_too_small():
  c = smoke_config()
  c.image_shape = (12, 12, 1)
  with pytest.raises(ValueError, match="too small"):
    models.CapsNet(c, rngs=nnx.Rngs(0))
