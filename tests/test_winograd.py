"""Winograd convolutions: the direct convolution's values and gradients, to float rounding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.models import layers, winograd


def _correlation64(x, w):
  """VALID, stride-1 cross-correlation in float64: the definition, term by term."""
  kh, kw = w.shape[:2]
  out_h, out_w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
  y = np.zeros((x.shape[0], out_h, out_w, w.shape[3]))
  for i in range(kh):
    for j in range(kw):
      y += np.einsum("nhwc,co->nhwo", x[:, i:i + out_h, j:j + out_w].astype(np.float64),
                     w[i, j].astype(np.float64))
  return y


# Outputs that are and are not multiples of the tile (padding and cropping), one tile only.
@pytest.mark.parametrize("shape", [(2, 8, 8, 3, 4), (3, 7, 9, 5, 2), (1, 3, 3, 2, 3),
                                   (2, 12, 11, 16, 8)])
@pytest.mark.parametrize("tile", [2, 4])
def test_values_equal_the_correlation_to_float32_rounding(shape, tile):
  n, h, w, cin, cout = shape
  rng = np.random.default_rng(sum(shape) + tile)
  x = rng.standard_normal((n, h, w, cin)).astype(np.float32)
  k = rng.standard_normal((3, 3, cin, cout)).astype(np.float32)
  reference = _correlation64(x, k)
  scale = np.abs(reference).max()
  got = np.asarray(winograd.conv2d_winograd(jnp.asarray(x), jnp.asarray(k), tile))
  direct = np.asarray(layers.conv2d(jnp.asarray(x), jnp.asarray(k), 1, "native"))
  assert got.shape == reference.shape
  direct_error = np.abs(direct - reference).max() / scale
  # F(2x2, 3x3) is as exact as the direct convolution; F(4x4, 3x3)'s larger transform
  # coefficients cost about one digit (measured: up to 5e-6 of the largest output).
  bound = 4 * max(direct_error, 1e-7) if tile == 2 else 2e-5
  assert np.abs(got - reference).max() / scale < bound


@pytest.mark.parametrize("tile", [2, 4])
def test_gradients_equal_the_native_convolutions(tile):
  rng = np.random.default_rng(tile)
  x = jnp.asarray(rng.standard_normal((2, 9, 10, 6)).astype(np.float32))
  k = jnp.asarray(rng.standard_normal((3, 3, 6, 5)).astype(np.float32))
  cotangent = jnp.asarray(rng.standard_normal((2, 7, 8, 5)).astype(np.float32))

  def grads(conv):  # One program each (op by op: ~90 small ones).
    return jax.jit(jax.grad(lambda x, k: jnp.sum(cotangent * conv(x, k)), argnums=(0, 1)))(x, k)

  reference = grads(lambda x, k: layers.conv2d(x, k, 1, "native"))
  got = grads(lambda x, k: winograd.conv2d_winograd(x, k, tile))
  for g, r in zip(got, reference):
    assert g.shape == r.shape
    np.testing.assert_allclose(g, r, atol=(1e-5 if tile == 2 else 5e-5) * np.abs(r).max())


def test_conv2d_uses_winograd_for_3x3_stride_1_and_im2col_elsewhere():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 11, 11, 3)).astype(np.float32))
  for size, stride in ((3, 1), (3, 2), (5, 1)):
    k = jnp.asarray(rng.standard_normal((size, size, 3, 4)).astype(np.float32))
    reference = layers.conv2d(x, k, stride, "native")
    for impl in ("winograd", "winograd4"):
      np.testing.assert_allclose(layers.conv2d(x, k, stride, impl), reference,
                                 atol=2e-5 * float(jnp.abs(reference).max()))
      np.testing.assert_allclose(layers.conv2d(x, k, stride, impl, padding="SAME"),
                                 layers.conv2d(x, k, stride, "native", padding="SAME"),
                                 atol=2e-5 * float(jnp.abs(reference).max()))


def test_bad_kernels_and_tiles_are_named():
  x = jnp.zeros((1, 6, 6, 1))
  with pytest.raises(ValueError, match=r"3x3 kernel, got \(5, 5\)"):
    winograd.conv2d_winograd(x, jnp.zeros((5, 5, 1, 1)))
  with pytest.raises(ValueError, match="tile must be one of .* got 3"):
    winograd.conv2d_winograd(x, jnp.zeros((3, 3, 1, 1)), tile=3)


@pytest.mark.parametrize("tile", [2, 4])
def test_chunks_of_the_batch_give_the_whole_batchs_values_and_gradients(tile):
  rng = np.random.default_rng(10 + tile)
  x = jnp.asarray(rng.standard_normal((12, 8, 7, 3)).astype(np.float32))
  k = jnp.asarray(rng.standard_normal((3, 3, 3, 4)).astype(np.float32))
  cotangent = jnp.asarray(rng.standard_normal((12, 6, 5, 4)).astype(np.float32))

  @functools.partial(jax.jit, static_argnums=2)  # One program per chunk, as a model runs it.
  def value_and_grads(x, k, chunk):
    conv = lambda x, k: winograd.conv2d_winograd(x, k, tile, chunk=chunk)
    grads = jax.grad(lambda x, k: jnp.sum(cotangent * conv(x, k)), argnums=(0, 1))(x, k)
    return (conv(x, k), *grads)

  whole = value_and_grads(x, k, None)
  for chunk in (4, 5):  # 5 does not divide 12: the whole batch at once.
    for got, reference in zip(value_and_grads(x, k, chunk), whole):
      np.testing.assert_allclose(got, reference, rtol=0,
                                 atol=1e-5 * float(jnp.abs(reference).max()))
