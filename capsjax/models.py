"""CapsNet (Sabour, Frosst & Hinton 2017, Fig. 1 and 2), assembled from a config."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from capsjax import layers, routing
from capsjax.errors import UsageError

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class CapsNetOutput(NamedTuple):
  """What :class:`CapsNet` returns.

  Attributes:
    class_capsules: v_j, ``(batch, num_classes, capsule_dim)``.
    lengths: ``|v_j|`` in [0, 1), the class probabilities, ``(batch, num_classes)``.
    predictions: argmax of ``lengths``, ``(batch,)``.
    reconstructions: ``(batch, h, w, c)`` or None without a decoder.
    trace: a :class:`capsjax.routing.RoutingTrace` if asked for, else None.
  """
  class_capsules: jax.Array
  lengths: jax.Array
  predictions: jax.Array
  reconstructions: jax.Array | None
  trace: routing.RoutingTrace | None


def validate_model_config(config: ml_collections.ConfigDict) -> None:
  """Raises UsageError (a ValueError) naming the config key for settings that cannot work."""
  r = config.routing
  if not isinstance(r.iterations, int) or r.iterations < 1:
    raise UsageError(f"config.model.routing.iterations must be an integer >= 1, "
                     f"got {r.iterations!r}.")
  if r.softmax_axis not in routing.SOFTMAX_AXES:
    raise UsageError(f"config.model.routing.softmax_axis must be one of "
                     f"{routing.SOFTMAX_AXES}, got {r.softmax_axis!r}.")
  if r.squash_epsilon < 0:
    raise UsageError(f"config.model.routing.squash_epsilon must be >= 0, "
                     f"got {r.squash_epsilon!r}.")
  if config.conv_impl not in layers.CONV_IMPLS:
    raise UsageError(f"config.model.conv_impl must be one of {layers.CONV_IMPLS}, "
                     f"got {config.conv_impl!r}.")
  if config.compute_dtype not in COMPUTE_DTYPES:
    raise UsageError(f"config.model.compute_dtype must be one of "
                     f"{tuple(COMPUTE_DTYPES)}, got {config.compute_dtype!r}.")
  h, w, _ = config.image_shape
  after_conv1 = min(h, w) - config.conv1.kernel_size + 1
  if after_conv1 < config.primary.kernel_size:
    raise UsageError(f"config.model.image_shape {tuple(config.image_shape)} is too small "
                     f"for conv1 kernel {config.conv1.kernel_size} followed by the "
                     f"primary-capsule kernel {config.primary.kernel_size}.")


def primary_grid(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """Spatial size of the primary-capsule grid for ``config.image_shape``."""
  size = []
  for n in config.image_shape[:2]:
    n = (n - config.conv1.kernel_size) // config.conv1.stride + 1
    n = (n - config.primary.kernel_size) // config.primary.stride + 1
    size.append(n)
  return size[0], size[1]


class CapsNet(nnx.Module):
  """Conv1 -> PrimaryCaps -> class capsules (routing) [-> decoder].

  Every size comes from ``config`` (``config.model`` of the configs in
  ``configs/``): image shape, number of classes, capsule types and
  dimensions, so one class serves 28x28 MNIST, 36x36 MultiMNIST and 32x32 RGB.
  """

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    validate_model_config(config)
    dtype = COMPUTE_DTYPES[config.compute_dtype]
    channels = config.image_shape[2]
    self.conv1 = layers.Conv2D(channels, config.conv1.features, config.conv1.kernel_size,
                               config.conv1.stride, impl=config.conv_impl,
                               compute_dtype=dtype, init_scale=config.conv1.init_scale,
                               bias_init=config.conv1.bias_init, rngs=rngs)
    self.primary_capsules = layers.PrimaryCapsules(
        config.conv1.features, config.primary.num_types, config.primary.dim,
        config.primary.kernel_size, config.primary.stride,
        squash_epsilon=config.routing.squash_epsilon, impl=config.conv_impl,
        compute_dtype=dtype, init_scale=config.primary.init_scale,
        bias_init=config.primary.bias_init, rngs=rngs)
    grid_h, grid_w = primary_grid(config)
    r = config.routing
    self.class_capsules = layers.ClassCapsules(
        grid_h * grid_w * config.primary.num_types, config.primary.dim,
        config.num_classes, config.class_capsules.dim,
        init_scale=config.class_capsules.init_scale,
        use_bias=config.class_capsules.use_bias,
        bias_init=config.class_capsules.bias_init,
        routing_iterations=r.iterations, softmax_axis=r.softmax_axis,
        stop_gradient=r.stop_gradient, leaky=r.leaky,
        squash_epsilon=r.squash_epsilon, rngs=rngs)
    # .get: config.json of workdirs written before the decoder init keys existed.
    self.decoder = nnx.data(layers.Decoder(
        config.num_classes, config.class_capsules.dim, config.decoder.hidden,
        config.image_shape, compute_dtype=dtype,
        init_scale=config.decoder.get("init_scale", 0.0),
        bias_init=config.decoder.get("bias_init", 0.0), rngs=rngs)
        if config.decoder.enabled else None)
    self.num_classes = config.num_classes

  def __call__(self, images: jax.Array, labels: jax.Array | None = None, *,
               train: bool = False, return_trace: bool = False) -> CapsNetOutput:
    """Classifies and reconstructs.

    Args:
      images: ``(batch, h, w, c)`` floats in [0, 1].
      labels: ``(batch,)`` int class ids; required when ``train``.
      train: mask the decoder input by the labels (training, paper Sec. 4.1);
        otherwise by the predicted class (evaluation).
      return_trace: also return the routing trace.
    """
    features = jax.nn.relu(self.conv1(images))
    primary = self.primary_capsules(features)
    result = self.class_capsules(primary, return_trace=return_trace)
    class_capsules, trace = result if return_trace else (result, None)
    lengths = routing.safe_norm(class_capsules, axis=-1)
    predictions = jnp.argmax(lengths, axis=-1)
    reconstructions = None
    if self.decoder is not None:
      if train:
        if labels is None:
          raise ValueError("CapsNet(train=True) masks the decoder by the labels: pass labels.")
        mask_ids = labels
      else:
        mask_ids = predictions
      reconstructions = self.decoder(class_capsules, jax.nn.one_hot(mask_ids, self.num_classes))
    return CapsNetOutput(class_capsules, lengths, predictions, reconstructions, trace)

  def decode(self, class_capsules: jax.Array, class_ids: jax.Array) -> jax.Array:
    """Decodes given capsule vectors (e.g. perturbed ones, paper Fig. 4).

    Args:
      class_capsules: ``(batch, num_classes, capsule_dim)``.
      class_ids: ``(batch,)``, the capsule of each example to decode.
    """
    if self.decoder is None:
      raise ValueError("This CapsNet has no decoder (config.model.decoder.enabled=False).")
    return self.decoder(class_capsules, jax.nn.one_hot(class_ids, self.num_classes))


def count_params(model: nnx.Module) -> int:
  """Number of trainable scalars in ``model``."""
  params = nnx.state(model, nnx.Param)
  return sum(x.size for x in jax.tree.leaves(params))
