"""Matrix capsules with EM routing (Hinton, Sabour & Frosst, ICLR 2018), registered as
``config.model.name = "em_capsnet"``, in the layout of the authors' code (google-research
``capsule_em``: ``simple_model.py``, ``em_model.py``, ``em_layers.py``, ``layers.py``)::

    conv1        A@5x5, stride 2, VALID, bias 0.1, ReLU (std 0.05)
    primary      1x1 conv -> B types of a 4x4 pose and an activation sigmoid(logit - 1)
    ConvCaps1    C types, K=3, stride 2, VALID, EM routing (3 iterations)
    ConvCaps2    D types, K=3, stride 1, VALID, EM routing
    class caps   one 4x4 transform per (type, class) shared over positions, coordinate
                 addition, EM routing; the class activations are the scores
    loss         spread loss (margin 0.2 -> 0.99 on the code's schedule) + 2e-7 x the sum of
                 squared weights / 2 (the code's ``tf.nn.l2_loss``; weights, not biases)

Parameters: 316,650 at A=B=C=D=32, 5 classes, two stereo channels (the paper's "310K"), 68,618
for the small network A=64, B=8, C=D=16 (the paper's "68K"); docs/models.md has them per layer.
The layers are the shared capsule stack (:mod:`capsjax.models.capsule_layers`), so every router
runs at every routed layer (docs/models.md), VB with its batch norms of the parents
(:attr:`capsjax.routing.Router.parent_batch_norms`), so EM and VB compare on one backbone.

Where the paper's text and the code differ, the code is the default and a setting picks (the
routing's own differences are listed in :mod:`capsjax.routing.em`):

* the spread loss's margin: the code's sigmoid schedule (``loss.margin_schedule="code"``) or
  the text's linear 0.2 -> 0.9 (``"linear"``, over ``loss.margin_steps``); the code averages
  the loss over classes (``loss.reduction="mean"``), Eq. 3 sums (``"sum"``);
* coordinate addition: the code adds the receptive field's centre (column, row) to the first
  two pose entries, the text to the first two entries of the right-hand column
  (``model.class_capsules.coordinate_addition``,
  :func:`~capsjax.models.receptive_fields.coordinate_offsets`);
* a child in several receptive fields: the code normalises its assignments per output type over
  stride-1 groups (``model.conv_caps.normalisation``, :mod:`capsjax.models.conv_capsules`);
* the primary capsules' interleaved kernel columns (``model.primary.layout``);
* inverse temperatures: 0.01 in the convolutional capsule layers, 0.01 / 4 at the class layer
  (``model.conv_caps.inverse_temperature``, ``model.routing.inverse_temperature``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from capsjax import routing
from capsjax.config import settings as settings_lib
from capsjax.common.errors import UsageError
from capsjax.config.settings import NON_NEGATIVE, POSITIVE, Setting, at_least, each, one_of
from capsjax.models import (SHAPE_SETTINGS, capsule_layers, conv_capsules, layers, losses,
                            matrix_capsules, metrics)
from capsjax.models import receptive_fields as fields
from capsjax.models.outputs import Outputs

_SIZES = dict(kind=tuple, check=each(at_least(1)))
_STD = dict(kind=float, check=NON_NEGATIVE, init_only=True)
# ``config.loss`` of matrix capsules: the authors' code's spread loss (its margin schedule,
# mean over classes, weight decay 2e-7); configs set only what differs (VB: cross-entropy).
LOSS_SETTINGS = {
    "kind": Setting("spread", "\"spread\" (EM paper); \"cross_entropy\" over the activations "
                    "(the VB authors' code).", check=one_of("spread", "cross_entropy")),
    "margin_schedule": Setting("code", "The spread loss's margin: \"code\" | \"linear\" (the "
                               "paper's text).", check=one_of(*losses.MARGIN_SCHEDULES)),
    "margin_steps": Setting(400_000, "\"linear\": steps from 0.2 to 0.9.", check=POSITIVE),
    "reduction": Setting("mean", "\"mean\" over classes (code) | \"sum\" (Eq. 3).",
                         check=one_of("mean", "sum")),
    "weight_decay": Setting(2e-7, "Times the weights' l2 loss (the code's "
                            "utils.weight_variable).", check=NON_NEGATIVE),
}
# ``config.model`` of em_capsnet (configs/em_mnist.py has the authors' code's).
SETTINGS = {
    **SHAPE_SETTINGS,
    "model.pose_size": Setting(kind=int, meaning="Poses are N x N matrices (4).", check=POSITIVE),
    **layers.conv_settings("model.conv1", "conv1"),
    "model.primary.types": Setting(kind=int, meaning="Primary capsule types (the paper's B).",
                                   check=POSITIVE),
    "model.primary.pose_init": Setting(meaning="The poses' kernel std.", **_STD),
    "model.primary.activation_init": Setting(meaning="The activations' kernel std.", **_STD),
    "model.primary.activation_offset": Setting(kind=float, meaning="Added to the activations' "
                                               "logits."),
    "model.primary.layout": Setting(kind=str, meaning="\"code\"; \"split\": poses and logits "
                                    "from their own kernels.",
                                    check=one_of(*capsule_layers.PRIMARY_LAYOUTS)),
    "model.conv_caps.types": Setting(meaning="Types of each convolutional capsule layer.",
                                     **_SIZES),
    "model.conv_caps.kernel_sizes": Setting(meaning="Their kernel sides.", **_SIZES),
    "model.conv_caps.strides": Setting(meaning="Their strides.", **_SIZES),
    "model.conv_caps.init_scale": Setting(meaning="Their transforms' std (code: 0.3).", **_STD),
    "model.conv_caps.normalisation": Setting(kind=str, meaning="E-step over \"code\" | "
                                             "\"child\" (the paper) | \"patch\".",
                                             check=one_of(*fields.NORMALISATIONS)),
    "model.conv_caps.inverse_temperature": Setting(kind=float, meaning="Their lambda (code: "
                                                   "0.01).", check=POSITIVE),
    "model.conv_caps.mass_epsilon": Setting(kind=float, meaning="Added to sum_i R_ij a_i there.",
                                            check=POSITIVE),
    "model.conv_caps.beta_u_init": Setting(kind=float, meaning="Their beta_u's initial value."),
    "model.conv_caps.beta_a_init": Setting(kind=float, meaning="Their beta_a's initial value."),
    "model.class_capsules.init_scale": Setting(meaning="The class layer's transforms' std.",
                                               **_STD),
    "model.class_capsules.coordinate_addition": Setting(
        kind=str, meaning="\"code\" | \"paper\" | \"none\".",
        check=one_of(*fields.COORDINATE_ADDITIONS)),
    "model.conv_impl": layers.CONV_IMPL,
    **settings_lib.prefixed("loss", LOSS_SETTINGS),
}


def conv_routing_settings(config: ml_collections.ConfigDict, class_settings: dict,
                          router: routing.Router) -> dict:
  """The convolutional capsule layers' routing settings: the class layer's, but those the router
  takes per layer (:attr:`capsjax.routing.Router.conv_layer_settings`) from ``config.conv_caps``
  (VB has one set of priors for every layer, as its authors' code)."""
  return {**class_settings, **{key: config.conv_caps[key] for key in router.conv_layer_settings}}


def grids(config: ml_collections.ConfigDict) -> list[int]:
  """Spatial size (one side) after conv1 and each convolutional capsule layer."""
  size = (min(config.image_shape[:2]) - config.conv1.kernel_size) // config.conv1.stride + 1
  sizes = [size]
  for k, s in zip(config.conv_caps.kernel_sizes, config.conv_caps.strides):
    sizes.append((sizes[-1] - k) // s + 1)
  return sizes


def validate_config(config: ml_collections.ConfigDict,
                    router: routing.Router | None = None) -> None:
  """Raises UsageError naming the ``config.model`` key that cannot work (``router``:
  :func:`capsjax.routing.chosen`'s)."""
  router, settings = routing.chosen(config.routing, router)
  caps = config.conv_caps
  n = len(tuple(caps.types))
  if n != len(tuple(caps.kernel_sizes)) or n != len(tuple(caps.strides)):
    raise UsageError(f"config.model.conv_caps.types, kernel_sizes and strides must have one "
                     f"length, got {tuple(caps.types)}, {tuple(caps.kernel_sizes)}, "
                     f"{tuple(caps.strides)}.")
  router.check(conv_routing_settings(config, settings, router))
  if config.image_shape[0] != config.image_shape[1]:
    raise UsageError(f"config.model.image_shape {tuple(config.image_shape)}: em_capsnet takes "
                     "square images (the code's receptive-field grouping assumes it).")
  if min(grids(config)) < 1:
    raise UsageError(f"config.model.image_shape {tuple(config.image_shape)} is too small for "
                     f"conv1 and the capsule layers' kernels and strides (grids "
                     f"{grids(config)}).")


class EMCapsNet(nnx.Module):
  """conv1 -> primary capsules -> convolutional capsules (EM) -> class capsules (EM)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs,
               loss: ml_collections.ConfigDict | None = None,
               router: routing.Router | None = None):
    """``config`` is ``config.model`` (``configs/em_mnist.py``); ``loss`` is ``config.loss``;
    ``router`` the one resolving the run's config chose (:func:`capsjax.routing.chosen_router`)."""
    validate_config(config, router)
    router, class_settings = routing.chosen(config.routing, router)
    conv_settings = conv_routing_settings(config, class_settings, router)
    norms = router.parent_batch_norms  # The VB authors' batch norms of the parents.
    pose = config.pose_size
    self.conv1 = layers.Conv2D(config.image_shape[2], config.conv1.features,
                               config.conv1.kernel_size, config.conv1.stride,
                               impl=config.conv_impl, init_scale=config.conv1.init_scale,
                               bias_init=config.conv1.bias_init, rngs=rngs)
    self.primary_capsules = matrix_capsules.MatrixPrimaryCapsules(
        config.conv1.features, config.primary.types, pose,
        pose_init=config.primary.pose_init, activation_init=config.primary.activation_init,
        activation_offset=config.primary.activation_offset, layout=config.primary.layout, rngs=rngs)
    caps = config.conv_caps
    types = [config.primary.types, *caps.types]
    self.conv_capsules = nnx.List([
        conv_capsules.ConvCapsules(
            a, b, k, s, pose, init_scale=caps.init_scale,
            routing=(router, conv_settings), normalisation=caps.normalisation,
            routing_norms=norms, rngs=rngs)
        for a, b, k, s in zip(types, types[1:], caps.kernel_sizes, caps.strides)])
    stack = [(config.conv1.kernel_size, config.conv1.stride), *zip(caps.kernel_sizes, caps.strides)]
    centres = fields.receptive_field_centres(config.image_shape[0], stack)
    size = grids(config)[-1]
    grid_votes = matrix_capsules.GridMatrixVotes.create(
        size, size, types[-1], pose, fields.coordinate_offsets(
            centres, centres, pose, config.class_capsules.coordinate_addition))
    self.class_capsules = capsule_layers.ClassCapsules(
        size * size * types[-1], pose * pose, config.num_classes, pose * pose,
        init_scale=config.class_capsules.init_scale,
        routing=(router, class_settings), votes=grid_votes.pair,
        routing_norms=norms, rngs=rngs)
    self.loss_items = tuple(sorted(resolved_loss(loss).items()))  # Hashable, static.

  SETTINGS = SETTINGS
  router_sections = ("model.routing",)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs) -> "EMCapsNet":
    return cls(config.model, rngs=rngs, loss=config.get("loss"),
               router=routing.chosen_router(config))

  validate_config = staticmethod(validate_config)

  def capsules(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
               diagnostics: bool = False):
    """``(batch, h, w, c)`` -> class poses ``(batch, classes, 16)``, class activations ``(batch,
    classes)`` and ``{name: (batch, iterations)}`` diagnostics of every routing layer
    (``caps1_...``, ``caps2_...``, the class layer's without prefix). ``train``: VB's batch norms
    use the batch's statistics; ``rng``: for routers that draw (``random``), split among layers."""
    poses, activations = self.primary_capsules(jax.nn.relu(self.conv1(images)))
    rngs = [None] * (len(self.conv_capsules) + 1) if rng is None else list(
        jax.random.split(rng, len(self.conv_capsules) + 1))
    found = {}
    for n, layer in enumerate(self.conv_capsules, start=1):
      poses, activations, measured = layer(poses, activations, train=train, rng=rngs[n - 1],
                                           diagnostics=diagnostics)
      found.update({f"caps{n}_{k}": v for k, v in measured.items()})
    b = poses.shape[0]
    routed = self.class_capsules.route(
        capsule_layers.Capsules(poses.reshape(b, -1, poses.shape[-1]), activations.reshape(b, -1)),
        train=train, rng=rngs[-1], diagnostics=diagnostics)
    scores = (routed.activations if routed.activations is not None
              else routing.safe_norm(routed.capsules))
    found.update(routed.diagnostics)
    return routed.capsules, scores, found

  def apply(self, batch: dict, *, train: bool, rng: jax.Array | None = None) -> Outputs:
    """Class activations as scores; routing diagnostics at evaluation."""
    labels = batch["labels"]
    per_example = labels.shape[1] if labels.ndim == 2 else 1
    poses, scores, diagnostics = self.capsules(batch["images"], train=train,
                                               rng=rng if train else None, diagnostics=not train)
    return Outputs(scores=scores, predictions=metrics.predictions(scores, per_example),
                   log_probabilities=jax.nn.log_softmax(scores), score_kind="activations",
                   class_capsules=poses, diagnostics=None if train else diagnostics)

  def weight_decay(self) -> jax.Array:
    """``sum over weight tensors of |W|^2 / 2`` (``tf.nn.l2_loss`` of each, as the code's
    ``weight_variable`` adds them; biases and beta are not decayed)."""
    weights = [self.conv1.kernel, self.primary_capsules.pose_kernel,
               self.primary_capsules.activation_kernel, self.class_capsules.weights,
               *(layer.weights for layer in self.conv_capsules)]
    return sum(0.5 * jnp.sum(jnp.square(w[...])) for w in weights)

  def loss(self, outputs: Outputs, batch: dict, *, step: jax.Array | None = None
           ) -> tuple[jax.Array, dict]:
    """The spread loss at ``step``'s margin (:func:`capsjax.models.losses.spread_margin`), or with
    ``loss.kind="cross_entropy"`` the VB authors' softmax cross-entropy over the class activations,
    plus ``loss.weight_decay`` x :meth:`weight_decay` per example (batch mean: the code's loss)."""
    settings = dict(self.loss_items)
    labels = batch["labels"]
    if labels.ndim != 1:
      raise UsageError("em_capsnet's losses take one label per image.")
    if settings["kind"] == "cross_entropy":
      # The VB authors' F.cross_entropy(yhat, labels): the activations taken as logits.
      data = -jnp.take_along_axis(jax.nn.log_softmax(outputs.scores), labels[:, None], axis=1)[:, 0]
      parts = {"cross_entropy": data}
    else:
      margin = losses.spread_margin(step, settings["margin_schedule"],
                                    settings["margin_steps"], outputs.scores.dtype)
      data = losses.spread_loss_per_example(outputs.scores, labels, margin, settings["reduction"])
      parts = {"spread_loss": data, "margin": margin * jnp.ones_like(data)}
    decay = settings["weight_decay"] * self.weight_decay() * jnp.ones_like(data)
    return data + decay, {**parts, "weight_decay": decay}

  def metrics(self, outputs: Outputs, batch: dict) -> dict:
    """``accuracy`` and, at evaluation, the routing diagnostics (:meth:`capsules`)."""
    result = metrics.label_sets_correct(outputs.scores, batch["labels"])
    result.update(outputs.diagnostics or {})
    return result

  def capabilities(self) -> frozenset[str]:
    return frozenset({"routing_diagnostics"})


def default_loss() -> ml_collections.ConfigDict:
  """``config.loss`` of em_capsnet with every setting at its default (:data:`LOSS_SETTINGS`)."""
  return ml_collections.ConfigDict(resolved_loss(None))


def resolved_loss(loss) -> dict:
  """``config.loss`` (None: none) with its defaults filled in (a resolved config's holds them all
  already); UsageError naming a key that cannot work (:func:`capsjax.config.settings.resolve`)."""
  given = {} if loss is None else {k: loss[k] for k in loss}
  if settings_lib.in_effect(loss):
    return given
  return settings_lib.resolve(given, LOSS_SETTINGS, "config.loss", owner="em_capsnet's loss")


MODEL = EMCapsNet
