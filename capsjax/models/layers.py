"""Flax NNX layers of CapsNet: convolutions, primary and class capsules, decoder.

The layers only hold parameters; the capsule maths lives in
:mod:`capsjax.routing`. Images are NHWC, kernels HWIO.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from capsjax import routing as routing_lib
from capsjax.common.errors import UsageError
from capsjax.models import winograd

CONV_IMPLS = ("auto", "native", "polyphase", "im2col", "winograd", "winograd4")
PADDINGS = ("VALID", "SAME")
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def check_compute_settings(config) -> None:
  """Raises UsageError for a ``config.model`` whose conv_impl or compute_dtype is unknown."""
  if config.conv_impl not in CONV_IMPLS:
    raise UsageError(f"config.model.conv_impl must be one of {CONV_IMPLS}, "
                     f"got {config.conv_impl!r}.")
  if config.compute_dtype not in COMPUTE_DTYPES:
    raise UsageError(f"config.model.compute_dtype must be one of "
                     f"{tuple(COMPUTE_DTYPES)}, got {config.compute_dtype!r}.")


def same_padding(size: int, kernel_size: int, stride: int) -> tuple[int, int]:
  """Zeros before and after an axis of ``size`` for TF's SAME: ``ceil(size / stride)`` outputs,
  the odd zero after."""
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel_size - size, 0)
  return total // 2, total - total // 2


def conv2d(x: jax.Array, kernel: jax.Array, stride: int, impl: str = "auto",
           padding: str = "VALID") -> jax.Array:
  """2-D convolution, ``(batch, h, w, in) * (k, k, in, out)``.

  ``padding``: ``"VALID"`` (the paper's MNIST model) or ``"SAME"`` (TF's rule,
  zeros added around the input first, so every ``impl`` computes the same).

  ``impl``:
    * ``"native"``: one ``lax.conv_general_dilated``.
    * ``"polyphase"``: a strided convolution written as the sum of
      ``stride**2`` stride-1 convolutions over the polyphase components of
      input and kernel. It is the same function (exact up to float rounding);
      XLA:CPU computes its input gradient far faster than the strided
      convolution's, whose input gradient it handles poorly.
    * ``"im2col"``: gather the k*k shifted (strided) views of the input into
      a patch matrix and multiply it with the kernel in one 2-D matmul. It
      costs a patch tensor k*k times the output's size, and on XLA:CPU it was
      the fastest for both of the paper's convolutions, forward and gradients
      (README, Performance, has the timings).
    * ``"winograd"`` / ``"winograd4"``: 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) /
      F(4x4, 3x3) (:mod:`capsjax.models.winograd`: 16/36 and 36/144 of the multiplications,
      gradients included); other shapes by im2col.
    * ``"auto"``: im2col on CPU. On a GPU, polyphase for strided convolutions with kernels
      larger than 3x3 and native for the rest: with cuDNN the paper CapsNet's train step ran
      1.7-1.9x faster with its 9x9 stride-2 PrimaryCapsules written as polyphase, and
      Efficient-CapsNet's 0.86x as fast with its 3x3 stride-2 convolution so (an H200,
      docs/performance.md); kernels between those two sizes were not measured. Native on
      TPUs (not measured).
  """
  if impl not in CONV_IMPLS:
    raise ValueError(f"conv impl must be one of {CONV_IMPLS}, got {impl!r}.")
  if padding not in PADDINGS:
    raise ValueError(f"conv padding must be one of {PADDINGS}, got {padding!r}.")
  if padding == "SAME":
    x = jnp.pad(x, ((0, 0), same_padding(x.shape[1], kernel.shape[0], stride),
                    same_padding(x.shape[2], kernel.shape[1], stride), (0, 0)))
  if impl == "auto":
    impl = _auto_conv_impl(jax.default_backend(), kernel.shape[:2], stride)
  if impl in ("winograd", "winograd4") and kernel.shape[:2] == (3, 3) and stride == 1:
    return winograd.conv2d_winograd(x, kernel, tile=4 if impl == "winograd4" else 2)
  if impl in ("im2col", "winograd", "winograd4"):
    return _conv_im2col(x, kernel, stride)
  if impl == "native" or stride == 1:
    return _conv_native(x, kernel, stride)
  return _conv_polyphase(x, kernel, stride)


def _auto_conv_impl(backend: str, kernel_size: tuple[int, int], stride: int) -> str:
  """What ``conv2d(impl="auto")`` computes a convolution as on ``backend``: see
  :func:`conv2d`."""
  if backend == "cpu":
    return "im2col"
  if backend == "gpu" and stride > 1 and max(kernel_size) > 3:
    return "polyphase"
  return "native"


DEPTHWISE_IMPLS = ("auto", "native", "window_sum", "shifted")


def depthwise_conv2d(x: jax.Array, kernel: jax.Array, impl: str = "auto") -> jax.Array:
  """Depthwise convolution, VALID, stride 1: ``(batch, h, w, c) * (k, k, 1, c)`` ->
  ``(batch, h - k + 1, w - k + 1, c)``, one ``k x k`` filter per channel.

  ``impl``:
    * ``"native"``: ``lax.conv_general_dilated`` with ``feature_group_count=c``. XLA:CPU's
      gradient of a grouped convolution is slow: 471 ms forward + backward for Efficient-
      CapsNet's 9x9 primary capsules at batch 128 (9x9x128 input), 60 ms at batch 16.
    * ``"window_sum"``: when the kernel covers the whole input (that layer), the convolution
      is an elementwise multiply and a sum over the window, one einsum: 8.2 ms and 0.54 ms.
    * ``"shifted"``: the sum over the k*k kernel offsets of the shifted input times that
      offset's weights; elementwise, so its gradient is too. 6-8x faster than native on
      XLA:CPU for 9x9 kernels on 9x9 to 20x20 inputs at batch 16 and 128 (a 20x20 input at
      batch 128: 826 ms against 5,869 ms).
    * ``"auto"``: window_sum where the kernel covers the input, else shifted on CPU and native
      elsewhere (not measured on accelerators).
  Every impl is the same function (float32 rounding apart; tests/test_layers.py).
  """
  if impl not in DEPTHWISE_IMPLS:
    raise ValueError(f"depthwise conv impl must be one of {DEPTHWISE_IMPLS}, got {impl!r}.")
  kh, kw = kernel.shape[:2]
  covers = (kh, kw) == tuple(x.shape[1:3])
  if impl == "auto":
    impl = ("window_sum" if covers else
            "shifted" if jax.default_backend() == "cpu" else "native")
  if impl == "window_sum":
    if not covers:
      raise ValueError(f"depthwise conv impl 'window_sum' needs a kernel the size of the input, "
                       f"got {kh}x{kw} on {x.shape[1]}x{x.shape[2]}.")
    return jnp.einsum("bhwc,hwc->bc", x, kernel[:, :, 0, :])[:, None, None, :]
  if impl == "shifted":
    out_h, out_w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    terms = [x[:, i:i + out_h, j:j + out_w, :] * kernel[i, j, 0]
             for i in range(kh) for j in range(kw)]
    return functools.reduce(jnp.add, terms)
  return jax.lax.conv_general_dilated(
      x, kernel, window_strides=(1, 1), padding="VALID",
      dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=x.shape[-1])


def _conv_native(x, kernel, stride):
  return jax.lax.conv_general_dilated(
      x, kernel, window_strides=(stride, stride), padding="VALID",
      dimension_numbers=("NHWC", "HWIO", "NHWC"))


def valid_patches(x: jax.Array, kh: int, kw: int, stride: int) -> jax.Array:
  """The VALID receptive fields of ``x`` ``(batch, h, w, ...)``: ``(batch, out_h, out_w, kh,
  kw, ...)``, ``out[:, i, j, dy, dx] = x[:, stride i + dy, stride j + dx]``."""
  out_h = (x.shape[1] - kh) // stride + 1
  out_w = (x.shape[2] - kw) // stride + 1
  views = [x[:, i:i + stride * (out_h - 1) + 1:stride, j:j + stride * (out_w - 1) + 1:stride]
           for i in range(kh) for j in range(kw)]
  return jnp.stack(views, axis=3).reshape(*x.shape[:1], out_h, out_w, kh, kw, *x.shape[3:])


def im2col_patches(x: jax.Array, kh: int, kw: int, stride: int) -> jax.Array:
  """The VALID patches of ``x`` ``(batch, h, w, c)`` as one matrix
  ``(batch * out_h * out_w, kh * kw * c)``, kernel offset major, channel minor (HWIO order)."""
  return valid_patches(x, kh, kw, stride).reshape(-1, kh * kw * x.shape[3])


def _conv_im2col(x, kernel, stride):
  kh, kw, cin, cout = kernel.shape
  out_h = (x.shape[1] - kh) // stride + 1
  out_w = (x.shape[2] - kw) // stride + 1
  # One 2-D matmul, (batch*out_h*out_w, kh*kw*cin) x (kh*kw*cin, cout): as an
  # einsum over (p, c) XLA:CPU first transposed the patches to (c, p) order.
  patches = im2col_patches(x, kh, kw, stride)
  return (patches @ kernel.reshape(kh * kw * cin, cout)).reshape(x.shape[0], out_h, out_w, cout)


def _conv_polyphase(x, kernel, stride):
  # y[o] = sum_k x[s*o + k] w[k] = sum_p sum_k' x_p[o + k'] w_p[k'] with
  # x_p = x[p::s], w_p = w[p::s]: one stride-1 conv per phase pair (p, q).
  out_h = (x.shape[1] - kernel.shape[0]) // stride + 1
  out_w = (x.shape[2] - kernel.shape[1]) // stride + 1
  total = None
  for p in range(min(stride, kernel.shape[0])):
    for q in range(min(stride, kernel.shape[1])):
      phase = _conv_native(x[:, p::stride, q::stride], kernel[p::stride, q::stride], 1)
      phase = phase[:, :out_h, :out_w]
      total = phase if total is None else total + phase
  return total


def kernel_init(init_scale: float) -> nnx.Initializer:
  """Kernel initialiser: LeCun normal (Flax's default) for ``init_scale == 0``.

  ``init_scale > 0`` draws normal(0, init_scale) cut at 2 std, as TF's
  ``truncated_normal`` in the official code (std 0.88 x ``init_scale``).
  """
  if init_scale > 0:
    return nnx.initializers.truncated_normal(stddev=init_scale)
  return nnx.initializers.lecun_normal()


class Conv2D(nnx.Module):
  """Convolution (VALID or SAME) with bias, optionally computed in a lower precision.

  The kernel is drawn by :func:`kernel_init` (``init_scale``), the bias starts
  at ``bias_init``.
  """

  def __init__(self, in_features: int, out_features: int, kernel_size: int, stride: int,
               *, impl: str = "auto", compute_dtype=jnp.float32, init_scale: float = 0.0,
               bias_init: float = 0.0, padding: str = "VALID",
               initializer: nnx.Initializer | None = None, rngs: nnx.Rngs):
    """``initializer``, if given, draws the kernel instead of :func:`kernel_init`."""
    init = initializer or kernel_init(init_scale)
    self.kernel = nnx.Param(init(rngs.params(),
                                 (kernel_size, kernel_size, in_features, out_features)))
    self.bias = nnx.Param(jnp.full((out_features,), bias_init, jnp.float32))
    self.stride = stride
    self.impl = impl
    self.padding = padding
    self.compute_dtype = compute_dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """``(batch, h, w, in_features)`` -> ``(batch, h', w', out_features)``, float32 (float64
    for float64 inputs: a float64 run, e.g. a test against a NumPy reference, stays float64;
    ``compute_dtype`` only ever lowers float32)."""
    dtype = x.dtype if jnp.finfo(x.dtype).bits > 32 else self.compute_dtype
    y = conv2d(x.astype(dtype), self.kernel[...].astype(dtype), self.stride, self.impl,
               self.padding)
    return y.astype(jnp.promote_types(dtype, jnp.float32)) + self.bias[...]


class Capsules(NamedTuple):
  """A layer of capsules: what primary capsule layers return and class capsules take.

  Attributes:
    poses: ``(batch, num_capsules, dim)``: vectors (Sabour et al. 2017), or ``p x p`` pose
      matrices flattened to ``p * p`` (Hinton et al. 2018).
    activations: ``(batch, num_capsules)``: the vectors' lengths, or a matrix capsule's
      logistic activation.
  """
  poses: jax.Array
  activations: jax.Array


def vector_capsules(poses: jax.Array) -> Capsules:
  """Vector capsules, their lengths as activations."""
  return Capsules(poses, routing_lib.safe_norm(poses))


def vector_vote_weights(in_caps: int, in_dim: int, out_caps: int, out_dim: int) -> tuple:
  """The shape of W_ij for :func:`capsjax.routing.capsule_votes` (u_hat = W_ij u_i)."""
  return (in_caps, out_caps, out_dim, in_dim)


def matrix_vote_weights(in_caps: int, in_dim: int, out_caps: int, out_dim: int) -> tuple:
  """The shape of W_ij for :func:`capsjax.routing.matrix_votes` (V_ij = M_i W_ij): ``p x p``
  with ``in_dim = out_dim = p * p``."""
  p = math.isqrt(in_dim)
  if p * p != in_dim or out_dim != in_dim:
    raise ValueError(f"matrix votes need square poses of one size: in_dim={in_dim}, "
                     f"out_dim={out_dim}.")
  return (in_caps, out_caps, p, p)


# How votes are formed: name -> (the shape of W from the layer's sizes, the vote function).
VOTES: dict[str, tuple[Callable, Callable]] = {
    "vector": (vector_vote_weights, routing_lib.capsule_votes),
    "matrix": (matrix_vote_weights, routing_lib.matrix_votes),
}


class PrimaryCapsules(nnx.Module):
  """A convolution whose channels are grouped into capsules, then squashed.

  With the paper's settings the 256 channels of a 9x9 stride-2 convolution are
  32 capsule types of 8 dimensions; on a 6x6 grid that is 1152 capsules.

  ``output_scale`` multiplies the convolution (before its bias) ahead of the squash: 1 in the
  paper; the official code's PrimaryCaps (``conv_slim_capsule`` with one input capsule and one
  routing iteration) couples it with softmax(0) = 1/num_types over the types, i.e. 1/32.
  """

  def __init__(self, in_features: int, num_types: int, dim: int, kernel_size: int,
               stride: int, *, squash_epsilon: float = 0.0, impl: str = "auto",
               compute_dtype=jnp.float32, init_scale: float = 0.0, bias_init: float = 0.0,
               padding: str = "VALID", output_scale: float = 1.0, rngs: nnx.Rngs):
    self.conv = Conv2D(in_features, num_types * dim, kernel_size, stride, impl=impl,
                       compute_dtype=compute_dtype, init_scale=init_scale,
                       bias_init=bias_init, padding=padding, rngs=rngs)
    self.num_types = num_types
    self.dim = dim
    self.squash_epsilon = squash_epsilon
    self.output_scale = output_scale

  def __call__(self, features: jax.Array) -> Capsules:
    """``(batch, h, w, in_features)`` -> vector capsules: poses ``(batch, h'*w'*num_types,
    dim)``, squashed, and their lengths."""
    x = self.conv(features)
    if self.output_scale != 1.0:  # Official code: coupling x conv + bias.
      bias = self.conv.bias[...]
      x = (x - bias) * self.output_scale + bias
    capsules = x.reshape(x.shape[0], -1, self.dim)
    return vector_capsules(routing_lib.squash(capsules, epsilon=self.squash_epsilon))


class ClassCapsules(nnx.Module):
  """Fully connected capsule layer ("DigitCaps"): votes by W_ij, then a router.

  ``votes`` says how a child votes for a parent: ``"vector"``, u_hat_{j|i} = W_ij u_i (Sabour
  et al., Eq. 2; one ``(out_dim, in_dim)`` matrix per (child i, parent j)), or ``"matrix"``,
  V_ij = M_i W_ij (Hinton et al. 2018; one ``p x p`` transform per pair, poses of ``p * p``);
  or a pair ``(weight_shape, vote_fn)`` as in :data:`VOTES`. Votes are formed without tiling
  W over the batch. The router (:mod:`capsjax.routing`) turns them into parents, so every
  router runs on either kind; its own learned parameters, if it declares any, are created
  here (``router_params``).

  ``routing``: ``{"name": ..., **settings}`` with every setting of that router filled in
  (:func:`capsjax.routing.resolve`); None: dynamic routing with the keyword switches below.
  """

  def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int, *,
               init_scale: float = 0.1, use_bias: bool = False, bias_init: float = 0.1,
               routing_iterations: int = 3, softmax_axis: str = "output",
               stop_gradient: bool = False, leaky: bool = False,
               squash_epsilon: float = 0.0, routing: dict | None = None,
               initializer: nnx.Initializer | None = None,
               votes: str | tuple[Callable, Callable] = "vector", rngs: nnx.Rngs):
    """``initializer``, if given, draws W (shape ``(in_caps, out_caps, out_dim, in_dim)`` for
    vector votes) instead of the truncated normal of std ``init_scale``."""
    if isinstance(votes, str) and votes not in VOTES:
      raise ValueError(f"ClassCapsules votes must be one of {tuple(VOTES)} or a pair "
                       f"(weight_shape, vote_fn), got {votes!r}.")
    weight_shape, self.vote_fn = VOTES[votes] if isinstance(votes, str) else votes
    if routing is None:
      routing = {"name": "dynamic", "iterations": routing_iterations,
                 "softmax_axis": softmax_axis, "stop_gradient": stop_gradient, "leaky": leaky,
                 "squash_epsilon": squash_epsilon}
    routing = dict(routing)
    router = routing_lib.get(routing.pop("name"))
    # Hashable statics (a name and settings as sorted pairs) for NNX's graph definition.
    self.router_name = router.name
    self.routing_items = tuple(sorted(routing.items()))
    if use_bias and not router.uses_parent_bias:
      raise UsageError(f"config.model.class_capsules.use_bias adds a bias to s_j, which router "
                       f"{router.name!r} does not form; leave it False.")
    init = initializer or nnx.initializers.truncated_normal(stddev=init_scale)
    self.weights = nnx.Param(init(rngs.params(),
                                  weight_shape(in_caps, in_dim, out_caps, out_dim)))
    self.bias = nnx.data(
        nnx.Param(jnp.full((out_caps, out_dim), bias_init)) if use_bias else None)
    specs = router.parameters(in_caps, in_dim, out_caps, out_dim, routing)
    # None without parameters: the parameter tree (and checkpoints) of dynamic routing stay
    # as they were before routers had parameters.
    self.router_params = nnx.data(nnx.Dict(
        {name: nnx.Param(spec.create(rngs.params())) for name, spec in specs.items()})
        if specs else None)

  @property
  def router(self) -> routing_lib.Router:
    return routing_lib.get(self.router_name)

  @property
  def routing_settings(self) -> dict:
    return dict(self.routing_items)

  def votes(self, poses: jax.Array) -> jax.Array:
    """``(batch, in_caps, in_dim)`` -> ``(batch, in_caps, out_caps, out_dim)``."""
    return self.vote_fn(poses, self.weights[...])

  def route(self, capsules: Capsules | jax.Array, *, train: bool = False,
            rng: jax.Array | None = None,
            diagnostics: bool = False) -> routing_lib.RoutingResult:
    """Child :class:`Capsules` (or bare vector poses ``(batch, in_caps, in_dim)``, their
    lengths the activations) -> :class:`capsjax.routing.RoutingResult` (parents
    ``(batch, out_caps, out_dim)``, their activations or None, diagnostics)."""
    if not isinstance(capsules, Capsules):
      capsules = vector_capsules(capsules)
    params = {} if self.router_params is None else {
        name: p[...] for name, p in self.router_params.items()}
    if self.bias is not None:
      params["bias"] = self.bias[...]
    return self.router.route(
        self.votes(capsules.poses), inputs=capsules.poses, activations=capsules.activations,
        params=params, rng=rng, settings=self.routing_settings, train=train,
        diagnostics=diagnostics)

  def __call__(self, capsules: Capsules | jax.Array) -> jax.Array:
    """Child capsules -> parents ``(batch, out_caps, out_dim)`` (evaluation)."""
    return self.route(capsules).capsules


class Decoder(nnx.Module):
  """Reconstruction network: masked class capsules -> image (paper, Fig. 2).

  Kernels by :func:`kernel_init` (``init_scale``; the official code uses 0.1), or one
  initializer per layer (``initializers``); biases start at ``bias_init`` (official code: 0.1).
  """

  def __init__(self, num_classes: int, capsule_dim: int, hidden: Sequence[int],
               image_shape: Sequence[int], *, compute_dtype=jnp.float32,
               init_scale: float = 0.0, bias_init: float = 0.0,
               initializers: Sequence[nnx.Initializer] | None = None, rngs: nnx.Rngs):
    sizes = [num_classes * capsule_dim, *hidden, math.prod(image_shape)]
    inits = initializers or [kernel_init(init_scale)] * (len(sizes) - 1)
    if len(inits) != len(sizes) - 1:
      raise ValueError(f"Decoder: {len(inits)} initializers for {len(sizes) - 1} layers.")
    self.layers = nnx.List([
        nnx.Linear(a, b, dtype=compute_dtype, kernel_init=init,
                   bias_init=nnx.initializers.constant(bias_init), rngs=rngs)
        for a, b, init in zip(sizes, sizes[1:], inits)])
    self.image_shape = tuple(image_shape)

  def __call__(self, class_capsules: jax.Array, mask: jax.Array) -> jax.Array:
    """Decodes the capsules that ``mask`` keeps.

    Args:
      class_capsules: ``(batch, num_classes, capsule_dim)``.
      mask: ``(batch, num_classes)``, usually one-hot; the others are zeroed.

    Returns:
      Pixel intensities in (0, 1), ``(batch, *image_shape)``.
    """
    x = (class_capsules * mask[..., None]).reshape(class_capsules.shape[0], -1)
    for layer in self.layers[:-1]:
      x = jax.nn.relu(layer(x))
    x = jax.nn.sigmoid(self.layers[-1](x).astype(jnp.float32))
    return x.reshape(x.shape[0], *self.image_shape)
