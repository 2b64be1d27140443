"""The whole training objective of the paper model against Eq. 1-4, Procedure 1 and the
decoder written out plainly, with its gradients."""

import numpy as np


def _objective_from_the_paper(params, images, labels, *, num_classes, capsule_dim, iterations):
  """Eq. 1-4, Procedure 1 and the decoder, written out plainly (no capsjax code)."""
  import jax
  import jax.numpy as jnp

  def conv(x, layer, stride):
    y = jax.lax.conv_general_dilated(x, layer["kernel"], (stride, stride), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + layer["bias"]

  def squash(s):
    n2 = jnp.sum(s * s, axis=-1, keepdims=True)
    return n2 / (1 + n2) * s / jnp.sqrt(n2)

  features = jax.nn.relu(conv(images, params["conv1"], 1))
  primary = conv(features, params["primary_capsules"]["conv"], 2)
  u = squash(primary.reshape(len(images), -1, params["class_capsules"]["weights"].shape[-1]))
  u_hat = jnp.einsum("ijdk,bik->bijd", params["class_capsules"]["weights"], u)
  b = jnp.zeros(u_hat.shape[:3])
  for _ in range(iterations):
    c = jax.nn.softmax(b, axis=2)                      # Over parents j.
    v = squash(jnp.einsum("bij,bijd->bjd", c, u_hat))
    b = b + jnp.einsum("bijd,bjd->bij", u_hat, v)
  lengths = jnp.sqrt(jnp.sum(v * v, axis=-1))
  t = jax.nn.one_hot(labels, num_classes)
  margin = jnp.sum(t * jnp.maximum(0, 0.9 - lengths) ** 2
                   + 0.5 * (1 - t) * jnp.maximum(0, lengths - 0.1) ** 2, axis=-1)
  x = (v * t[..., None]).reshape(len(images), num_classes * capsule_dim)
  layers = params["decoder"]["layers"]
  layers = [layers[k] for k in sorted(layers)]  # A dict keyed by position.
  for layer in layers[:-1]:
    x = jax.nn.relu(x @ layer["kernel"] + layer["bias"])
  pixels = jax.nn.sigmoid(x @ layers[-1]["kernel"] + layers[-1]["bias"])
  recon = 0.0005 * jnp.sum((pixels - images.reshape(len(images), -1)) ** 2, axis=-1)
  return jnp.mean(margin + recon)


def test_training_objective_and_gradients_match_the_paper_written_out():
  """The whole train loss (im2col convs, hand-written vote VJP, unrolled routing) and
  its gradients equal a plain re-derivation, with every bias non-zero."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from capsjax import routing

  import mnist
  from capsjax import models

  from helpers import resolved

  config = resolved(mnist.get_config("smoke"))
  model = models.create(config, rngs=nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  keys = iter(jax.random.split(jax.random.key(1), 16))
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: (0.1 * jax.random.normal(next(keys), p.shape)
                       if path[-1].key == "bias" else p), params)
  graphdef = nnx.graphdef(model)
  images = jax.random.uniform(jax.random.key(2), (4, 28, 28, 1))
  labels = jnp.asarray([3, 0, 9, 3])

  def capsjax_loss(p):
    model = nnx.merge(graphdef, p)
    batch = {"images": images, "labels": labels, "reconstruction_targets": images}
    loss, _ = model.loss(model.apply(batch, train=True), batch)
    return jnp.mean(loss)

  def paper_loss(p):
    return _objective_from_the_paper(p, images, labels, num_classes=10,
                                     capsule_dim=config.model.class_capsules.dim,
                                     iterations=routing.resolve(config.model.routing)[1][
                                         "iterations"])

  with jax.default_matmul_precision("highest"):
    ours, our_grads = jax.jit(jax.value_and_grad(capsjax_loss))(params)
    ref, ref_grads = jax.jit(jax.value_and_grad(paper_loss))(params)
  assert float(ref) > 0.1  # A fresh model is far from the margins: not a trivial point.
  np.testing.assert_allclose(float(ours), float(ref), rtol=1e-5)
  for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(our_grads),
                          jax.tree.leaves(ref_grads)):
    g, r = np.asarray(g), np.asarray(r)
    assert np.abs(r).max() > 0, path
    np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4 * np.abs(r).max(),
                               err_msg=jax.tree_util.keystr(path))
