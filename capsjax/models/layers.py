"""Flax NNX layers without capsules: convolutions (native, im2col, polyphase, Winograd;
VALID or SAME; depthwise ones: :mod:`capsjax.models.depthwise`), their initialisers, and the
reconstruction decoder. The capsule layers are in
:mod:`capsjax.models.capsule_layers`. Images are NHWC, kernels HWIO.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from capsjax.common import platform, public_names
from capsjax.config.settings import NON_NEGATIVE, POSITIVE, Setting, at_least, each, one_of
from capsjax.models import winograd
from capsjax.models.depthwise import depthwise_conv2d  # noqa: F401 (public here)

CONV_IMPLS = ("auto", "native", "polyphase", "im2col", "winograd", "winograd4")
PADDINGS = ("VALID", "SAME")
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# The settings of these layers that models compose into their own (``model.*``).
CONV_IMPL = Setting(kind=str, meaning="How convolutions are computed: \"auto\" (im2col on a "
                    "CPU; on a GPU polyphase for strided kernels larger than 3x3, native for "
                    "the rest; native on a TPU) | \"native\" | \"im2col\" | \"polyphase\" | "
                    "\"winograd[4]\" (the same numbers).",
                    check=one_of(*CONV_IMPLS), neutral=True)
COMPUTE_DTYPE = Setting(kind=str, meaning="\"bfloat16\": convolutions and decoder in bf16.",
                        check=one_of(*COMPUTE_DTYPES))
PADDING = Setting("VALID", "The convolutions' padding (CIFAR-10's code: SAME).",
                  check=one_of(*PADDINGS))
INIT_SCALE = ">0: normal(0, s) cut at 2 std; 0: LeCun normal."


def conv_settings(prefix: str, what: str) -> dict[str, Setting]:
  """A convolution's settings under ``prefix`` (``"model.conv1"``), every config's."""
  return {f"{prefix}.features": Setting(kind=int, meaning=f"{what}: channels.", check=POSITIVE),
          f"{prefix}.kernel_size": Setting(kind=int, meaning="Square kernel side.",
                                           check=POSITIVE),
          f"{prefix}.stride": Setting(kind=int, meaning="Stride.", check=POSITIVE),
          f"{prefix}.init_scale": Setting(kind=float, meaning=INIT_SCALE, check=NON_NEGATIVE,
                                          init_only=True),
          f"{prefix}.bias_init": Setting(kind=float, meaning="The biases' initial value.",
                                         init_only=True)}


def decoder_settings(init: bool = True) -> dict[str, Setting]:
  """``model.decoder``'s settings; ``init``: its initialisation too (CapsNet's)."""
  table = {"model.decoder.enabled": Setting(kind=bool, meaning="Reconstruct the image from the "
                                            "true class's capsule."),
           "model.decoder.hidden": Setting(kind=tuple, meaning="The hidden widths (paper: 512, "
                                           "1024).", check=each(at_least(1)))}
  if init:
    table["model.decoder.init_scale"] = Setting(0.0, "0: LeCun normal; the official code's: "
                                                "0.1.", check=NON_NEGATIVE, init_only=True)
    table["model.decoder.bias_init"] = Setting(0.0, "The biases' initial value.",
                                               init_only=True)
  return table


def same_padding(size: int, kernel_size: int, stride: int) -> tuple[int, int]:
  """Zeros before and after an axis of ``size`` for TF's SAME: ``ceil(size / stride)`` outputs,
  the odd zero after."""
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel_size - size, 0)
  return total // 2, total - total // 2


def conv2d(x: jax.Array, kernel: jax.Array, stride: int, impl: str = "auto",
           padding: str = "VALID") -> jax.Array:
  """2-D convolution, ``(batch, h, w, in) * (k, k, in, out)``.

  ``padding``: ``"VALID"`` (the paper's MNIST model) or ``"SAME"`` (TF's rule, zeros added
  around the input first, so every ``impl`` computes the same).

  ``impl``:
    * ``"native"``: one ``lax.conv_general_dilated``.
    * ``"polyphase"``: a strided convolution written as the sum of ``stride**2`` stride-1
      convolutions over the polyphase components of input and kernel. It is the same function
      (exact up to float rounding); XLA:CPU computes its input gradient far faster than the
      strided convolution's, whose input gradient it handles poorly.
    * ``"im2col"``: gather the k*k shifted (strided) views of the input into a patch matrix and
      multiply it with the kernel in one 2-D matmul. It costs a patch tensor k*k times the
      output's size, and on XLA:CPU it was the fastest for both of the paper's convolutions,
      forward and gradients (docs/notes/performance_log.md,
      "On a CPU: measurements and what made the train step fast", has the timings).
    * ``"winograd"`` / ``"winograd4"``: 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) /
      F(4x4, 3x3) (:mod:`capsjax.models.winograd`: 16/36 and 36/144 of the multiplications,
      gradients included); other shapes by im2col.
    * ``"auto"``: im2col on CPU. On a GPU, polyphase for strided convolutions with kernels larger
      than 3x3 and native for the rest: with cuDNN the paper CapsNet's train step ran 1.7-1.9x
      faster with its 9x9 stride-2 PrimaryCapsules written as polyphase, and Efficient-CapsNet's
      0.86x as fast with its 3x3 stride-2 convolution so (an H200, docs/performance.md); kernels
      between those two sizes were not measured. Native on TPUs (not measured). The backend is the
      one programs are built for (:func:`capsjax.common.platform.target`).
  """
  if impl not in CONV_IMPLS:
    raise ValueError(f"conv impl must be one of {CONV_IMPLS}, got {impl!r}.")
  if padding not in PADDINGS:
    raise ValueError(f"conv padding must be one of {PADDINGS}, got {padding!r}.")
  if padding == "SAME":
    x = jnp.pad(x, ((0, 0), same_padding(x.shape[1], kernel.shape[0], stride),
                    same_padding(x.shape[2], kernel.shape[1], stride), (0, 0)))
  if impl == "auto":
    impl = _auto_conv_impl(platform.target(), kernel.shape[:2], stride)
  if impl in ("winograd", "winograd4") and kernel.shape[:2] == (3, 3) and stride == 1:
    return winograd.conv2d_winograd(x, kernel, tile=4 if impl == "winograd4" else 2)
  if impl in ("im2col", "winograd", "winograd4"):
    return _conv_im2col(x, kernel, stride)
  if impl == "native" or stride == 1:
    return _conv_native(x, kernel, stride)
  return _conv_polyphase(x, kernel, stride)


def _auto_conv_impl(backend: str, kernel_size: tuple[int, int], stride: int) -> str:
  """What ``conv2d(impl="auto")`` computes a convolution as on ``backend``: see :func:`conv2d`."""
  if backend == "cpu":
    return "im2col"
  if backend == "gpu" and stride > 1 and max(kernel_size) > 3:
    return "polyphase"
  return "native"


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
  patches = valid_patches(x, kh, kw, stride)  # (batch, out_h, out_w, kh, kw, cin)
  # One 2-D matmul, (batch*out_h*out_w, kh*kw*cin) x (kh*kw*cin, cout): as an einsum over (p, c)
  # XLA:CPU first transposed the patches to (c, p) order.
  y = patches.reshape(-1, kh * kw * cin) @ kernel.reshape(kh * kw * cin, cout)
  return y.reshape(*patches.shape[:3], cout)


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
  """Kernel initialiser: LeCun normal (Flax's default) for ``init_scale == 0``; ``init_scale > 0``
  draws normal(0, init_scale) cut at 2 std, as TF's ``truncated_normal`` in the official code
  (std 0.88 x ``init_scale``)."""
  if init_scale > 0:
    return nnx.initializers.truncated_normal(stddev=init_scale)
  return nnx.initializers.lecun_normal()


class Conv2D(nnx.Module):
  """Convolution (VALID or SAME) with bias, optionally computed in a lower precision; the kernel
  is drawn by :func:`kernel_init` (``init_scale``), the bias starts at ``bias_init``."""

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


# Names that moved to capsjax.models.capsule_layers: removed in 0.2.0, refused naming it.
__getattr__ = public_names.module_getattr(__name__)
