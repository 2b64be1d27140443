"""CapsNet (Sabour, Frosst & Hinton 2017, Fig. 1 and 2), assembled from a config.

Registered as ``config.model.name = "capsnet"``. It owns its objective, the
margin loss (Eq. 4) plus the reconstruction loss (Sec. 4.1), and its metrics
(accuracy and, at evaluation, the routing diagnostics).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from capsjax import layers, losses, metrics, routing
from capsjax.errors import UsageError


@dataclasses.dataclass(frozen=True)
class LossSettings:
  """``config.loss``: Eq. 4's m+, m- and lambda; the weight of the summed squared errors."""
  m_plus: float = 0.9
  m_minus: float = 0.1
  lam: float = 0.5
  reconstruction_weight: float = 0.0005

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict | None) -> "LossSettings":
    if config is None:
      return cls()
    return cls(**{f.name: float(config[f.name]) for f in dataclasses.fields(cls)})


class CapsNetOutput(NamedTuple):
  """What :class:`CapsNet` returns.

  Attributes:
    class_capsules: v_j, ``(batch, num_classes, capsule_dim)``.
    lengths: ``|v_j|``, ``(batch, num_classes)``; in [0, 1) for squashing routers.
    predictions: argmax of ``scores``, ``(batch,)``; with several labels per example, the
      classes of the highest scores, ``(batch, n)``.
    reconstructions: ``(batch, h, w, c)``, or ``(batch, n, h, w, c)`` (one per digit), or
      None without a decoder; masked by the labels in training, by the predictions otherwise.
    diagnostics: the router's per-example, per-iteration measurements ``{name: (batch,
      iterations)}`` if asked for, else None.
    label_reconstructions: with several labels, the reconstructions masked by the labels
      (the training objective's, also at evaluation); else None.
    class_scores: the class probabilities the margin loss and the predictions use: the
      lengths, or the router's parent activations (``model.class_capsules.scores``).
  """
  class_capsules: jax.Array
  lengths: jax.Array
  predictions: jax.Array
  reconstructions: jax.Array | None
  diagnostics: dict | None
  label_reconstructions: jax.Array | None = None
  class_scores: jax.Array | None = None

  @property
  def scores(self) -> jax.Array:
    """Class scores for the loss, evaluators and ensembles."""
    return self.lengths if self.class_scores is None else self.class_scores


SCORES = ("auto", "lengths", "activations")


def validate_model_config(config: ml_collections.ConfigDict) -> None:
  """Raises UsageError (a ValueError) naming the config key for settings that cannot work;
  fills ``config.routing`` with the chosen router's settings (:func:`capsjax.routing.fill`)."""
  router, _ = routing.fill(config.routing)
  scale = config.primary.get("output_scale", 1.0)
  if not isinstance(scale, (int, float)) or not scale > 0:
    raise UsageError(f"config.model.primary.output_scale must be a number > 0 (1: the paper, "
                     f"1/32: the official code), got {scale!r}.")
  check_scores(config, router)
  if config.class_capsules.use_bias and not router.uses_parent_bias:
    raise UsageError(f"config.model.class_capsules.use_bias adds a bias to s_j, which router "
                     f"{router.name!r} does not form; leave it False.")
  layers.check_compute_settings(config)
  h, w, _ = config.image_shape
  padding = config.get("padding", "VALID")
  if padding not in layers.PADDINGS:
    raise UsageError(f"config.model.padding must be one of {layers.PADDINGS}, got {padding!r}.")
  after_conv1 = min(h, w) - config.conv1.kernel_size + 1
  if padding == "VALID" and after_conv1 < config.primary.kernel_size:
    raise UsageError(f"config.model.image_shape {tuple(config.image_shape)} is too small "
                     f"for conv1 kernel {config.conv1.kernel_size} followed by the "
                     f"primary-capsule kernel {config.primary.kernel_size}.")


def check_scores(config: ml_collections.ConfigDict, router: routing.Router) -> None:
  """Raises UsageError for a ``config.class_capsules.scores`` the router cannot give."""
  scores = config.class_capsules.get("scores", "auto")
  if scores not in SCORES:
    raise UsageError(f"config.model.class_capsules.scores must be one of {SCORES}, "
                     f"got {scores!r}.")
  if scores == "activations" and not router.yields_activations:
    raise UsageError(f"config.model.class_capsules.scores='activations' but router "
                     f"{router.name!r} computes no parent activations; use 'lengths' or 'auto'.")


def primary_grid(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """Spatial size of the primary-capsule grid for ``config.image_shape`` (VALID: shrinks by
  each kernel; SAME: ``ceil(size / stride)``, as TF)."""
  same = config.get("padding", "VALID") == "SAME"
  size = []
  for n in config.image_shape[:2]:
    for layer in (config.conv1, config.primary):
      n = -(-n // layer.stride) if same else (n - layer.kernel_size) // layer.stride + 1
    size.append(n)
  return size[0], size[1]


class CapsNet(nnx.Module):
  """Conv1 -> PrimaryCaps -> class capsules (routing) [-> decoder].

  Every size comes from ``config`` (``config.model`` of the configs in
  ``configs/``): image shape, number of classes, capsule types and
  dimensions, so one class serves 28x28 MNIST, 36x36 MultiMNIST and 32x32 RGB.
  """

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs,
               loss: LossSettings | None = None):
    """``config`` is ``config.model``; ``loss`` the settings of :meth:`loss`."""
    validate_model_config(config)
    dtype = layers.COMPUTE_DTYPES[config.compute_dtype]
    padding = config.get("padding", "VALID")  # .get: configs from before the switch.
    channels = config.image_shape[2]
    router, settings = routing.resolve(config.routing)
    self.conv1 = layers.Conv2D(channels, config.conv1.features, config.conv1.kernel_size,
                               config.conv1.stride, impl=config.conv_impl,
                               compute_dtype=dtype, init_scale=config.conv1.init_scale,
                               bias_init=config.conv1.bias_init, padding=padding, rngs=rngs)
    self.primary_capsules = layers.PrimaryCapsules(
        config.conv1.features, config.primary.num_types, config.primary.dim,
        config.primary.kernel_size, config.primary.stride,
        squash_epsilon=settings.get("squash_epsilon", 0.0), impl=config.conv_impl,
        compute_dtype=dtype, init_scale=config.primary.init_scale,
        bias_init=config.primary.bias_init, padding=padding,
        output_scale=config.primary.get("output_scale", 1.0), rngs=rngs)  # .get: old configs.
    grid_h, grid_w = primary_grid(config)
    self.class_capsules = layers.ClassCapsules(
        grid_h * grid_w * config.primary.num_types, config.primary.dim,
        config.num_classes, config.class_capsules.dim,
        init_scale=config.class_capsules.init_scale,
        use_bias=config.class_capsules.use_bias,
        bias_init=config.class_capsules.bias_init,
        routing={"name": router.name, **settings}, rngs=rngs)
    # .get: config.json of workdirs written before the decoder init keys existed.
    self.decoder = nnx.data(layers.Decoder(
        config.num_classes, config.class_capsules.dim, config.decoder.hidden,
        config.image_shape, compute_dtype=dtype,
        init_scale=config.decoder.get("init_scale", 0.0),
        bias_init=config.decoder.get("bias_init", 0.0), rngs=rngs)
        if config.decoder.enabled else None)
    self.set_head(config, router, loss)

  def set_head(self, config: ml_collections.ConfigDict, router: routing.Router,
               loss: LossSettings | None) -> None:
    """What the class scores, the loss and the metrics need (shared with models that reuse
    this head on another backbone)."""
    self.num_classes = config.num_classes
    scores = config.class_capsules.get("scores", "auto")  # .get: configs before the switch.
    self.scores_are_activations = router.yields_activations and scores != "lengths"
    self.measures_saturation = router.squashes and not self.scores_are_activations
    self.loss_settings = loss or LossSettings()

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs) -> "CapsNet":
    """From a whole run config: ``config.model`` and ``config.loss``."""
    return cls(config.model, rngs=rngs, loss=LossSettings.from_config(config.get("loss")))

  validate_config = staticmethod(validate_model_config)

  # What to change when the class capsules saturate (the run's warning names these).
  saturation_settings = ("model.class_capsules.init_scale", "model.primary.output_scale",
                         "optimizer.learning_rate")

  def __call__(self, images: jax.Array, labels: jax.Array | None = None, *,
               train: bool = False, diagnostics: bool = False,
               labels_per_example: int = 1, rng: jax.Array | None = None) -> CapsNetOutput:
    """Classifies and reconstructs.

    Args:
      images: ``(batch, h, w, c)`` floats in [0, 1].
      labels: ``(batch,)`` int class ids, or ``(batch, n)`` for n digits per image;
        required when ``train``.
      train: mask the decoder input by the labels (training, paper Sec. 4.1);
        otherwise by the predicted classes (evaluation).
      diagnostics: also return the router's per-iteration measurements.
      labels_per_example: how many classes to predict (and reconstruct) per image.
      rng: the key of routers that draw in training (``random``).
    """
    primary = self.primary(images, train=train)
    routed = self.class_capsules.route(primary, train=train, rng=rng, diagnostics=diagnostics)
    class_capsules = routed.capsules
    lengths = routing.safe_norm(class_capsules, axis=-1)
    class_scores = routed.activations if self.scores_are_activations else None
    predictions = metrics.predictions(lengths if class_scores is None else class_scores,
                                      labels_per_example)
    reconstructions = label_reconstructions = None
    if self.decoder is not None:
      if train and labels is None:
        raise ValueError("CapsNet(train=True) masks the decoder by the labels: pass labels.")
      reconstructions = self.decode(class_capsules, labels if train else predictions)
      if labels_per_example > 1 and labels is not None:  # Sec. 6: each digit its own target.
        label_reconstructions = (reconstructions if train
                                 else self.decode(class_capsules, labels))
    return CapsNetOutput(class_capsules, lengths, predictions, reconstructions,
                         routed.diagnostics if diagnostics else None, label_reconstructions,
                         class_scores)

  def primary(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    """Conv1 (ReLU) and PrimaryCaps: ``(batch, h, w, c)`` -> ``(batch, in_caps, in_dim)``.
    Models that share CapsNet's head with another backbone override this."""
    del train
    return self.primary_capsules(jax.nn.relu(self.conv1(images)))

  def decode(self, class_capsules: jax.Array, class_ids: jax.Array) -> jax.Array:
    """Decodes given capsule vectors (e.g. perturbed ones, paper Fig. 4), the others masked.

    Args:
      class_capsules: ``(batch, num_classes, capsule_dim)``.
      class_ids: ``(batch,)``, the capsule of each example to decode; or ``(batch, n)``
        to decode n capsules one at a time (MultiMNIST), giving ``(batch, n, h, w, c)``.
    """
    if self.decoder is None:
      raise ValueError("This CapsNet has no decoder (config.model.decoder.enabled=False).")
    if class_ids.ndim == 2:
      return jnp.stack([self.decode(class_capsules, class_ids[:, k])
                        for k in range(class_ids.shape[1])], axis=1)
    return self.decoder(class_capsules, jax.nn.one_hot(class_ids, self.num_classes))

  # --- The task interface (capsjax.models): what the trainer and evaluators call. ---

  def apply(self, batch: dict, *, train: bool, rng: jax.Array | None = None) -> CapsNetOutput:
    """Outputs for a batch; the decoder is masked by the labels in training, by the
    prediction otherwise, and evaluation also measures routing. ``rng`` is used only by
    routers that draw (``random``)."""
    labels = batch["labels"]
    return self(batch["images"], labels if train or labels.ndim == 2 else None, train=train,
                diagnostics=not train, labels_per_example=labels.shape[1] if labels.ndim == 2
                else 1, rng=rng)

  def loss(self, outputs: CapsNetOutput, batch: dict) -> tuple[jax.Array, dict]:
    """Margin loss (Eq. 4) + weight x summed squared reconstruction error, per example.

    With several digits per image (``batch["digit_images"]``, Sec. 6) each digit is
    reconstructed from the capsule of its label and compared with its own image; the sums
    are added."""
    s = self.loss_settings
    margin = losses.margin_loss_per_example(outputs.scores, batch["labels"], m_plus=s.m_plus,
                                            m_minus=s.m_minus, lam=s.lam)
    if "digit_images" in batch:
      reconstructions, targets = outputs.label_reconstructions, batch["digit_images"]
    else:
      reconstructions, targets = outputs.reconstructions, batch["images"]
    if reconstructions is not None and s.reconstruction_weight:
      recon = losses.reconstruction_loss_per_example(reconstructions, targets,
                                                     weight=s.reconstruction_weight)
    else:
      recon = jnp.zeros_like(margin)
    return margin + recon, {"margin_loss": margin, "reconstruction_loss": recon}

  def metrics(self, outputs: CapsNetOutput, batch: dict) -> dict:
    """Per example: ``accuracy`` (0/1; with several labels, the highest scores are exactly
    the labels, and ``at_least_one``); for routers that squash the class capsules, their
    saturation (``class_capsule_length``, ``saturated_fraction``: see
    :func:`capsjax.metrics.capsule_saturation`); and, when measured (evaluation), the router's
    diagnostics under its names (dynamic routing: ``coupling_entropy``, ``coupling_max``,
    ``logit_change``, ``preactivation_norm``), ``(batch, iterations)`` each."""
    result = metrics.label_sets_correct(outputs.scores, batch["labels"])
    if self.measures_saturation:
      result.update(metrics.capsule_saturation(outputs.lengths))
    if outputs.diagnostics:
      result.update(outputs.diagnostics)
    return result
