"""Depthwise convolutions (one ``k x k`` filter per channel), as Efficient-CapsNet's primary
capsules compute them, in three forms that give the same numbers. Public as
:func:`capsjax.models.layers.depthwise_conv2d`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from capsjax.common import platform

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
      elsewhere (not measured on accelerators; the backend is
      :func:`capsjax.common.platform.target`'s).
  Every impl is the same function (float32 rounding apart; tests/test_layers.py).
  """
  if impl not in DEPTHWISE_IMPLS:
    raise ValueError(f"depthwise conv impl must be one of {DEPTHWISE_IMPLS}, got {impl!r}.")
  kh, kw = kernel.shape[:2]
  covers = (kh, kw) == tuple(x.shape[1:3])
  if impl == "auto":
    impl = ("window_sum" if covers else "shifted" if platform.target() == "cpu" else "native")
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
