"""Receptive fields of convolutional capsule layers: the children a parent shares with its
neighbours, and where each receptive field lies in the image (the patches a parent sees:
:func:`capsjax.models.layers.valid_patches`).

Pure JAX and NumPy. A convolutional capsule layer's routing arrays are ``(batch, in_types * k *
k, out_types, oh * ow)``: a parent position's children are the ``in_types`` capsules at each of
its ``k x k`` offsets, so a child ``(y, x)`` of the layer below appears once in each receptive
field that holds it. :func:`conv_normaliser` normalises a child's assignments over those
appearances (EM routing; the modes: :mod:`capsjax.models.conv_capsules`),
:meth:`ReceptiveFieldGrid.child_sum` sums over them (VB routing as its authors' code at HEAD).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NORMALISATIONS = ("code", "child", "patch")
COORDINATE_ADDITIONS = ("code", "paper", "none")


def child_reduce(values: jax.Array, stride: int, op: str = "add") -> jax.Array:
  """Reduces ``(..., oh, ow, k, k)`` onto the children: ``out[..., y, x]`` combines every
  ``values[..., i, j, dy, dx]`` with ``stride i + dy = y`` and ``stride j + dx = x``.
  ``op``: ``"add"`` or ``"max"``. Returns ``(..., stride (oh-1) + k, stride (ow-1) + k)``."""
  *lead, oh, ow, k, _ = values.shape
  fill = 0.0 if op == "add" else -jnp.inf
  combine = jnp.add if op == "add" else jnp.maximum
  total = None
  for dy in range(k):
    for dx in range(k):
      pads = [(0, 0, 0)] * len(lead) + [(dy, k - 1 - dy, stride - 1), (dx, k - 1 - dx, stride - 1)]
      placed = jax.lax.pad(values[..., dy, dx], jnp.asarray(fill, values.dtype), pads)
      total = placed if total is None else combine(total, placed)
  return total


def gather_children(grid: jax.Array, stride: int, kernel: int, oh: int, ow: int) -> jax.Array:
  """The inverse map of :func:`child_reduce`: ``(..., H, W)`` -> ``(..., oh, ow, k, k)``,
  ``out[..., i, j, dy, dx] = grid[..., stride i + dy, stride j + dx]``."""
  views = [grid[..., dy:dy + stride * (oh - 1) + 1:stride, dx:dx + stride * (ow - 1) + 1:stride]
           for dy in range(kernel) for dx in range(kernel)]
  return jnp.stack(views, axis=-1).reshape(*grid.shape[:-2], oh, ow, kernel, kernel)


class ReceptiveFieldGrid:
  """Moves a convolutional layer's routing arrays ``(batch, in_types * k * k, out_types,
  oh * ow)`` to and from ``(batch, in_types, out_types, oh, ow, k, k)``, and sums over every
  parent of each child (:func:`child_reduce` then :func:`gather_children`)."""

  def __init__(self, in_types: int, kernel: int, stride: int, oh: int, ow: int):
    self.in_types, self.kernel, self.stride, self.oh, self.ow = in_types, kernel, stride, oh, ow

  def to_grid(self, x: jax.Array) -> jax.Array:
    b, _, o, _ = x.shape
    k = self.kernel
    return x.reshape(b, self.in_types, k, k, o, self.oh, self.ow).transpose(0, 1, 4, 5, 6, 2, 3)

  def from_grid(self, x: jax.Array) -> jax.Array:
    b, _, o = x.shape[:3]
    return x.transpose(0, 1, 5, 6, 2, 3, 4).reshape(
        b, self.in_types * self.kernel * self.kernel, o, self.oh * self.ow)

  def gather(self, per_child: jax.Array, stride: int) -> jax.Array:
    return gather_children(per_child, stride, self.kernel, self.oh, self.ow)

  def child_sum(self, values: jax.Array) -> jax.Array:
    """Each entry replaced by the sum of ``values`` over every (output type, position,
    offset) of its child: the true child ``stride y + dy`` (same shape)."""
    g = self.to_grid(values)
    total = self.gather(child_reduce(jnp.sum(g, axis=2), self.stride), self.stride)
    return self.from_grid(jnp.broadcast_to(total[:, :, None], g.shape))


def conv_normaliser(mode: str, in_types: int, kernel: int, stride: int, oh: int, ow: int,
                    epsilon: float = 1e-7):
  """The E-step's normalisation for a convolutional EM layer, ``log p (batch, in_types * k *
  k, out_types, oh * ow)`` -> assignments of the same shape (module docstring). ``epsilon``
  is the code's 1e-7 in the denominator (``"code"`` only)."""
  grid = ReceptiveFieldGrid(in_types, kernel, stride, oh, ow)

  def normalise(log_p):
    if mode == "patch":
      return jax.nn.softmax(log_p, axis=2)
    g = grid.to_grid(log_p)
    if mode == "code":
      e = jnp.exp(g - jnp.max(g, axis=(3, 4, 5, 6), keepdims=True))
      total = grid.gather(child_reduce(e, 1), 1)
      return grid.from_grid(e / (total + epsilon))
    peak = grid.gather(child_reduce(jnp.max(g, axis=2), stride, "max"), stride)[:, :, None]
    e = jnp.exp(g - jax.lax.stop_gradient(peak))
    total = grid.gather(child_reduce(jnp.sum(e, axis=2), stride), stride)
    return grid.from_grid(e / total[:, :, None])

  return normalise


def receptive_field_centres(image_size: int, layers: list[tuple[int, int]]) -> np.ndarray:
  """The centre of each position's receptive field after VALID ``(kernel, stride)`` layers, in
  input pixels from the image centre, divided by 100 (the code's ``conv_pos`` on a grid
  ``arange(-size // 2, (size + 1) // 2) / 100``), ``(positions,)`` along one axis."""
  centres = np.arange(-image_size // 2, (image_size + 1) // 2, dtype=np.float64) / 100.0
  for kernel, stride in layers:
    n = (len(centres) - kernel) // stride + 1
    centres = np.array([centres[j * stride:j * stride + kernel].mean() for j in range(n)])
  return centres


def coordinate_offsets(rows: np.ndarray, columns: np.ndarray, pose_size: int,
                       mode: str) -> np.ndarray:
  """What coordinate addition adds to the class layer's votes, ``(h, w, p*p)`` (float64).

  ``rows``, ``columns``: the receptive-field centres (:func:`receptive_field_centres`).
  ``"code"``: the column to pose element (0, 0) and the row to (0, 1), the first two entries
  of the flattened pose (the code's ``conv_pos`` swaps its two channels at each of the three
  layers). ``"paper"``: "the scaled coordinate (row, column) ... to the first two elements of
  the right-hand column of its vote matrix", elements (0, p-1) and (1, p-1). ``"none"``: 0.
  """
  p = pose_size
  offsets = np.zeros((len(rows), len(columns), p * p))
  if mode == "code":
    offsets[:, :, 0] = np.asarray(columns)[None, :]
    offsets[:, :, 1] = np.asarray(rows)[:, None]
  elif mode == "paper":
    offsets[:, :, p - 1] = np.asarray(rows)[:, None]
    offsets[:, :, 2 * p - 1] = np.asarray(columns)[None, :]
  return offsets
