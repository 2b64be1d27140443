"""Layers: every convolution implementation computes the same function."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from capsjax import routing
from capsjax.common import platform
from capsjax.models import capsule_layers, layers


@pytest.mark.parametrize("size,kernel,stride",
                         [(20, 9, 2), (21, 9, 2), (12, 5, 3), (10, 4, 2), (12, 9, 1), (7, 3, 1)])
# Every implementation is the same function: values and gradients.
def test_polyphase_conv_equals_native_values_and_gradients(size, kernel, stride):
  rng = np.random.default_rng(size)
  x = jnp.asarray(rng.normal(size=(2, size, size + 1, 3)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(kernel, kernel, 3, 5)), jnp.float32)
  conv = jax.jit(layers.conv2d, static_argnums=(2, 3))  # Eagerly, each phase compiles alone.
  native = conv(x, w, stride, "native")

  def loss(x, w, impl):
    return jnp.sum(jnp.sin(layers.conv2d(x, w, stride, impl)))

  grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
  gn = grad(x, w, "native")
  for impl in ("polyphase", "im2col"):
    other = conv(x, w, stride, impl)
    assert native.shape == other.shape
    np.testing.assert_allclose(np.asarray(other), np.asarray(native), rtol=1e-4, atol=1e-4)
    go = grad(x, w, impl)
    for a, b in zip(gn, go):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-3)


def test_conv_matches_numpy_cross_correlation():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, 7, 7, 2))
  w = rng.normal(size=(3, 3, 2, 4))
  expected = np.zeros((1, 3, 3, 4))
  for oh in range(3):
    for ow in range(3):
      patch = x[0, 2 * oh:2 * oh + 3, 2 * ow:2 * ow + 3]
      expected[0, oh, ow] = np.einsum("hwi,hwio->o", patch, w)
  for impl in ("native", "polyphase", "im2col", "auto"):
    got = layers.conv2d(jnp.asarray(x), jnp.asarray(w), 2, impl)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
  # Stride 1, as conv1 (im2col on CPU too).
  expected = np.zeros((1, 5, 5, 4))
  for oh in range(5):
    for ow in range(5):
      expected[0, oh, ow] = np.einsum("hwi,hwio->o", x[0, oh:oh + 3, ow:ow + 3], w)
  for impl in ("native", "im2col", "auto"):
    got = layers.conv2d(jnp.asarray(x), jnp.asarray(w), 1, impl)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend,kernel,stride,convolutions,dots", [
    ("gpu", 9, 2, 4, 0),   # The paper's PrimaryCapsules: four stride-1 phase convolutions.
    ("gpu", 3, 2, 1, 0),   # Efficient-CapsNet's strided 3x3: cuDNN's own.
    ("gpu", 9, 1, 1, 0),
    ("tpu", 9, 2, 1, 0),
    ("cpu", 9, 2, 0, 1),   # im2col: one matmul.
    ("cpu", 3, 1, 0, 1)])
def test_auto_conv_impl_by_backend_and_shape(backend, kernel, stride, convolutions, dots):
  """What "auto" builds, read off the program: the rule of conv2d's docstring per backend
  (the one programs are built for: capsjax.common.platform)."""
  x, w = jnp.zeros((1, 20, 20, 2)), jnp.zeros((kernel, kernel, 2, 3))
  with platform.building_for(backend):
    eqns = jax.make_jaxpr(lambda x, w: layers.conv2d(x, w, stride, "auto"))(x, w).eqns
  names = [e.primitive.name for e in eqns]
  assert (names.count("conv_general_dilated"), names.count("dot_general")) == (convolutions,
                                                                                  dots)


def test_unknown_conv_impl():
  with pytest.raises(ValueError, match="conv impl must be one of"):
    layers.conv2d(jnp.zeros((1, 5, 5, 1)), jnp.zeros((3, 3, 1, 1)), 2, "fft")


@pytest.mark.parametrize("impl", ["native", "im2col", "polyphase"])
@pytest.mark.parametrize("size,kernel", [(10, 9), (12, 5), (7, 3)])
def test_same_padding_at_stride_2_equals_lax_with_tfs_rule(impl, size, kernel):
  """``lax.conv_general_dilated(padding="SAME")`` pads as TF does (ceil(size / stride)
  outputs, the odd zero after): every implementation must give exactly that."""
  rng = np.random.default_rng(size + kernel)
  x = jnp.asarray(rng.normal(size=(2, size, size + 1, 3)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(kernel, kernel, 3, 4)), jnp.float32)
  expected = jax.lax.conv_general_dilated(x, k, (2, 2), "SAME",
                                          dimension_numbers=("NHWC", "HWIO", "NHWC"))
  got = layers.conv2d(x, k, 2, impl, padding="SAME")
  assert got.shape == expected.shape == (2, -(-size // 2), -(-(size + 1) // 2), 4)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-4)


def official_primary_capsules(conv_nhwc, num_types, dim):
  """The official code's PrimaryCaps layout (Sarasra/models research/capsules,
  capsule_model.py and layers.py), written from it: the conv output, NCHW there, is reshaped
  to [batch, input_dim=1, num_types, dim, h, w] (so channel ``type * dim + atom``), transposed
  to [batch, 1, num_types, h, w, dim] and flattened to [batch, num_types * h * w, dim]."""
  nchw = np.transpose(conv_nhwc, (0, 3, 1, 2))
  b, _, h, w = nchw.shape
  six = nchw.reshape(b, 1, num_types, dim, h, w)
  return np.transpose(six, (0, 1, 2, 4, 5, 3)).reshape(b, num_types * h * w, dim)


def test_primary_capsules_group_channels_as_the_official_code():
  num_types, dim = 4, 5
  layer = capsule_layers.PrimaryCapsules(3, num_types=num_types, dim=dim, kernel_size=3, stride=2,
                                 rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 9, 9, 3)), jnp.float32)
  caps = np.asarray(layer(x).poses)
  assert caps.shape == (2, 4 * 4 * num_types, dim)
  official = np.asarray(routing.squash(jnp.asarray(
      official_primary_capsules(np.asarray(layer.conv(x)), num_types, dim))))
  # The same capsules (the same channels grouped, squashed), in another order: the official
  # code lists them type-major (type, y, x), capsjax position-major (y, x, type). The order
  # only matters for loading official weights (W_ij is per capsule).
  h = w = 4
  for t in range(num_types):
    for y in range(h):
      for x_ in range(w):
        np.testing.assert_allclose(caps[:, (y * w + x_) * num_types + t],
                                   official[:, t * h * w + y * w + x_], rtol=1e-6)


def test_primary_output_scale_scales_the_convolution_before_its_bias():
  """The official code's PrimaryCaps: softmax(0) over the types (1/num_types) times the
  convolution, plus the bias, then squash."""
  num_types, dim = 4, 5
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 9, 9, 3)), jnp.float32)
  plain = capsule_layers.PrimaryCapsules(3, num_types=num_types, dim=dim, kernel_size=3, stride=2,
                                 bias_init=0.3, rngs=nnx.Rngs(0))
  scaled = capsule_layers.PrimaryCapsules(3, num_types=num_types, dim=dim, kernel_size=3, stride=2,
                                  bias_init=0.3, output_scale=1 / num_types, rngs=nnx.Rngs(0))
  conv = np.asarray(plain.conv(x)) - 0.3  # Same kernels: same seed.
  expected = routing.squash(jnp.asarray((conv / num_types + 0.3).reshape(2, -1, dim)))
  np.testing.assert_allclose(np.asarray(scaled(x).poses), np.asarray(expected), rtol=1e-5,
                             atol=1e-6)
  assert not np.allclose(np.asarray(plain(x).poses), np.asarray(expected), atol=1e-3)


def test_class_capsule_votes_are_w_times_u():
  layer = capsule_layers.ClassCapsules(6, 3, 4, 5, rngs=nnx.Rngs(0))
  u = np.random.default_rng(0).normal(size=(2, 6, 3))
  w = np.asarray(layer.weights[...])
  expected = np.zeros((2, 6, 4, 5))
  for i in range(6):
    for j in range(4):
      expected[:, i, j] = u[:, i] @ w[i, j].T
  np.testing.assert_allclose(np.asarray(layer.votes(jnp.asarray(u, jnp.float32))), expected,
                             rtol=1e-5, atol=1e-6)


def test_class_capsules_take_their_router_in_routing():
  """``routing=`` chooses and configures the router; None is dynamic routing's defaults."""
  settings = dict(routing.get("dynamic").defaults, iterations=1, softmax_axis="input",
                  leaky=True)
  new = capsule_layers.ClassCapsules(6, 3, 4, 5, routing={"name": "dynamic", **settings},
                                     rngs=nnx.Rngs(0))
  default = capsule_layers.ClassCapsules(6, 3, 4, 5, rngs=nnx.Rngs(0))
  assert default.routing_settings == routing.get("dynamic").defaults
  u = jnp.asarray(np.random.default_rng(0).normal(size=(2, 6, 3)), jnp.float32)
  assert not np.allclose(new(u), default(u))
  with pytest.raises(TypeError, match="routing_iterations"):
    capsule_layers.ClassCapsules(6, 3, 4, 5, routing_iterations=1, rngs=nnx.Rngs(0))


def test_matrix_votes_are_pose_matrices_times_w_and_every_router_takes_them():
  """V_ij = M_i W_ij (Hinton et al. 2018) with 4x4 poses, row by row in NumPy; the layer
  routes them with a router written for vector votes."""
  layer = capsule_layers.ClassCapsules(6, 16, 4, 16, votes="matrix", rngs=nnx.Rngs(0))
  w = np.asarray(layer.weights[...], np.float64)
  assert w.shape == (6, 4, 4, 4)
  poses = np.random.default_rng(0).normal(size=(2, 6, 16)).astype(np.float32)
  expected = np.zeros((2, 6, 4, 16))
  for b in range(2):
    for i in range(6):
      for j in range(4):
        expected[b, i, j] = (poses[b, i].astype(np.float64).reshape(4, 4) @ w[i, j]).ravel()
  np.testing.assert_allclose(np.asarray(layer.votes(jnp.asarray(poses))), expected,
                             rtol=1e-5, atol=1e-6)
  children = capsule_layers.Capsules(jnp.asarray(poses), jnp.ones((2, 6)))
  assert layer.route(children).capsules.shape == (2, 4, 16)
  with pytest.raises(ValueError, match="square poses"):
    capsule_layers.ClassCapsules(6, 8, 4, 8, votes="matrix", rngs=nnx.Rngs(0))


def test_a_layer_takes_its_vote_function():
  """Votes formed by the function the layer is given: here 2 x W_ij u_i."""
  double = (capsule_layers.vector_vote_weights, lambda u, w: 2 * routing.capsule_votes(u, w))
  plain = capsule_layers.ClassCapsules(6, 3, 4, 5, rngs=nnx.Rngs(0))
  doubled = capsule_layers.ClassCapsules(6, 3, 4, 5, votes=double, rngs=nnx.Rngs(0))
  u = jnp.asarray(np.random.default_rng(1).normal(size=(2, 6, 3)), jnp.float32)
  np.testing.assert_allclose(np.asarray(doubled.votes(u)), 2 * np.asarray(plain.votes(u)),
                             rtol=1e-6)
  with pytest.raises(ValueError, match="votes must be one of"):
    capsule_layers.ClassCapsules(6, 3, 4, 5, votes="tensor", rngs=nnx.Rngs(0))


def test_class_capsules_init_scale_and_bias():
  small = capsule_layers.ClassCapsules(200, 8, 10, 16, init_scale=0.01, rngs=nnx.Rngs(0))
  large = capsule_layers.ClassCapsules(200, 8, 10, 16, init_scale=0.5, rngs=nnx.Rngs(0))
  # A normal with std init_scale truncated at 2 std (TF's truncated_normal, as the
  # official code uses): std 0.8796 * init_scale, |w| <= 2 * init_scale.
  for layer, scale in ((small, 0.01), (large, 0.5)):
    w = np.asarray(layer.weights[...])
    np.testing.assert_allclose(w.std(), 0.8796 * scale, rtol=0.02)
    assert np.abs(w).max() <= 2 * scale
  assert small.bias is None
  biased = capsule_layers.ClassCapsules(5, 3, 2, 4, use_bias=True, bias_init=0.3, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(biased.bias[...]), 0.3, rtol=1e-7)


def test_decoder_uses_only_the_masked_capsule():
  dec = layers.Decoder(3, 4, (8,), (2, 2, 1), rngs=nnx.Rngs(0))
  caps = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, 4)), jnp.float32)
  mask = jax.nn.one_hot(jnp.asarray([1]), 3)
  out = dec(caps, mask)
  assert out.shape == (1, 2, 2, 1)
  assert np.all((np.asarray(out) > 0) & (np.asarray(out) < 1))
  changed = caps.at[0, 0].set(100.0).at[0, 2].set(-50.0)
  np.testing.assert_array_equal(np.asarray(dec(changed, mask)), np.asarray(out))


def test_conv_init_scale_and_bias_init():
  lecun = layers.Conv2D(64, 32, 3, 1, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(lecun.kernel[...]).std(), 1 / np.sqrt(9 * 64), rtol=0.05)
  np.testing.assert_array_equal(np.asarray(lecun.bias[...]), 0.0)
  official = layers.Conv2D(64, 32, 3, 1, init_scale=0.1, bias_init=0.1, rngs=nnx.Rngs(0))
  w = np.asarray(official.kernel[...])
  np.testing.assert_allclose(w.std(), 0.8796 * 0.1, rtol=0.03)
  assert np.abs(w).max() <= 0.2
  np.testing.assert_allclose(np.asarray(official.bias[...]), 0.1, rtol=1e-6)


def test_decoder_init_scale_and_bias_init():
  lecun = layers.Decoder(10, 16, (512,), (28, 28, 1), rngs=nnx.Rngs(0))
  for layer, fan_in in zip(lecun.layers, (160, 512)):
    np.testing.assert_allclose(np.asarray(layer.kernel[...]).std(), 1 / np.sqrt(fan_in),
                               rtol=0.05)
    np.testing.assert_array_equal(np.asarray(layer.bias[...]), 0.0)
  official = layers.Decoder(10, 16, (512,), (28, 28, 1), init_scale=0.1, bias_init=0.1,
                            rngs=nnx.Rngs(0))
  for layer in official.layers:
    w = np.asarray(layer.kernel[...])
    np.testing.assert_allclose(w.std(), 0.8796 * 0.1, rtol=0.03)
    assert np.abs(w).max() <= 0.2
    np.testing.assert_allclose(np.asarray(layer.bias[...]), 0.1, rtol=1e-6)


@pytest.mark.parametrize("size", [9, 12])
def test_every_depthwise_impl_is_the_grouped_convolution_values_and_gradients(size):
  """9x9 kernels on a 9x9 input (Efficient-CapsNet's primary capsules: window_sum) and on a
  12x12 one (shifted), against lax's grouped convolution: float32 rounding apart."""
  rng = np.random.default_rng(size)
  x = jnp.asarray(rng.normal(size=(3, size, size, 5)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(9, 9, 1, 5)), jnp.float32)
  weights = jnp.asarray(rng.normal(size=(3, size - 8, size - 8, 5)), jnp.float32)

  @functools.partial(jax.jit, static_argnums=0)  # One program per form, as a model runs it.
  def value_and_grads(impl):
    objective = lambda x, k: jnp.sum(weights * layers.depthwise_conv2d(x, k, impl))
    return layers.depthwise_conv2d(x, kernel, impl), jax.grad(objective, (0, 1))(x, kernel)

  reference, (dx, dk) = value_and_grads("native")
  impls = ["auto", "shifted"] + (["window_sum"] if size == 9 else [])
  for impl in impls:
    out, (gx, gk) = value_and_grads(impl)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(dx), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gk), np.asarray(dk), rtol=1e-5, atol=1e-5)
  if size == 12:
    with pytest.raises(ValueError, match="needs a kernel the size of the input"):
      layers.depthwise_conv2d(x, kernel, "window_sum")
