"""Efficient-CapsNet (Mazzia, Salvetti & Chiaberge 2021, arXiv 2101.12491), registered as
``config.model.name = "efficient_capsnet"``, as the authors' code has it (EscVM/Efficient-CapsNet,
``models/efficient_capsnet_graph_mnist.py`` and ``utils/layers.py``)::

    4 x [VALID conv (32@5x5, 64@3x3, 64@3x3, 128@3x3 stride 2), He normal -> ReLU -> BatchNorm]
    primary capsules: 9x9 depthwise conv over the 128 channels (one filter each, with bias),
                      reshaped to 16 capsules of 8D, squashed (1 - e^{-|s|}) s/|s|
    class capsules:   10 x 16D by self-attention routing (W He normal, bias after the softmax)
    decoder:          masked class capsules -> 512 ReLU -> 1024 ReLU -> 784 sigmoid
    loss:             margin loss (0.9, 0.1, 0.5) + 0.392 x mean squared pixel error

The class capsules, the decoder, the loss and the metrics are CapsNet's capsule head
(:mod:`capsjax.models.capsnet`); only the backbone (:meth:`EfficientCapsNet.primary`) differs, so
every router also runs on it. 161,824 trainable parameters in the capsule network and 1,411,344
in the decoder at 28x28x1 (the paper's 161K counts the former).

Where we differ from the reference code, and why:

* Keras' BatchNorm updates its moving variance with the unbiased (n / (n - 1)) batch variance
  (fused kernel); Flax's with the biased one. Momentum 0.99 and epsilon 1e-3 are Keras'.
* The class scores are ``|v_j|`` by :func:`capsjax.routing.safe_norm` (the reference's ``Length``
  adds 1e-7 under the square root); :func:`capsjax.routing.exp_squash` omits its 1e-20 fuzz.
* Images are scaled by 1/255 (every capsjax dataset) where the reference divides by 256.
* The mean squared error is written as 0.0005 x the sum over 784 pixels (= 0.392 x the mean), so
  ``config.loss`` means the same for both models.

We follow the code; the paper's full text was not at hand here, so differences between its text
and the code are not listed. The order of ReLU and BatchNorm, which re-implementations swap, is
``config.model.batch_norm.position`` (the code's ``"after_relu"`` by default).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from capsjax import routing
from capsjax.common.errors import UsageError
from capsjax.config.settings import POSITIVE, Setting, at_least, between, each, one_of
from capsjax.models import SHAPE_SETTINGS, capsule_layers, depthwise, head_settings, layers
from capsjax.models.capsnet import CapsuleModel
from capsjax.models.head_settings import LossSettings

POSITIONS = ("after_relu", "before_relu")

_SIZES = dict(kind=tuple, check=each(at_least(1)))
# ``config.model`` of Efficient-CapsNet (configs/efficient_capsnet.py has the reference's).
SETTINGS = {
    **SHAPE_SETTINGS,
    "model.convs.features": Setting(meaning="Channels of each convolution.", **_SIZES),
    "model.convs.kernel_sizes": Setting(meaning="Their kernel sides.", **_SIZES),
    "model.convs.strides": Setting(meaning="Their strides.", **_SIZES),
    "model.batch_norm.momentum": Setting(kind=float, meaning="Keras' BatchNormalization "
                                         "momentum (0.99).", check=between(0, 1, open_high=True)),
    "model.batch_norm.epsilon": Setting(kind=float, meaning="Its epsilon (Keras: 1e-3).",
                                        check=POSITIVE),
    "model.batch_norm.position": Setting(kind=str, meaning="\"after_relu\" (the reference) | "
                                         "\"before_relu\".", check=one_of(*POSITIONS)),
    "model.primary.kernel_size": Setting(kind=int, meaning="The depthwise primary capsules' "
                                         "kernel.", check=POSITIVE),
    "model.primary.dim": Setting(kind=int, meaning="Primary capsules' dimension.", check=POSITIVE),
    "model.class_capsules.dim": Setting(kind=int, meaning="Class capsules' dimension.",
                                        check=POSITIVE),
    "model.class_capsules.init": Setting(kind=str | float, meaning="\"he_normal\" (the "
                                         "reference), or a truncated normal's std > 0.",
                                         init_only=True),
    "model.class_capsules.scores": head_settings.SCORES_SETTING,
    **layers.decoder_settings(init=False),
    "model.conv_impl": layers.CONV_IMPL,
    "model.compute_dtype": layers.COMPUTE_DTYPE,
    **head_settings.LOSS_SETTINGS,
}


def he_normal() -> nnx.Initializer:
  """Keras' ``he_normal``: truncated normal, std sqrt(2 / fan_in) (HWIO or (in, out) kernels)."""
  return nnx.initializers.variance_scaling(2.0, "fan_in", "truncated_normal")


def class_capsule_init(init) -> nnx.Initializer:
  """W_ij of shape ``(in_caps, out_caps, out_dim, in_dim)``: ``"he_normal"`` as Keras draws
  the reference's ``(out_caps, in_caps, in_dim, out_dim)`` W (fan_in = in_caps x out_caps x
  in_dim), or a number: a truncated normal of that std (CapsNet's ``init_scale``)."""
  if init == "he_normal":
    return nnx.initializers.variance_scaling(2.0, "fan_in", "truncated_normal",
                                             in_axis=(0, 1, 3), out_axis=2)
  return nnx.initializers.truncated_normal(stddev=float(init))


def backbone_grid(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """Spatial size after the VALID convolutions of ``config.convs``."""
  size = list(config.image_shape[:2])
  for k, s in zip(config.convs.kernel_sizes, config.convs.strides):
    size = [(n - k) // s + 1 for n in size]
  return size[0], size[1]


def validate_config(config: ml_collections.ConfigDict,
                    router: routing.Router | None = None) -> None:
  """Raises UsageError naming the ``config.model`` key that cannot work (reads ``config.model``;
  ``router``: :func:`capsjax.routing.chosen`'s)."""
  router, _ = routing.chosen(config.routing, router)
  convs = config.convs
  lengths = {len(tuple(convs[k])) for k in ("features", "kernel_sizes", "strides")}
  if len(lengths) != 1 or not tuple(convs.features):
    raise UsageError(f"config.model.convs.features, kernel_sizes and strides must be tuples of "
                     f"one equal length >= 1, got {tuple(convs.features)}, "
                     f"{tuple(convs.kernel_sizes)}, {tuple(convs.strides)}.")
  for key in ("features", "kernel_sizes", "strides"):
    if any(not isinstance(v, int) for v in convs[key]):
      raise UsageError(f"config.model.convs.{key} must hold integers >= 1, "
                       f"got {tuple(convs[key])}.")
  grid = backbone_grid(config)
  if min(grid) < config.primary.kernel_size:
    raise UsageError(f"config.model.image_shape {tuple(config.image_shape)} leaves a "
                     f"{grid[0]}x{grid[1]} grid after config.model.convs, smaller than "
                     f"config.model.primary.kernel_size={config.primary.kernel_size}.")
  if convs.features[-1] % config.primary.dim:
    raise UsageError(f"config.model.primary.dim={config.primary.dim} must divide the last "
                     f"convolution's {convs.features[-1]} channels (they become capsules).")
  init = config.class_capsules.init
  if init != "he_normal" and not (isinstance(init, (int, float)) and init > 0):
    raise UsageError(f"config.model.class_capsules.init must be 'he_normal' (the reference) or "
                     f"a std > 0, got {init!r}.")
  head_settings.check_scores(config, router)


class DepthwisePrimaryCapsules(nnx.Module):
  """Efficient-CapsNet's primary capsules: a depthwise convolution (one ``k x k`` filter per
  channel, with bias; Keras' default Glorot uniform), its channels grouped into capsules of
  ``dim`` and squashed by :func:`capsjax.routing.exp_squash`."""

  def __init__(self, channels: int, kernel_size: int, dim: int, *, impl: str = "auto",
               rngs: nnx.Rngs):
    """``impl``: :func:`capsjax.models.layers.depthwise_conv2d`'s."""
    self.kernel = nnx.Param(nnx.initializers.glorot_uniform()(
        rngs.params(), (kernel_size, kernel_size, 1, channels)))
    self.bias = nnx.Param(jnp.zeros((channels,), jnp.float32))
    self.dim, self.impl = dim, impl

  def __call__(self, features: jax.Array) -> capsule_layers.Capsules:
    """``(batch, h, w, channels)`` -> vector capsules, poses ``(batch, h' * w' * channels /
    dim, dim)`` and their lengths."""
    x = depthwise.depthwise_conv2d(features, self.kernel[...], self.impl) + self.bias[...]
    return capsule_layers.vector_capsules(routing.exp_squash(x.reshape(x.shape[0], -1, self.dim)))


class EfficientCapsNet(CapsuleModel):
  """Convolutions with BatchNorm -> depthwise primary capsules -> class capsules [-> decoder];
  the BatchNorm statistics are model state (``nnx.BatchStat``, :mod:`capsjax.models`)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs,
               loss: LossSettings | None = None, router: routing.Router | None = None):
    """``config`` is ``config.model`` (``configs/efficient_capsnet.py``); ``router`` the one
    resolving the run's config chose (:func:`capsjax.routing.chosen_router`)."""
    validate_config(config, router)
    dtype = layers.COMPUTE_DTYPES[config.compute_dtype]
    router, settings = routing.chosen(config.routing, router)
    convs, bn = config.convs, config.batch_norm
    channels = [config.image_shape[2], *convs.features]
    self.convs = nnx.List([
        layers.Conv2D(a, b, k, s, impl=config.conv_impl, compute_dtype=dtype,
                      initializer=he_normal(), rngs=rngs)
        for a, b, k, s in zip(channels, channels[1:], convs.kernel_sizes, convs.strides)])
    self.norms = nnx.List([nnx.BatchNorm(b, momentum=bn.momentum, epsilon=bn.epsilon, rngs=rngs)
                           for b in channels[1:]])
    self.norm_after_relu = bn.position == "after_relu"
    self.primary_capsules = DepthwisePrimaryCapsules(
        channels[-1], config.primary.kernel_size, config.primary.dim,
        impl="native" if config.conv_impl == "native" else "auto", rngs=rngs)
    k = config.primary.kernel_size
    grid_h, grid_w = (n - k + 1 for n in backbone_grid(config))
    self.class_capsules = capsule_layers.ClassCapsules(
        grid_h * grid_w * channels[-1] // config.primary.dim, config.primary.dim,
        config.num_classes, config.class_capsules.dim,
        initializer=class_capsule_init(config.class_capsules.init),
        routing=(router, settings), rngs=rngs)
    self.decoder = nnx.data(layers.Decoder(
        config.num_classes, config.class_capsules.dim, config.decoder.hidden,
        config.image_shape, compute_dtype=dtype,
        initializers=[he_normal()] * len(config.decoder.hidden)
        + [nnx.initializers.glorot_normal()], rngs=rngs)
        if config.decoder.enabled else None)
    self.init_head(config, router, loss)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs) -> "EfficientCapsNet":
    return cls(config.model, rngs=rngs, loss=LossSettings.from_config(config.get("loss")),
               router=routing.chosen_router(config))

  validate_config = staticmethod(validate_config)
  SETTINGS = SETTINGS
  RULES = head_settings.LOSS_RULES
  router_sections = ("model.routing",)

  saturation_settings = ("model.class_capsules.init", "optimizer.learning_rate")

  def primary(self, images: jax.Array, *, train: bool = False) -> capsule_layers.Capsules:
    """The backbone: ``(batch, h, w, c)`` -> primary capsules ``(batch, 16, 8)``; BatchNorm uses
    the batch's statistics (and updates its running ones) when ``train``."""
    x = images
    for conv, norm in zip(self.convs, self.norms):
      x = conv(x)
      if self.norm_after_relu:  # Reference: Conv2D(activation="relu") -> BatchNormalization.
        x = norm(jax.nn.relu(x), use_running_average=not train)
      else:
        x = jax.nn.relu(norm(x, use_running_average=not train))
    return self.primary_capsules(x)


MODEL = EfficientCapsNet
