"""CapsNet (Sabour, Frosst & Hinton 2017, Fig. 1 and 2), assembled from a config, and its
head, which the other capsule models share.

Registered as ``config.model.name = "capsnet"``. :meth:`CapsNet.__call__` is the paper's
model in its order: Conv1 -> PrimaryCaps (Eq. 1) -> class capsules (the votes of Eq. 2 routed
by Procedure 1: :mod:`capsjax.routing.dynamic`) -> lengths and the masked decoder (Fig. 2,
:meth:`CapsuleModel.classify`). The loss (:func:`capsule_loss`) is Eq. 4's margin loss plus
0.0005 x the summed squared reconstruction error (Sec. 4.1).

:class:`CapsuleModel` is that head as the model interface of :mod:`capsjax.models`. A capsule model
built on it (CapsNet, :class:`capsjax.models.efficient_capsnet.EfficientCapsNet`, or a researcher's)
sets ``class_capsules`` (:class:`capsjax.models.capsule_layers.ClassCapsules`) and ``decoder``
(:class:`capsjax.models.layers.Decoder`, or ``nnx.data(None)``), calls
:meth:`CapsuleModel.init_head` and defines ``primary(images, *, train)`` (its backbone); parameter
trees and checkpoints have the layout ``class_capsules/...``, ``decoder/...``. The head's settings
(``config.loss``, ``model.class_capsules.scores``): :mod:`capsjax.models.head_settings`. The file
reads: the head, CapsNet, then the loss and the metrics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from capsjax import routing
from capsjax.common.errors import UsageError
from capsjax.config.settings import NON_NEGATIVE, POSITIVE, Setting
from capsjax.models import SHAPE_SETTINGS, capsule_layers, head_settings, layers
from capsjax.models.capsule_layers import Capsules, ClassCapsules
from capsjax.models.head_settings import LossSettings
from capsjax.models.layers import Decoder
from capsjax.models.outputs import Outputs
from capsjax.models.saturation_watch import SATURATED_LENGTH, SaturationWatch
from capsjax.routing.router import SQUASH_EPSILON


class CapsuleModel(nnx.Module):
  """A backbone (``primary``) composed with the capsule head: the model interface of
  :mod:`capsjax.models`. Subclasses may set ``saturation_settings`` (the config keys the
  saturation warning names) and ``init_only_settings`` (keys used only to draw the initial
  parameters: a vectorised sweep's runs may differ in them)."""

  class_capsules: ClassCapsules
  decoder: Decoder | None
  saturation_settings: tuple[str, ...] = ()
  per_run_numbers: type = LossSettings  # What a vectorised run hands to the loss.
  init_only_settings: tuple[str, ...] = ()

  def init_head(self, config: ml_collections.ConfigDict, router: routing.Router,
                loss: LossSettings | None = None) -> None:
    """The head's settings, static: from ``config.model`` and the class capsules' router.
    The class scores are the router's parent activations where it computes them (and
    ``class_capsules.scores`` is not ``"lengths"``), else the lengths |v_j|; saturation is
    measured where the router squashes and the lengths score."""
    self.num_classes = config.num_classes
    self.scores_are_activations = (router.yields_activations
                                   and config.class_capsules.scores != "lengths")
    self.measures_saturation = router.squashes and not self.scores_are_activations
    self.loss_settings = loss or LossSettings()

  def primary(self, images: jax.Array, *, train: bool = False) -> Capsules:
    """The backbone: ``(batch, h, w, c)`` images -> primary capsules."""
    raise NotImplementedError(f"{type(self).__name__} must define primary(images, *, train).")

  def __call__(self, images: jax.Array, labels: jax.Array | None = None, *,
               train: bool = False, diagnostics: bool = False, labels_per_example: int = 1,
               rng: jax.Array | None = None) -> Outputs:
    """The primary capsules routed to the class capsules, then :meth:`classify`."""
    routed = self.class_capsules.route(self.primary(images, train=train), train=train,
                                       rng=rng, diagnostics=diagnostics)
    return self.classify(routed, labels, train=train, diagnostics=diagnostics,
                         labels_per_example=labels_per_example)

  def classify(self, routed: routing.RoutingResult, labels: jax.Array | None = None, *,
               train: bool = False, diagnostics: bool = False,
               labels_per_example: int = 1) -> Outputs:
    """Routed class capsules -> scores, ``labels_per_example`` predictions and the
    reconstruction: the decoder sees the capsule of the label in training (``labels``
    ``(batch,)`` or ``(batch, n)``, required then) and of the prediction otherwise (Sec. 4.1);
    with several labels each is also reconstructed from its own capsule (Sec. 6)."""
    class_capsules = routed.capsules
    lengths = routing.safe_norm(class_capsules, axis=-1)  # |v_j|
    scores = routed.activations if self.scores_are_activations else lengths
    predicted = predictions(scores, labels_per_example)
    reconstructions = label_reconstructions = None
    if self.decoder is not None:
      if train and labels is None:
        raise ValueError("A capsule model (train=True) masks the decoder by the labels: pass "
                         "labels.")
      reconstructions = self.decode(class_capsules, labels if train else predicted)
      if labels_per_example > 1 and labels is not None:
        label_reconstructions = (reconstructions if train
                                 else self.decode(class_capsules, labels))
    return Outputs(scores=scores, predictions=predicted,
                   log_probabilities=jax.nn.log_softmax(scores),
                   score_kind="activations" if self.scores_are_activations else "lengths",
                   class_capsules=class_capsules, lengths=lengths, reconstructions=reconstructions,
                   label_reconstructions=label_reconstructions,
                   diagnostics=routed.diagnostics if diagnostics else None)

  def apply(self, batch: dict, *, train: bool, rng: jax.Array | None = None) -> Outputs:
    """Outputs for a batch (labels mask the decoder in training, and with several labels per
    image); evaluation also measures the routing. ``rng``: routers that draw (``random``)."""
    labels = batch["labels"]
    several = labels.ndim == 2
    return self(batch["images"], labels if train or several else None, train=train,
                diagnostics=not train, labels_per_example=labels.shape[1] if several else 1,
                rng=rng)

  def decode(self, class_capsules: jax.Array, class_ids: jax.Array) -> jax.Array:
    """Decodes the capsule ``class_ids`` ``(batch,)`` of each example, the others masked
    (also perturbed ones, Fig. 4); ``(batch, n)`` ids decode n capsules one at a time
    (MultiMNIST), giving ``(batch, n, h, w, c)``."""
    if self.decoder is None:
      raise ValueError("This model has no decoder (config.model.decoder.enabled=False).")
    if class_ids.ndim == 2:
      return jnp.stack([self.decode(class_capsules, class_ids[:, k])
                        for k in range(class_ids.shape[1])], axis=1)
    return self.decoder(class_capsules, jax.nn.one_hot(class_ids, self.num_classes))

  def vote_scores(self, batch: dict) -> jax.Array:
    """The class scores the vote attack differentiates (Gu, Wu & Tresp, ICLR 2021, Sec. 4;
    their ``Vote_Attack``): ``|squash(mean_i u_hat_{j|i})|``, every child's votes averaged
    with equal weights, no routing, no bias, Eq. 1's squash whatever the router; in
    evaluation mode, ``(batch, num_classes)``."""
    votes = self.class_capsules.votes(self.primary(batch["images"], train=False).poses)
    return routing.safe_norm(routing.squash(jnp.mean(votes, axis=1)), axis=-1)

  def loss(self, outputs: Outputs, batch: dict, *, step: jax.Array | None = None,
           numbers: LossSettings | None = None) -> tuple[jax.Array, dict]:
    """The margin and reconstruction losses (:func:`capsule_loss`); ``step`` is unused (no
    schedule); ``numbers``: one run's :class:`LossSettings` in a vectorised sweep."""
    del step
    return capsule_loss(outputs, batch, self.loss_settings if numbers is None else numbers,
                        traced=numbers is not None)

  def metrics(self, outputs: Outputs, batch: dict) -> dict:
    """Per example: ``accuracy`` (:func:`label_sets_correct`); the class capsules'
    saturation where measured (:func:`capsule_saturation`); in evaluation the router's
    diagnostics under its names, ``(batch, iterations)`` each."""
    result = label_sets_correct(outputs.scores, batch["labels"])
    if self.measures_saturation:
      result.update(capsule_saturation(outputs.lengths))
    if outputs.diagnostics:
      result.update(outputs.diagnostics)
    return result

  def capabilities(self) -> frozenset[str]:
    """``reconstruction`` (with a decoder), ``routing_diagnostics``, ``saturation`` (where
    measured) and ``votes`` (:meth:`vote_scores`)."""
    found = {"routing_diagnostics", "votes"}
    if self.decoder is not None:
      found.add("reconstruction")
    if self.measures_saturation:
      found.add("saturation")
    return frozenset(found)

  def monitors(self, config: ml_collections.ConfigDict, chance: float) -> list:
    """The saturation warning (``config.train.saturation_warning``) where saturation is
    measured, naming :attr:`saturation_settings`."""
    if not self.measures_saturation:
      return []
    warning = config.train.saturation_warning
    return [SaturationWatch(fraction=warning.fraction, steps=warning.steps,
                            settings=self.saturation_settings, chance=chance)]

  @staticmethod
  def draw_figures(model, batch: dict, workdir: str, writer, step: int) -> None:
    """Reconstructions and paper Fig. 4 of a test batch, or with two labels per image Fig. 5
    (``model`` is a :class:`capsjax.training.run_figures.JittedModel`)."""
    from capsjax.models import capsule_figures  # matplotlib, only when figures are drawn.

    if "reconstruction" not in model.capabilities:
      return
    if batch["labels"].ndim == 2:
      capsule_figures.draw_pair_reconstructions(workdir, model, batch, writer, step)
    else:
      capsule_figures.draw_reconstructions(workdir, model, batch, writer, step)


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
    "model.class_capsules.scores": head_settings.SCORES_SETTING,
    **layers.decoder_settings(),
    "model.padding": layers.PADDING,
    "model.conv_impl": layers.CONV_IMPL,
    "model.compute_dtype": layers.COMPUTE_DTYPE,
    **head_settings.LOSS_SETTINGS,
}


def class_bias(config: ml_collections.ConfigDict, router) -> bool:
  """Whether the class capsules add a bias to s_j: ``config.class_capsules.use_bias``, or unset
  (None; the default of configs/mnist.py, as the official code) wherever ``router`` forms s_j."""
  use_bias = config.class_capsules.use_bias
  return bool(router.uses_parent_bias if use_bias is None else use_bias)


def validate_model_config(config: ml_collections.ConfigDict,
                          router: routing.Router | None = None) -> None:
  """Raises UsageError (a ValueError) naming the config key for settings that cannot work.
  Reads ``config`` (``config.model``) only; ``router``: :func:`capsjax.routing.chosen`'s."""
  router, _ = routing.chosen(config.routing, router)
  head_settings.check_scores(config, router)
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


class CapsNet(CapsuleModel):
  """Conv1 -> PrimaryCaps -> class capsules (routing) [-> decoder].

  Every size comes from ``config`` (``config.model`` of the configs in
  ``configs/``): image shape, number of classes, capsule types and
  dimensions, so one class serves 28x28 MNIST, 36x36 MultiMNIST and 32x32 RGB.
  """

  SETTINGS = SETTINGS
  RULES = head_settings.LOSS_RULES
  router_sections = ("model.routing",)

  @staticmethod
  def resolve_config(config: ml_collections.ConfigDict) -> None:
    """``class_capsules.use_bias`` as it is in effect where left unset (:func:`class_bias`)."""
    if config.class_capsules.use_bias is None:
      config.class_capsules.use_bias = class_bias(config, routing.get(config.routing.name))

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs,
               loss: LossSettings | None = None, router: routing.Router | None = None):
    """``config`` is ``config.model``; ``loss`` the settings of :meth:`loss`; ``router`` the one
    resolving the run's config chose (:func:`capsjax.routing.chosen_router`)."""
    validate_model_config(config, router)
    dtype = layers.COMPUTE_DTYPES[config.compute_dtype]
    padding = config.padding
    router, settings = routing.chosen(config.routing, router)
    # The primary capsules squash with the router's epsilon, or Eq. 1's where it has none.
    squash_epsilon = (settings["squash_epsilon"] if "squash_epsilon" in settings
                      else SQUASH_EPSILON.default)
    self.conv1 = layers.Conv2D(config.image_shape[2], config.conv1.features,
                               config.conv1.kernel_size, config.conv1.stride, impl=config.conv_impl,
                               compute_dtype=dtype, init_scale=config.conv1.init_scale,
                               bias_init=config.conv1.bias_init, padding=padding, rngs=rngs)
    self.primary_capsules = capsule_layers.PrimaryCapsules(
        config.conv1.features, config.primary.num_types, config.primary.dim,
        config.primary.kernel_size, config.primary.stride, squash_epsilon=squash_epsilon,
        impl=config.conv_impl, compute_dtype=dtype, init_scale=config.primary.init_scale,
        bias_init=config.primary.bias_init, padding=padding,
        output_scale=config.primary.output_scale, rngs=rngs)
    grid_h, grid_w = primary_grid(config)
    self.class_capsules = capsule_layers.ClassCapsules(
        grid_h * grid_w * config.primary.num_types, config.primary.dim, config.num_classes,
        config.class_capsules.dim, init_scale=config.class_capsules.init_scale,
        use_bias=class_bias(config, router), bias_init=config.class_capsules.bias_init,
        routing=(router, settings), rngs=rngs)
    self.decoder = nnx.data(layers.Decoder(
        config.num_classes, config.class_capsules.dim, config.decoder.hidden,
        config.image_shape, compute_dtype=dtype, init_scale=config.decoder.init_scale,
        bias_init=config.decoder.bias_init, rngs=rngs)
        if config.decoder.enabled else None)
    self.init_head(config, router, loss)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs) -> "CapsNet":
    """From a whole run config: ``config.model`` and ``config.loss``."""
    return cls(config.model, rngs=rngs, loss=LossSettings.from_config(config.get("loss")),
               router=routing.chosen_router(config))

  validate_config = staticmethod(validate_model_config)

  # What to change when the class capsules saturate (the run's warning names these).
  saturation_settings = ("model.class_capsules.init_scale", "model.primary.output_scale",
                         "optimizer.learning_rate")

  def __call__(self, images: jax.Array, labels: jax.Array | None = None, *,
               train: bool = False, diagnostics: bool = False, labels_per_example: int = 1,
               rng: jax.Array | None = None) -> Outputs:
    """Fig. 1, then Fig. 2's decoder: ``(batch, h, w, c)`` images -> :class:`Outputs`. In
    training the decoder sees the capsule of the label (``labels``, required then), otherwise
    of the prediction; ``diagnostics``: also the routing's, per iteration."""
    features = jax.nn.relu(self.conv1(images))  # Conv1: 256 9x9 kernels, ReLU.
    primary = self.primary_capsules(features)   # PrimaryCaps: 32 x 8D, 9x9 stride 2, Eq. 1.
    # The votes u_hat_{j|i} = W_ij u_i (Eq. 2), routed by Procedure 1 to v_j (10 x 16D).
    routed = self.class_capsules.route(primary, train=train, rng=rng, diagnostics=diagnostics)
    # The lengths |v_j| score the classes; the decoder sees the masked v_j (Fig. 2).
    return self.classify(routed, labels, train=train, diagnostics=diagnostics,
                         labels_per_example=labels_per_example)

  def primary(self, images: jax.Array, *, train: bool = False) -> capsule_layers.Capsules:
    """Conv1 (ReLU) and PrimaryCaps alone (the vote attack's input): ``(batch, h, w, c)`` ->
    primary capsules (poses ``(batch, in_caps, in_dim)`` and their lengths)."""
    del train
    return self.primary_capsules(jax.nn.relu(self.conv1(images)))


# --- The loss (Eq. 4 and Sec. 4.1) and the metrics ---------------------------------------

def margin_loss_per_example(lengths: jax.Array, labels: jax.Array, *, m_plus: float = 0.9,
                            m_minus: float = 0.1, lam: float = 0.5) -> jax.Array:
  """Eq. 4, summed over the classes k: ``T_k max(0, m+ - |v_k|)^2 + lam (1 - T_k)
  max(0, |v_k| - m-)^2``; ``lengths`` ``(batch, num_classes)``, ``labels`` ``(batch,)`` or
  ``(batch, n)`` (several digits, each present: T_k = 1) -> ``(batch,)``."""
  present = jax.nn.one_hot(labels, lengths.shape[-1], dtype=lengths.dtype)
  if labels.ndim == 2:
    present = jnp.minimum(jnp.sum(present, axis=1), 1.0)
  per_class = (present * jnp.square(jnp.maximum(0.0, m_plus - lengths))
               + lam * (1.0 - present) * jnp.square(jnp.maximum(0.0, lengths - m_minus)))
  return jnp.sum(per_class, axis=-1)


def reconstruction_loss_per_example(reconstructions: jax.Array, images: jax.Array, *,
                                    weight: float = 0.0005) -> jax.Array:
  """``weight`` x the SUM of squared pixel errors of each example, ``(batch,)``: the paper
  scales the sum by 0.0005 "so that it does not dominate the margin loss" (Sec. 4.1; a mean
  over 784 pixels would be 784x weaker)."""
  if reconstructions.shape != images.shape:
    raise ValueError(f"reconstructions {reconstructions.shape} and images {images.shape} "
                     "must have the same shape.")
  errors = jnp.square(reconstructions - images).reshape(images.shape[0], -1)
  return weight * jnp.sum(errors, axis=-1)


def capsule_loss(outputs: Outputs, batch: dict, settings: LossSettings, *,
                 traced: bool = False) -> tuple[jax.Array, dict]:
  """``margin_weight`` x Eq. 4 + the reconstruction loss, per example, and the two parts.

  The reconstruction target is ``batch["reconstruction_targets"]`` (the clean images; with
  several digits per image, Sec. 6, each digit's own image reconstructed from its label's
  capsule), never the input, which an attack may have moved: a batch without targets is
  refused (:meth:`capsjax.training.tasks.Task.complete_batch` adds them). ``traced``: the
  settings are one run's traced numbers (a vectorised step), whose weight may be nonzero."""
  s = settings
  margin = s.margin_weight * margin_loss_per_example(
      outputs.scores, batch["labels"], m_plus=s.m_plus, m_minus=s.m_minus, lam=s.lam)
  several = batch["labels"].ndim == 2
  reconstructions = outputs.label_reconstructions if several else outputs.reconstructions
  if reconstructions is None or not (traced or s.reconstruction_weight):
    return margin, {"margin_loss": margin, "reconstruction_loss": jnp.zeros_like(margin)}
  if "reconstruction_targets" not in batch:
    raise ValueError("the batch has no 'reconstruction_targets' to reconstruct: complete it "
                     "with capsjax.training.tasks.Task.complete_batch (the dataset's clean "
                     "images) before moving its images.")
  recon = reconstruction_loss_per_example(reconstructions, batch["reconstruction_targets"],
                                          weight=s.reconstruction_weight)
  return margin + recon, {"margin_loss": margin, "reconstruction_loss": recon}


def predictions(scores: jax.Array, labels_per_example: int) -> jax.Array:
  """The predicted class ``(batch,)``, or the ``k`` top classes ``(batch, k)`` by score."""
  if labels_per_example == 1:
    return jnp.argmax(scores, axis=-1)
  return jax.lax.top_k(scores, labels_per_example)[1]


def label_sets_correct(scores: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
  """``{"accuracy": (batch,)}``, 0/1: whether the ``k`` highest ``scores`` are exactly the
  ``k`` ``labels`` of each example (ordinary accuracy for one label; with several, the
  official code's MultiMNIST criterion, plus ``at_least_one`` of them among the top ``k``).
  Ties go to the lower class index (``lax.top_k``)."""
  if labels.ndim == 1:
    return {"accuracy": (jnp.argmax(scores, axis=-1) == labels).astype(jnp.float32)}
  _, top = jax.lax.top_k(scores, labels.shape[-1])
  hits = jnp.sum(jnp.any(top[:, :, None] == labels[:, None, :], axis=1), axis=-1)
  return {"accuracy": (hits == labels.shape[-1]).astype(jnp.float32),
          "at_least_one": (hits > 0).astype(jnp.float32)}


def capsule_saturation(lengths: jax.Array,
                       threshold: float = SATURATED_LENGTH) -> dict[str, jax.Array]:
  """Per example, the mean length of the class capsules (``lengths`` ``(batch, classes)``)
  and the fraction longer than ``threshold``. The squash's slope vanishes for long ``s``, so
  a model whose capsules all sit there gets almost no gradient from the margin loss
  (:mod:`capsjax.models.saturation_watch`)."""
  return {"class_capsule_length": jnp.mean(lengths, axis=-1),
          "saturated_fraction": jnp.mean((lengths > threshold).astype(jnp.float32), axis=-1)}


# Registered (capsjax/config/registries.py): this module's name in the config.
MODEL = CapsNet
