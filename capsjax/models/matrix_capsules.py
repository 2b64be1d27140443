"""Matrix capsules (Hinton, Sabour & Frosst 2018, "Matrix capsules with EM routing"): their
primary capsules, the votes of ``p x p`` pose matrices, votes shared over a grid with
coordinate addition, and variational Bayes routing's batch norms of a layer's parents. The
layers that take them are :mod:`capsjax.models.capsule_layers`' (``votes="matrix"``,
``routing_norms``); EM's network is :mod:`capsjax.models.em_capsnet`.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from capsjax import routing as routing_lib
from capsjax.common.errors import UsageError
from capsjax.models import layers


def matrix_vote_weights(in_caps: int, in_dim: int, out_caps: int, out_dim: int) -> tuple:
  """The shape of W_ij (p x p, in_dim = out_dim = p*p) for :func:`capsjax.routing.matrix_votes`."""
  p = math.isqrt(in_dim)
  if p * p != in_dim or out_dim != in_dim:
    raise ValueError(f"matrix votes need square poses of one size: in_dim={in_dim}, "
                     f"out_dim={out_dim}.")
  return (in_caps, out_caps, p, p)


def check_routing_norms(routing_norms: bool, router: routing_lib.Router) -> None:
  """UsageError when a layer is asked for VB's batch norms under another router."""
  if routing_norms and not router.activation_logits:
    raise UsageError(f"routing_norms batch-normalise the parents' activation logits (variational "
                     f"Bayes routing's code); router {router.name!r} gives none.")


class MatrixPrimaryCapsules(nnx.Module):
  """A 1x1 convolution (no bias) to ``types`` poses of ``p*p`` and an activation logit each;
  activation ``sigmoid(logit - offset)`` (the code's ``- 1.0``).

  The code concatenates a pose kernel (``types * p*p`` columns, std 0.5) and an activation
  kernel (``types`` columns, std 3.0), then reshapes the outputs as ``(types, p*p + 1)``: so a
  type's pose and logit come from interleaved columns of both (``layout="code"``, the
  default). ``layout="split"`` takes the poses from the pose kernel and the logits from the
  activation kernel, as the code's names intend. Parameters: ``channels x types (p*p + 1)``.
  """

  def __init__(self, channels: int, types: int, pose_size: int, *, pose_init: float,
               activation_init: float, activation_offset: float, layout: str,
               rngs: nnx.Rngs):
    atoms = pose_size * pose_size
    self.pose_kernel = nnx.Param(layers.kernel_init(pose_init)(rngs.params(),
                                                               (channels, types * atoms)))
    self.activation_kernel = nnx.Param(layers.kernel_init(activation_init)(rngs.params(),
                                                                  (channels, types)))
    self.types, self.atoms = types, atoms
    self.layout, self.offset = layout, activation_offset

  def __call__(self, features: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(batch, h, w, channels)`` -> poses ``(batch, h, w, types, p*p)``, activations
    ``(batch, h, w, types)``."""
    kernel = jnp.concatenate([self.pose_kernel[...], self.activation_kernel[...]], axis=1)
    out = jnp.einsum("bxyc,cn->bxyn", features, kernel)
    if self.layout == "code":
      out = out.reshape(*out.shape[:3], self.types, self.atoms + 1)
      poses, logits = out[..., :self.atoms], out[..., self.atoms]
    else:
      split = self.types * self.atoms
      poses = out[..., :split].reshape(*out.shape[:3], self.types, self.atoms)
      logits = out[..., split:]
    return poses, jax.nn.sigmoid(logits - self.offset)


class RoutingNorms(nnx.Module):
  """Variational Bayes routing's batch norms of a layer's parents (the authors' code's ``BN_a`` and
  ``BN_v``: PyTorch's defaults, momentum 0.1, epsilon 1e-5, no affine parameters): activation logits
  ``(batch, ..., types)`` and poses ``(batch, ..., types, D)``, each normalised per type."""

  def __init__(self, types: int, *, rngs: nnx.Rngs):
    kwargs = dict(use_bias=False, use_scale=False, momentum=0.9, epsilon=1e-5, rngs=rngs)
    self.activation_norm = nnx.BatchNorm(types, **kwargs)
    self.pose_norm = nnx.BatchNorm(types, axis=-2, **kwargs)

  def __call__(self, logits: jax.Array, poses: jax.Array, *, train: bool):
    """-> activations ``sigmoid(BN(logits))`` and ``BN(poses)``."""
    return (jax.nn.sigmoid(self.activation_norm(logits, use_running_average=not train)),
            self.pose_norm(poses, use_running_average=not train))


class GridMatrixVotes(NamedTuple):
  """Matrix votes of a grid of child capsules with one ``p x p`` transform per (child type,
  class) shared over positions, plus coordinate addition (Hinton et al. 2018, Sec. 3; the
  code's ``connector_capsule_mat``): a vote pair for :class:`ClassCapsules`, whose ``in_caps``
  are then the ``h * w * types`` children, position-major. ``offsets``: what is added to each
  position's votes, ``(h, w, p*p)`` as nested tuples (hashable;
  :func:`capsjax.models.receptive_fields.coordinate_offsets`)."""
  height: int
  width: int
  types: int
  pose_size: int
  offsets: tuple

  @classmethod
  def create(cls, height: int, width: int, types: int, pose_size: int,
             offsets: np.ndarray) -> "GridMatrixVotes":
    return cls(height, width, types, pose_size, tuple(map(tuple, np.asarray(
        offsets, np.float64).reshape(height * width, pose_size * pose_size).tolist())))

  def weight_shape(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int) -> tuple:
    if in_caps != self.height * self.width * self.types or in_dim != out_dim or (
        in_dim != self.pose_size ** 2):
      raise ValueError(f"grid votes of {self.height}x{self.width}x{self.types} poses of "
                       f"{self.pose_size ** 2}: got in_caps={in_caps}, in_dim={in_dim}, "
                       f"out_dim={out_dim}.")
    return (self.types, out_caps, self.pose_size, self.pose_size)

  def __call__(self, poses: jax.Array, weights: jax.Array) -> jax.Array:
    """``(batch, h * w * types, p*p)`` -> ``(batch, h * w * types, classes, p*p)``."""
    h, w, t, p = self.height, self.width, self.types, self.pose_size
    b = poses.shape[0]
    votes = jnp.einsum("bxytrc,tkcd->bxytkrd", poses.reshape(b, h, w, t, p, p),
                       weights).reshape(b, h, w, t, -1, p * p)
    offsets = jnp.asarray(np.asarray(self.offsets).reshape(h, w, p * p), votes.dtype)
    votes = votes + offsets[None, :, :, None, None, :]
    return votes.reshape(b, h * w * t, -1, p * p)

  @property
  def pair(self) -> tuple[Callable, Callable]:
    return (self.weight_shape, self)
