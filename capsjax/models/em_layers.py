"""The layers of matrix capsules with EM routing (Hinton, Sabour & Frosst, ICLR 2018), as the
authors' code has them (google-research ``capsule_em/em_layers.py``: ``primary_caps``,
``conv_capsule_mat``, ``connector_capsule_mat``). A capsule grid is ``poses (batch, h, w,
types, p*p)`` (``p x p`` pose matrices, row-major) and ``activations (batch, h, w, types)``.

The routing (M- and E-steps) is :mod:`capsjax.routing.em`'s, shared with the ``em`` router;
what is here is how votes are formed over receptive fields and how a child's assignments are
normalised when it lies in the receptive fields of several parents (``normalisation``):

* ``"code"`` (default): the code's ``update_conv_routing``. For each child type and output
  type separately, the assignments are ``exp(log p - max)`` divided by their sum over the
  (parent position, kernel offset) pairs ``(y, dy)`` with the same ``y + dy``: the children of
  a stride-1 convolution. At stride 2 these groups are not the true children (child ``2y +
  dy``), and since output types are normalised separately, after the first iteration (which
  starts at ``1 / out_types``) output types no longer compete for a child.
* ``"child"``: each true child's assignments sum to one over every parent whose receptive
  field holds it (all output types and positions), as the paper describes EM.
* ``"patch"``: a softmax over output types at each (parent position, kernel offset), each
  receptive field routed on its own, as most reimplementations do.

With ``router="variational_bayes"`` (:mod:`capsjax.routing.variational_bayes`) the same layers
route by variational Bayes instead, as its authors' code does (``normalisation`` is EM's only):
at its HEAD each child's ``p_ij`` normalised over every parent whose receptive field holds it
(the router's ``conv_normalisation="child"``, :meth:`ReceptiveFieldGrid.child_sum`), in its
first commits each receptive field on its own (``"patch"``); and the parents' activation
logits and poses batch-normalised per output type (no scale or offset; running statistics at
evaluation) before the sigmoid.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from capsjax.models import layers
from capsjax.routing import em
from capsjax.routing import variational_bayes as vb

NORMALISATIONS = ("code", "child", "patch")
COORDINATE_ADDITIONS = ("code", "paper", "none")
PRIMARY_LAYOUTS = ("code", "split")
ROUTERS = ("em", "variational_bayes")


def receptive_fields(x: jax.Array, kernel: int, stride: int) -> jax.Array:
  """VALID patches: ``(batch, h, w, ...)`` -> ``(batch, oh, ow, kernel, kernel, ...)``."""
  return layers.valid_patches(x, kernel, kernel, stride)


def child_reduce(values: jax.Array, stride: int, op: str = "add") -> jax.Array:
  """Reduces ``(..., oh, ow, k, k)`` onto the children: ``out[..., y, x]`` combines every
  ``values[..., i, j, dy, dx]`` with ``stride i + dy = y`` and ``stride j + dx = x``.
  ``op``: ``"add"`` or ``"max"``. Returns ``(..., stride (oh-1) + k, stride (ow-1) + k)``."""
  *lead, oh, ow, k, _ = values.shape
  fill = 0.0 if op == "add" else -jnp.inf
  combine = jnp.add if op == "add" else jnp.maximum
  nd = len(lead)
  total = None
  for dy in range(k):
    for dx in range(k):
      pads = [(0, 0, 0)] * nd + [(dy, k - 1 - dy, stride - 1), (dx, k - 1 - dx, stride - 1)]
      placed = jax.lax.pad(values[..., dy, dx], jnp.asarray(fill, values.dtype), pads)
      total = placed if total is None else combine(total, placed)
  return total


def gather_children(grid: jax.Array, stride: int, kernel: int, oh: int, ow: int) -> jax.Array:
  """The inverse map of :func:`child_reduce`: ``(..., H, W)`` -> ``(..., oh, ow, k, k)``,
  ``out[..., i, j, dy, dx] = grid[..., stride i + dy, stride j + dx]``."""
  nd = grid.ndim
  rows = []
  for dy in range(kernel):
    cols = []
    for dx in range(kernel):
      part = jax.lax.slice_in_dim(grid, dy, dy + stride * (oh - 1) + 1, stride, axis=nd - 2)
      cols.append(jax.lax.slice_in_dim(part, dx, dx + stride * (ow - 1) + 1, stride,
                                       axis=nd - 1))
    rows.append(jnp.stack(cols, axis=-1))
  return jnp.stack(rows, axis=-2)


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


class RoutingNorms(nnx.Module):
  """Variational Bayes routing's batch norms of a layer's parents (the authors' code's
  ``BN_a`` and ``BN_v``: PyTorch's defaults, momentum 0.1, epsilon 1e-5, no affine
  parameters): activation logits ``(batch, ..., types)`` and poses ``(batch, ..., types, D)``,
  each normalised per type."""

  def __init__(self, types: int, *, rngs: nnx.Rngs):
    kwargs = dict(use_bias=False, use_scale=False, momentum=0.9, epsilon=1e-5, rngs=rngs)
    self.activation_norm = nnx.BatchNorm(types, **kwargs)
    self.pose_norm = nnx.BatchNorm(types, axis=-2, **kwargs)

  def __call__(self, logits: jax.Array, poses: jax.Array, *, train: bool):
    """-> activations ``sigmoid(BN(logits))`` and ``BN(poses)``."""
    return (jax.nn.sigmoid(self.activation_norm(logits, use_running_average=not train)),
            self.pose_norm(poses, use_running_average=not train))


def routed(router: str, votes: jax.Array, activations: jax.Array, beta_u: jax.Array,
           beta_a: jax.Array, settings: dict, *, normalise=None, initial=None,
           num_children=None, child_sum=None, diagnostics: bool = False):
  """The layer's routing of ``votes (batch, children, out_types, positions, D)``: poses
  ``(batch, out_types, positions, D)``, EM's activations or VB's activation logits ``(batch,
  out_types, positions)``, diagnostics. ``normalise``, ``initial``, ``num_children``: EM's;
  ``child_sum``: VB's (:func:`capsjax.routing.variational_bayes.vb_routing`)."""
  if router == "variational_bayes":
    result = vb.vb_routing(votes, activations, beta_u, beta_a, settings=settings,
                           diagnostics=diagnostics, child_sum=child_sum)
    return result.poses, result.activation_logits, result.diagnostics
  result = em.em_routing(votes, activations, beta_u, beta_a, settings=settings,
                         normalise=normalise, initial=initial, num_children=num_children,
                         diagnostics=diagnostics)
  return result.poses, result.activations, result.diagnostics


def truncated(std: float):
  """TF's ``truncated_normal_initializer(stddev)`` (normal cut at 2 std), the code's inits."""
  return layers.kernel_init(std)


class PrimaryCapsules(nnx.Module):
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
    self.pose_kernel = nnx.Param(truncated(pose_init)(rngs.params(), (channels, types * atoms)))
    self.activation_kernel = nnx.Param(truncated(activation_init)(rngs.params(),
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


class ConvCapsules(nnx.Module):
  """Convolutional capsules with EM routing over each parent's receptive field (VALID).

  One ``p x p`` transform per (input type, kernel position, output type): the vote of child i
  at offset (dy, dx) for output type o is ``M_i W[i, dy, dx, o]``. Per output type
  ``beta_u`` and ``beta_a`` (the code's sigma_biases and activation_biases, both 0.5).
  Parameters: ``in_types k^2 out_types p^2 + 2 out_types``.
  """

  def __init__(self, in_types: int, out_types: int, kernel: int, stride: int, pose_size: int,
               *, init_scale: float, settings: dict, normalisation: str, rngs: nnx.Rngs,
               router: str = "em"):
    """``settings``: the router's settings for this layer (EM, the code's: inverse
    temperature 0.01, mass epsilon 1e-7, beta inits 0.5); ``router``: ``"em"`` or
    ``"variational_bayes"`` (module docstring)."""
    self.weights = nnx.Param(truncated(init_scale)(
        rngs.params(), (in_types, kernel, kernel, out_types, pose_size, pose_size)))
    self.beta_u = nnx.Param(jnp.full((out_types,), settings["beta_u_init"], jnp.float32))
    self.beta_a = nnx.Param(jnp.full((out_types,), settings["beta_a_init"], jnp.float32))
    self.kernel, self.stride, self.pose_size = kernel, stride, pose_size
    self.settings_items = tuple(sorted(settings.items()))  # Hashable, static.
    self.normalisation, self.router = normalisation, router
    if router == "variational_bayes":
      self.norms = RoutingNorms(out_types, rngs=rngs)

  def votes(self, poses: jax.Array) -> jax.Array:
    """``(batch, h, w, in_types, p*p)`` -> ``(batch, in_types * k * k, out_types, oh * ow,
    p*p)`` (children of a receptive field, parents, positions, pose)."""
    p = self.pose_size
    patches = receptive_fields(poses, self.kernel, self.stride)    # (b, oh, ow, k, k, i, p*p)
    b, oh, ow, k, _, i, _ = patches.shape
    matrices = patches.reshape(b, oh, ow, k, k, i, p, p)
    votes = jnp.einsum("bpqhwirc,ihwocd->bihwopqrd", matrices, self.weights[...])
    return votes.reshape(b, i * k * k, votes.shape[4], oh * ow, p * p)

  def __call__(self, poses: jax.Array, activations: jax.Array, *, train: bool = False,
               diagnostics: bool = False):
    """Poses ``(batch, h, w, in_types, p*p)`` and activations ``(batch, h, w, in_types)`` ->
    the parents' poses ``(batch, oh, ow, out_types, p*p)``, activations ``(batch, oh, ow,
    out_types)`` and the routing diagnostics. ``train``: the batch norms of VB routing use
    (and update) the batch's statistics."""
    b, h, w, i, _ = poses.shape
    k, s = self.kernel, self.stride
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    votes = self.votes(poses)
    child_activations = receptive_fields(activations, k, s)       # (b, oh, ow, k, k, i)
    child_activations = child_activations.transpose(0, 5, 3, 4, 1, 2).reshape(
        b, i * k * k, 1, oh * ow)
    settings = dict(self.settings_items)
    normalise = conv_normaliser(self.normalisation, i, k, s, oh, ow, settings["mass_epsilon"])
    initial = normalise(jnp.zeros(votes.shape[:4], votes.dtype)) \
        if self.normalisation == "child" and self.router == "em" else None
    child_sum = ReceptiveFieldGrid(i, k, s, oh, ow).child_sum if (
        self.router == "variational_bayes" and settings["conv_normalisation"] == "child") \
        else None
    means, activations, measured = routed(
        self.router, votes, child_activations, self.beta_u[...], self.beta_a[...], settings,
        normalise=normalise, initial=initial, num_children=i * h * w, child_sum=child_sum,
        diagnostics=diagnostics)
    out_types = votes.shape[2]
    poses = means.reshape(b, out_types, oh, ow, -1).transpose(0, 2, 3, 1, 4)
    activations = activations.reshape(b, out_types, oh, ow).transpose(0, 2, 3, 1)
    if self.router == "variational_bayes":
      activations, poses = self.norms(activations, poses, train=train)
    return poses, activations, measured


def receptive_field_centres(image_size: int, layers: list[tuple[int, int]]) -> np.ndarray:
  """The centre of each position's receptive field after VALID ``(kernel, stride)`` layers, in
  input pixels from the image centre, divided by 100 (the code's ``conv_pos`` on a grid
  ``arange(-size // 2, (size + 1) // 2) / 100``), ``(positions,)`` along one axis."""
  centres = np.arange(-image_size // 2, (image_size + 1) // 2, dtype=np.float64) / 100.0
  for kernel, stride in layers:
    n = (len(centres) - kernel) // stride + 1
    centres = np.array([centres[j * stride:j * stride + kernel].mean() for j in range(n)])
  return centres


class ClassCapsules(nnx.Module):
  """Class capsules: one ``p x p`` transform per (input type, class), shared across
  positions, with coordinate addition, and fully connected EM routing
  (:func:`capsjax.routing.em.route`). Parameters: ``in_types p^2 classes + 2 classes``.

  Coordinate addition (``coordinate_addition``): the centre of each child's receptive field
  (:func:`receptive_field_centres`, pixels / 100) is added to its votes.
  ``"code"`` (default): the column to pose element (0, 0) and the row to (0, 1), the first
  two entries of the flattened pose (the code's ``conv_pos`` swaps its two channels at each of
  the three layers). ``"paper"``: "the scaled coordinate (row, column) ... to the first two
  elements of the right-hand column of its vote matrix", elements (0, p-1) and (1, p-1).
  ``"none"``: not added.
  """

  def __init__(self, in_types: int, classes: int, pose_size: int, *, init_scale: float,
               coordinate_addition: str, row_centres: np.ndarray, column_centres: np.ndarray,
               settings: dict, rngs: nnx.Rngs, router: str = "em"):
    self.weights = nnx.Param(truncated(init_scale)(
        rngs.params(), (in_types, classes, pose_size, pose_size)))
    self.beta_u = nnx.Param(jnp.full((classes,), settings["beta_u_init"], jnp.float32))
    self.beta_a = nnx.Param(jnp.full((classes,), settings["beta_a_init"], jnp.float32))
    # Hashable statics for NNX's graph definition.
    self.centres = (tuple(map(float, row_centres)), tuple(map(float, column_centres)))
    self.coordinate_addition = coordinate_addition
    self.pose_size = pose_size
    self.settings_items = tuple(sorted(settings.items()))
    self.router = router
    if router == "variational_bayes":
      self.norms = RoutingNorms(classes, rngs=rngs)

  def offsets(self) -> np.ndarray:
    """What coordinate addition adds to the votes, ``(h, w, p*p)``."""
    rows, columns = (np.asarray(c, np.float64) for c in self.centres)
    p = self.pose_size
    offsets = np.zeros((len(rows), len(columns), p * p))
    if self.coordinate_addition == "code":
      offsets[:, :, 0] = columns[None, :]
      offsets[:, :, 1] = rows[:, None]
    elif self.coordinate_addition == "paper":
      offsets[:, :, p - 1] = rows[:, None]
      offsets[:, :, 2 * p - 1] = columns[None, :]
    return offsets

  def votes(self, poses: jax.Array) -> jax.Array:
    """``(batch, h, w, types, p*p)`` -> ``(batch, h * w * types, classes, p*p)``."""
    b, h, w, t, _ = poses.shape
    p = self.pose_size
    votes = jnp.einsum("bxytrc,tkcd->bxytkrd", poses.reshape(b, h, w, t, p, p),
                       self.weights[...]).reshape(b, h, w, t, -1, p * p)
    votes = votes + jnp.asarray(self.offsets(), votes.dtype)[None, :, :, None, None, :]
    return votes.reshape(b, h * w * t, -1, p * p)

  def __call__(self, poses: jax.Array, activations: jax.Array, *, train: bool = False,
               diagnostics: bool = False):
    """-> class poses ``(batch, classes, p*p)``, activations ``(batch, classes)``, and the
    routing diagnostics (fully connected routing: each child's assignments a softmax over the
    classes, the code's ``update_em_routing``)."""
    votes = self.votes(poses)[:, :, :, None, :]
    children = activations.reshape(poses.shape[0], -1)[:, :, None, None]
    means, activations, measured = routed(
        self.router, votes, children, self.beta_u[...], self.beta_a[...],
        dict(self.settings_items), normalise=lambda log_p: jax.nn.softmax(log_p, axis=2),
        diagnostics=diagnostics)
    means, activations = means[:, :, 0], activations[:, :, 0]
    if self.router == "variational_bayes":
      activations, means = self.norms(activations, means, train=train)
    return means, activations, measured
