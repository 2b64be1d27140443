"""Winograd's minimal filtering for 3x3, stride-1, VALID convolutions (Lavin & Gray 2016).

A convolution's output, in tiles of ``m x m``, is

    Y = A^T [ (G w G^T) . (B^T d B) ] A                  (Lavin & Gray, "Fast Algorithms for
                                                          Convolutional Neural Networks", eq. 8)

for each ``t x t`` input tile ``d`` (``t = m + 2``, tiles overlapping by 2), where ``.`` is the
elementwise product over the ``t x t`` positions and a matmul over channels. The products of
the ``t * t`` positions are ``t * t`` matmuls of ``(tiles, in) x (in, out)``: ``t^2 / m^2`` of
the direct convolution's multiplications per output, 16/36 for F(2x2, 3x3) and 36/144 for
F(4x4, 3x3). The transforms are sums of strided views, which XLA fuses into elementwise loops; the
backward pass (a custom VJP) is Winograd too: the input gradient one more Winograd convolution,
the kernel gradient formed in the Winograd domain, so it gets the same saving.

It is the same function as the direct convolution, up to float rounding: F(2x2, 3x3)'s
transforms have coefficients 0, +-1/2, +-1, and its float32 error is of the direct
convolution's order; F(4x4, 3x3)'s (up to 8 and 1/24) lose more digits (tests/test_winograd.py
measures both against a float64 reference).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# F(m x m, 3 x 3): (B^T, G, A^T) of shapes (t, t), (t, 3), (m, t), t = m + 2. Lavin & Gray,
# Section 4.1 (F(2, 3)) and 4.2 (F(4, 3)), for correlation (what deep learning calls
# convolution): y[i] = sum_k d[i + k] w[k].
TRANSFORMS = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], np.float64)),
}


def _combine(views, coefficients):
  """``sum_k coefficients[k] * views[k]``, skipping zeros and multiplying only where needed."""
  total = None
  for c, v in zip(coefficients, views):
    if c == 0:
      continue
    term = v if c == 1 else -v if c == -1 else v * jnp.asarray(c, v.dtype)
    total = term if total is None else total + term
  return total


def _input_transform(x: jax.Array, tiles_h: int, tiles_w: int, m: int, bt: np.ndarray):
  """``B^T d B`` for every tile: ``(t * t, batch, tiles_h, tiles_w, in)``, position major."""
  t = bt.shape[0]
  rows = [x[:, k:k + m * (tiles_h - 1) + 1:m] for k in range(t)]
  rows = [_combine(rows, bt[a]) for a in range(t)]
  out = []
  for row in rows:
    cols = [row[:, :, k:k + m * (tiles_w - 1) + 1:m] for k in range(t)]
    out.extend(_combine(cols, bt[b]) for b in range(t))
  return jnp.stack(out)


def _output_transform(products: jax.Array, at: np.ndarray) -> jax.Array:
  """``A^T M A`` (th x tw tiles): ``(t, t, batch, th, tw, out)`` -> ``(batch, th*m, tw*m, out)``."""
  m, t = at.shape
  rows = [_combine([products[a] for a in range(t)], at[i]) for i in range(m)]
  tiles = [[_combine([row[b] for b in range(t)], at[j]) for j in range(m)] for row in rows]
  y = jnp.stack([jnp.stack(r, axis=3) for r in tiles], axis=2)  # (n, th, m, tw, m, out)
  n, th, _, tw, _, cout = y.shape
  return y.reshape(n, th * m, tw * m, cout)


def _tiling(x_shape, tile):
  """(tiles_h, tiles_w, pad_h, pad_w) of a VALID 3x3 output of an input of ``x_shape``."""
  out_h, out_w = x_shape[1] - 2, x_shape[2] - 2
  tiles_h, tiles_w = -(-out_h // tile), -(-out_w // tile)
  return tiles_h, tiles_w, tiles_h * tile + 2 - x_shape[1], tiles_w * tile + 2 - x_shape[2]


def _transformed_input(x: jax.Array, tile: int) -> jax.Array:
  """``B^T d B`` of every tile of ``x``: ``(t * t, batch * tiles_h * tiles_w, in)``."""
  tiles_h, tiles_w, pad_h, pad_w = _tiling(x.shape, tile)
  if pad_h or pad_w:
    x = jnp.pad(x, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
  v = _input_transform(x, tiles_h, tiles_w, tile, TRANSFORMS[tile][0])
  return v.reshape(v.shape[0], -1, x.shape[-1])


def _forward(x, kernel, tile):
  _, g, at = TRANSFORMS[tile]
  t = tile + 2
  n, h, w, cin = x.shape
  tiles_h, tiles_w, _, _ = _tiling(x.shape, tile)
  gk = jnp.asarray(g, kernel.dtype)
  u = jnp.einsum("ak,klio,bl->abio", gk, kernel, gk).reshape(t * t, cin, -1)
  v = _transformed_input(x, tile)
  products = jnp.einsum("spi,sio->spo", v, u).reshape(t, t, n, tiles_h, tiles_w, -1)
  return _output_transform(products, at)[:, :h - 2, :w - 2], v


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _winograd(x, kernel, tile):
  return _forward(x, kernel, tile)[0]


def _winograd_fwd(x, kernel, tile):
  y, v = _forward(x, kernel, tile)
  return y, (v, kernel, x.shape)


def _winograd_bwd(tile, residuals, dy):
  # Autodiff's input gradient would scatter every tile's gradient back through the transposed
  # strided views (pads with interior zeros, slow on XLA:CPU). A VALID correlation's input
  # gradient is the FULL correlation of dy with the flipped, in/out-transposed kernel: one more
  # Winograd convolution of dy padded by 2. The kernel gradient stays in the Winograd domain:
  # dU[s] = V[s]^T dM[s] with dM = A dY A^T per tile, then dw = G^T dU G.
  v, kernel, x_shape = residuals
  _, g, at = TRANSFORMS[tile]
  t = tile + 2
  flipped = jnp.swapaxes(kernel[::-1, ::-1], 2, 3)
  dx = _forward(jnp.pad(dy, ((0, 0), (2, 2), (2, 2), (0, 0))), flipped, tile)[0]
  tiles_h, tiles_w, _, _ = _tiling(x_shape, tile)
  n, out_h, out_w, cout = dy.shape
  dy = jnp.pad(dy, ((0, 0), (0, tiles_h * tile - out_h), (0, tiles_w * tile - out_w), (0, 0)))
  dy = dy.reshape(n, tiles_h, tile, tiles_w, tile, cout)
  rows = [_combine([dy[:, :, i] for i in range(tile)], at[:, a]) for a in range(t)]
  dm = jnp.stack([_combine([r[:, :, :, j] for j in range(tile)], at[:, b])
                  for r in rows for b in range(t)])
  du = jnp.einsum("spi,spo->sio", v, dm.reshape(t * t, -1, cout)).reshape(t, t, -1, cout)
  gk = jnp.asarray(g, kernel.dtype)
  return dx, jnp.einsum("ak,abio,bl->klio", gk, du, gk)


_winograd.defvjp(_winograd_fwd, _winograd_bwd)


def _chunks(a: jax.Array, chunk: int) -> jax.Array:
  return a.reshape(a.shape[0] // chunk, chunk, *a.shape[1:])


def _unchunk(a: jax.Array) -> jax.Array:
  return a.reshape(-1, *a.shape[2:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _winograd_chunked(x, kernel, tile, chunk):
  return _unchunk(jax.lax.map(lambda part: _forward(part, kernel, tile)[0], _chunks(x, chunk)))


def _winograd_chunked_fwd(x, kernel, tile, chunk):
  return _winograd_chunked(x, kernel, tile, chunk), (x, kernel)


def _winograd_chunked_bwd(tile, chunk, residuals, dy):
  # Chunk by chunk, recomputing each chunk's transformed input (cheap, and it stays in cache)
  # instead of storing it, and the kernel gradient summed over the chunks afterwards: the
  # backward pass of a lax.map over the plain VJP would stack every chunk's residuals.
  x, kernel = residuals

  def chunk_gradients(part):
    x_part, dy_part = part
    v = _transformed_input(x_part, tile)
    return _winograd_bwd(tile, (v, kernel, x_part.shape), dy_part)

  dx, dkernel = jax.lax.map(chunk_gradients, (_chunks(x, chunk), _chunks(dy, chunk)))
  return _unchunk(dx), dkernel.sum(0)


_winograd_chunked.defvjp(_winograd_chunked_fwd, _winograd_chunked_bwd)


def conv2d_winograd(x: jax.Array, kernel: jax.Array, tile: int = 2,
                    chunk: int | None = 8) -> jax.Array:
  """``(batch, h, w, in) * (3, 3, in, out)`` -> ``(batch, h - 2, w - 2, out)``, VALID, stride 1,
  by Winograd's F(tile x tile, 3 x 3) (``tile`` 2 or 4).

  Inputs whose output is not a multiple of ``tile`` are padded with zeros at the bottom and
  right, and the extra outputs cut off. The gradients are Winograd's too (a custom VJP).
  ``chunk``: when it divides a larger batch, forward and backward go ``chunk`` images at a time
  (``lax.map``), so the transformed tiles stay in cache: on a 2-core Xeon this made the forward
  of Efficient-CapsNet's 3x3 convolutions at batch 128 about 3x faster than unchunked
  (docs/performance.md). ``None``: the whole batch at once.
  """
  if kernel.shape[:2] != (3, 3):
    raise ValueError(f"Winograd convolution needs a 3x3 kernel, got {kernel.shape[:2]}.")
  if tile not in TRANSFORMS:
    raise ValueError(f"Winograd tile must be one of {tuple(TRANSFORMS)}, got {tile!r}.")
  if chunk and x.shape[0] > chunk and x.shape[0] % chunk == 0:
    return _winograd_chunked(x, kernel, tile, chunk)
  return _winograd(x, kernel, tile)
