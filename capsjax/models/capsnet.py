"""CapsNet (Sabour, Frosst & Hinton 2017, Fig. 1 and 2), assembled from a config.

Registered as ``config.model.name = "capsnet"``: the backbone Conv1 -> PrimaryCaps composed
with the capsule head (:mod:`capsjax.models.capsule_head`: class capsules, decoder, the margin
loss (Eq. 4) plus the reconstruction loss (Sec. 4.1), accuracy and, at evaluation, the routing
diagnostics).
"""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from capsjax import routing
from capsjax.common.errors import UsageError
from capsjax.config.settings import NON_NEGATIVE, POSITIVE, Setting
from capsjax.models import SHAPE_SETTINGS, capsule_head, capsule_layers, layers
from capsjax.models.capsule_head import LossSettings, check_scores  # noqa: F401 (re-exported)
from capsjax.routing.core import SQUASH_EPSILON

_INT = dict(kind=int, check=POSITIVE)
# ``config.model`` of CapsNet (Fig. 1, Sec. 4): every config sets the layers' sizes and inits
# (configs/mnist.py has the paper's); the switches left out take these defaults.
SETTINGS = {
    **SHAPE_SETTINGS,
    **layers.conv_settings("model.conv1", "Conv1"),
    "model.primary.num_types": Setting(meaning="PrimaryCaps types (paper: 32).", **_INT),
    "model.primary.dim": Setting(meaning="PrimaryCaps dimension (paper: 8).", **_INT),
    "model.primary.kernel_size": Setting(meaning="PrimaryCaps kernel side (paper: 9).", **_INT),
    "model.primary.stride": Setting(meaning="PrimaryCaps stride (paper: 2).", **_INT),
    "model.primary.init_scale": Setting(kind=float, meaning=layers.INIT_SCALE,
                                        check=NON_NEGATIVE, init_only=True),
    "model.primary.bias_init": Setting(kind=float, meaning="PrimaryCaps' biases' initial "
                                       "value.", init_only=True),
    "model.primary.output_scale": Setting(1.0, "The convolution times this before the squash: "
                                          "1 in the paper, the official code's 1/32 (its "
                                          "softmax(0) over the 32 types).", check=POSITIVE),
    "model.class_capsules.dim": Setting(meaning="Class capsules' dimension (paper: 16).",
                                        **_INT),
    "model.class_capsules.init_scale": Setting(kind=float, meaning="W_ij ~ normal(0, s) cut at "
                                               "2 std (the official code's 0.1).",
                                               check=NON_NEGATIVE, init_only=True),
    "model.class_capsules.use_bias": Setting(None, "A bias on s_j (the official code: yes; the "
                                             "paper: no); unset: wherever the router forms s_j.",
                                             kind=bool | None),
    "model.class_capsules.bias_init": Setting(kind=float, meaning="That bias's initial value.",
                                              init_only=True),
    "model.class_capsules.scores": capsule_head.SCORES_SETTING,
    **layers.decoder_settings(),
    "model.padding": layers.PADDING,
    "model.conv_impl": layers.CONV_IMPL,
    "model.compute_dtype": layers.COMPUTE_DTYPE,
    **capsule_head.LOSS_SETTINGS,
}


def class_bias(config: ml_collections.ConfigDict, router) -> bool:
  """Whether the class capsules add a bias to s_j: ``config.class_capsules.use_bias``, or
  unset (None; the default of configs/mnist.py, as the official code) wherever ``router``
  forms s_j."""
  use_bias = config.class_capsules.use_bias
  return bool(router.uses_parent_bias if use_bias is None else use_bias)


def validate_model_config(config: ml_collections.ConfigDict) -> None:
  """Raises UsageError (a ValueError) naming the config key for settings that cannot work.
  Reads ``config`` (``config.model``) only."""
  router, _ = routing.chosen(config.routing)
  check_scores(config, router)
  if class_bias(config, router) and not router.uses_parent_bias:
    raise UsageError(f"config.model.class_capsules.use_bias adds a bias to s_j, which router "
                     f"{router.name!r} does not form; leave it False.")
  h, w, _ = config.image_shape
  after_conv1 = min(h, w) - config.conv1.kernel_size + 1
  if config.padding == "VALID" and after_conv1 < config.primary.kernel_size:
    raise UsageError(f"config.model.image_shape {tuple(config.image_shape)} is too small "
                     f"for conv1 kernel {config.conv1.kernel_size} followed by the "
                     f"primary-capsule kernel {config.primary.kernel_size}.")


def primary_grid(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """Spatial size of the primary-capsule grid for ``config.image_shape`` (VALID: shrinks by
  each kernel; SAME: ``ceil(size / stride)``, as TF)."""
  same = config.padding == "SAME"
  size = []
  for n in config.image_shape[:2]:
    for layer in (config.conv1, config.primary):
      n = -(-n // layer.stride) if same else (n - layer.kernel_size) // layer.stride + 1
    size.append(n)
  return size[0], size[1]


class CapsNet(capsule_head.CapsuleModel):
  """Conv1 -> PrimaryCaps -> class capsules (routing) [-> decoder].

  Every size comes from ``config`` (``config.model`` of the configs in
  ``configs/``): image shape, number of classes, capsule types and
  dimensions, so one class serves 28x28 MNIST, 36x36 MultiMNIST and 32x32 RGB.
  """

  SETTINGS = SETTINGS
  RULES = capsule_head.LOSS_RULES
  router_sections = ("model.routing",)

  @staticmethod
  def resolve_config(config: ml_collections.ConfigDict) -> None:
    """``class_capsules.use_bias`` as it is in effect where left unset (:func:`class_bias`)."""
    if config.class_capsules.use_bias is None:
      config.class_capsules.use_bias = class_bias(config, routing.get(config.routing.name))

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs,
               loss: LossSettings | None = None):
    """``config`` is ``config.model``; ``loss`` the settings of :meth:`loss`."""
    validate_model_config(config)
    dtype = layers.COMPUTE_DTYPES[config.compute_dtype]
    padding = config.padding
    channels = config.image_shape[2]
    router, settings = routing.chosen(config.routing)
    # The primary capsules squash with the router's epsilon, or Eq. 1's where it has none.
    squash_epsilon = (settings["squash_epsilon"] if "squash_epsilon" in settings
                      else SQUASH_EPSILON.default)
    self.conv1 = layers.Conv2D(channels, config.conv1.features, config.conv1.kernel_size,
                               config.conv1.stride, impl=config.conv_impl,
                               compute_dtype=dtype, init_scale=config.conv1.init_scale,
                               bias_init=config.conv1.bias_init, padding=padding, rngs=rngs)
    self.primary_capsules = capsule_layers.PrimaryCapsules(
        config.conv1.features, config.primary.num_types, config.primary.dim,
        config.primary.kernel_size, config.primary.stride,
        squash_epsilon=squash_epsilon, impl=config.conv_impl,
        compute_dtype=dtype, init_scale=config.primary.init_scale,
        bias_init=config.primary.bias_init, padding=padding,
        output_scale=config.primary.output_scale,
        rngs=rngs)
    grid_h, grid_w = primary_grid(config)
    self.class_capsules = capsule_layers.ClassCapsules(
        grid_h * grid_w * config.primary.num_types, config.primary.dim,
        config.num_classes, config.class_capsules.dim,
        init_scale=config.class_capsules.init_scale,
        use_bias=class_bias(config, router),
        bias_init=config.class_capsules.bias_init,
        routing={"name": router.name, **settings}, rngs=rngs)
    self.decoder = nnx.data(layers.Decoder(
        config.num_classes, config.class_capsules.dim, config.decoder.hidden,
        config.image_shape, compute_dtype=dtype, init_scale=config.decoder.init_scale,
        bias_init=config.decoder.bias_init, rngs=rngs)
        if config.decoder.enabled else None)
    self.head = capsule_head.CapsuleHead.from_config(config, router, loss)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs) -> "CapsNet":
    """From a whole run config: ``config.model`` and ``config.loss``."""
    return cls(config.model, rngs=rngs, loss=LossSettings.from_config(config.get("loss")))

  validate_config = staticmethod(validate_model_config)

  # What to change when the class capsules saturate (the run's warning names these).
  saturation_settings = ("model.class_capsules.init_scale", "model.primary.output_scale",
                         "optimizer.learning_rate")

  def primary(self, images: jax.Array, *, train: bool = False) -> capsule_layers.Capsules:
    """The backbone, Conv1 (ReLU) and PrimaryCaps: ``(batch, h, w, c)`` -> primary capsules
    (poses ``(batch, in_caps, in_dim)`` and their lengths)."""
    del train
    return self.primary_capsules(jax.nn.relu(self.conv1(images)))


# Registered (capsjax/config/registries.py): this module's name in the config.
MODEL = CapsNet
