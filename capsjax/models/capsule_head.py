"""The capsule head that capsule models share: class capsules -> scores, predictions,
reconstructions, the margin + reconstruction loss and the metrics (Sabour et al. 2017,
Sec. 3-4).

A capsule model is a backbone (its ``primary(images, *, train)`` giving primary capsules,
:class:`capsjax.models.capsule_layers.Capsules`) composed with this head: it holds a
:class:`CapsuleHead` as ``self.head`` and the head's layers as ``class_capsules``
(:class:`capsjax.models.capsule_layers.ClassCapsules`) and ``decoder``
(:class:`capsjax.models.layers.Decoder` or None). :class:`CapsuleModel`, below, turns that
into the model interface of :mod:`capsjax.models`, each method a call of the head's, so
CapsNet and Efficient-CapsNet share the head without inheriting from each other.

A subclass (:class:`capsjax.models.capsnet.CapsNet`,
:class:`capsjax.models.efficient_capsnet.EfficientCapsNet`, or a researcher's) supplies the
backbone and the head's parts, and gets the whole interface of :mod:`capsjax.models`::

    class MyCapsNet(CapsuleModel):
      saturation_settings = ("model.class_capsules.init_scale",)  # Named by the warning.

      def __init__(self, config, *, rngs, loss=None):
        self.convs = ...                                   # The backbone's layers.
        self.class_capsules = capsule_layers.ClassCapsules(...)
        self.decoder = nnx.data(layers.Decoder(...))       # Or nnx.data(None).
        self.head = capsule_head.CapsuleHead.from_config(config.model, router, loss)

      def primary(self, images, *, train=False) -> capsule_layers.Capsules: ...

Each method of :class:`CapsuleModel` is one call of the head's (go-to-definition leads from
there to the code that runs); the head's layers are attributes of the model, so parameter trees and
checkpoints have the layout ``class_capsules/...``, ``decoder/...``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from capsjax import routing
from capsjax.config import per_run
from capsjax.common.errors import UsageError
from capsjax.config.settings import NON_NEGATIVE, Rule, Setting, between, one_of, usually
from capsjax.models import losses, metrics
from capsjax.models.capsule_layers import Capsules, ClassCapsules
from capsjax.models.layers import Decoder
from capsjax.models.outputs import Outputs
from capsjax.models.saturation_watch import SaturationWatch

SCORES = ("auto", "lengths", "activations")


@per_run.declare("loss")
class LossSettings:
  """``config.loss``: Eq. 4's m+, m- and lambda; the weight of the summed squared errors; and
  the margin loss's own weight (1: Eq. 4 summed over the classes; the official code's 0.05 is
  its 0.5 x a mean over the 10 classes).

  The capsule models' per-run numbers (:mod:`capsjax.config.per_run`): a pytree whose fields
  a vectorised sweep's runs may differ in, each run's handed to :meth:`CapsuleHead.loss`. Its
  fields' settings (default, meaning, range) are :data:`LOSS_SETTINGS`."""
  m_plus: float = 0.9
  m_minus: float = 0.1
  lam: float = 0.5
  reconstruction_weight: float = 0.0005
  margin_weight: float = 1.0

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict | None) -> "LossSettings":
    """From ``config.loss`` (None: no loss section: the defaults)."""
    return per_run.of_config(cls, config)


# ``config.loss`` of the capsule models: Eq. 4 and the reconstruction term (Sec. 4.1).
LOSS_SETTINGS = {
    "loss.m_plus": Setting(LossSettings.m_plus, "Eq. 4's m+ (a present class's length "
                           "above it costs nothing).", check=between(0, 1)),
    "loss.m_minus": Setting(LossSettings.m_minus, "Eq. 4's m- (below m+).",
                            check=between(0, 1)),
    "loss.lam": Setting(LossSettings.lam, "Eq. 4's lambda, the absent classes' weight.",
                        check=usually(NON_NEGATIVE)),
    "loss.reconstruction_weight": Setting(LossSettings.reconstruction_weight, "Times the SUM "
                                          "of squared pixel errors.",
                                          check=usually(NON_NEGATIVE)),
    "loss.margin_weight": Setting(LossSettings.margin_weight, "Times Eq. 4 summed over the "
                                  "classes (the official code's: 0.05).",
                                  check=usually(NON_NEGATIVE)),
}
LOSS_RULES = (Rule(("loss.m_plus", "loss.m_minus"), lambda plus, minus: plus > minus,
                   "m+ > m- (Eq. 4: a present class is pushed above m+, an absent one below "
                   "m-)", unusual=True),)


SCORES_SETTING = Setting("auto", "Class scores: the router's own (\"auto\": its parents' "
                         "activations where it computes them, else the lengths); or "
                         "\"lengths\", \"activations\".", check=one_of(*SCORES))


def check_scores(config: ml_collections.ConfigDict, router: routing.Router) -> None:
  """Raises UsageError for a ``config.class_capsules.scores`` the router cannot give."""
  scores = config.class_capsules.scores
  if scores == "activations" and not router.yields_activations:
    raise UsageError(f"config.model.class_capsules.scores='activations' but router "
                     f"{router.name!r} computes no parent activations; use 'lengths' or 'auto'.")


@dataclasses.dataclass(frozen=True)
class CapsuleHead:
  """The capsule head: its settings and what it computes from the primary capsules.

  A model holds one as ``self.head`` (a static attribute: hashable, no arrays); the head's
  layers (the class capsules and the decoder) stay attributes of the model, so parameter trees
  and checkpoints keep their layout, and each method takes the layers it uses.
  :class:`CapsuleModel` is the model interface built on it.

  Attributes:
    num_classes: class capsules.
    scores_are_activations: the router's parent activations score (else the lengths).
    measures_saturation: report the lengths' saturation (routers that squash, scored by
      lengths).
    loss_settings: :class:`LossSettings`.
  """
  num_classes: int
  scores_are_activations: bool
  measures_saturation: bool
  loss_settings: LossSettings = LossSettings()

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, router: routing.Router,
                  loss: LossSettings | None = None) -> "CapsuleHead":
    """``config`` is ``config.model``; ``router`` the class capsules' router."""
    scores = config.class_capsules.scores
    by_activations = router.yields_activations and scores != "lengths"
    return cls(config.num_classes, by_activations, router.squashes and not by_activations,
               loss or LossSettings())

  def classify(self, primary: Capsules, class_layer: ClassCapsules, decoder: Decoder | None,
               labels: jax.Array | None = None, *, train: bool = False,
               diagnostics: bool = False, labels_per_example: int = 1,
               rng: jax.Array | None = None) -> Outputs:
    """Routes the primary capsules to the class capsules, scores, predicts and reconstructs.

    Args:
      primary: the backbone's primary capsules (poses ``(batch, in_caps, in_dim)``).
      class_layer: the model's class-capsule layer; ``decoder`` its decoder or None.
      labels: ``(batch,)`` int class ids, or ``(batch, n)`` for n digits per image; required
        when ``train``.
      train: mask the decoder input by the labels (training, paper Sec. 4.1); otherwise by the
        predicted classes (evaluation).
      diagnostics: also return the router's per-iteration measurements.
      labels_per_example: how many classes to predict (and reconstruct) per image.
      rng: the key of routers that draw in training (``random``).
    """
    routed = class_layer.route(primary, train=train, rng=rng, diagnostics=diagnostics)
    class_capsules = routed.capsules
    lengths = routing.safe_norm(class_capsules, axis=-1)
    scores = routed.activations if self.scores_are_activations else lengths
    predictions = metrics.predictions(scores, labels_per_example)
    reconstructions = label_reconstructions = None
    if decoder is not None:
      if train and labels is None:
        raise ValueError("A capsule model (train=True) masks the decoder by the labels: pass "
                         "labels.")
      reconstructions = self.decode(decoder, class_capsules, labels if train else predictions)
      if labels_per_example > 1 and labels is not None:  # Sec. 6: each digit its own target.
        label_reconstructions = (reconstructions if train
                                 else self.decode(decoder, class_capsules, labels))
    return Outputs(scores=scores, predictions=predictions,
                   log_probabilities=jax.nn.log_softmax(scores),
                   score_kind="activations" if self.scores_are_activations else "lengths",
                   class_capsules=class_capsules, lengths=lengths,
                   reconstructions=reconstructions,
                   label_reconstructions=label_reconstructions,
                   diagnostics=routed.diagnostics if diagnostics else None)

  def decode(self, decoder: Decoder | None, class_capsules: jax.Array,
             class_ids: jax.Array) -> jax.Array:
    """Decodes given capsule vectors (e.g. perturbed ones, paper Fig. 4), the others masked.

    Args:
      decoder: the model's decoder (None: ValueError).
      class_capsules: ``(batch, num_classes, capsule_dim)``.
      class_ids: ``(batch,)``, the capsule of each example to decode; or ``(batch, n)`` to
        decode n capsules one at a time (MultiMNIST), giving ``(batch, n, h, w, c)``.
    """
    if decoder is None:
      raise ValueError("This model has no decoder (config.model.decoder.enabled=False).")
    if class_ids.ndim == 2:
      return jnp.stack([self.decode(decoder, class_capsules, class_ids[:, k])
                        for k in range(class_ids.shape[1])], axis=1)
    return decoder(class_capsules, jax.nn.one_hot(class_ids, self.num_classes))

  @staticmethod
  def vote_scores(primary: Capsules, class_layer: ClassCapsules) -> jax.Array:
    """The class scores that the vote attack of Gu, Wu & Tresp (ICLR 2021, "Effective and
    efficient vote attack on capsule networks", Sec. 4) differentiates.

    The votes u_hat_{j|i} of every child for each class capsule are averaged with equal
    weights, with no routing and no bias, and squashed (Eq. 1):
    ``v_j = squash(mean_i u_hat_{j|i})``; the scores are the lengths ``|v_j|``,
    ``(batch, num_classes)``. Their code (JindongGu/VoteAttack, ``models/rout.py``,
    ``Vote_Attack``) does exactly this, and then takes the logarithm of the lengths normalised
    to sum to 1 as log-probabilities; capsjax's attacks take ``log_softmax(scores)`` for the
    surrogate as for the model itself (:class:`Outputs`), so the vote attack and the attack
    through the routing differ only in the routing. Whatever the router (self-attention,
    self-routing, ...), Eq. 1's squash is used, as in their definition.
    """
    votes = class_layer.votes(primary.poses)  # (batch, in_caps, out_caps, out_dim)
    return routing.safe_norm(routing.squash(jnp.mean(votes, axis=1)), axis=-1)

  def loss(self, outputs: Outputs, batch: dict, numbers: LossSettings | None = None
           ) -> tuple[jax.Array, dict]:
    """``margin_weight`` x margin loss (Eq. 4) + ``reconstruction_weight`` x summed squared
    reconstruction error, per example.

    The reconstruction target is ``batch["reconstruction_targets"]`` (the clean images, or with
    several digits per image, Sec. 6, each digit's own image, reconstructed from the capsule of
    its label; the sums are added), not the input: an attack that moves the input of a batch
    completed by :meth:`capsjax.training.tasks.Task.complete_batch` leaves it. A batch without
    targets is refused (it is never the images silently: those may be an attack's).

    ``numbers``: one run's :class:`LossSettings` in a vectorised step (traced scalars), or
    None: :attr:`loss_settings`, the config's."""
    s = self.loss_settings if numbers is None else numbers
    margin = s.margin_weight * losses.margin_loss_per_example(
        outputs.scores, batch["labels"], m_plus=s.m_plus, m_minus=s.m_minus, lam=s.lam)
    several = batch["labels"].ndim == 2
    reconstructions = outputs.label_reconstructions if several else outputs.reconstructions
    weight = s.reconstruction_weight
    if reconstructions is not None and (
        numbers is not None or weight):  # A traced weight may be nonzero.
      if "reconstruction_targets" not in batch:
        raise ValueError("the batch has no 'reconstruction_targets' to reconstruct: complete "
                         "it with capsjax.training.tasks.Task.complete_batch (the dataset's "
                         "clean images) before moving its images.")
      recon = losses.reconstruction_loss_per_example(
          reconstructions, batch["reconstruction_targets"], weight=weight)
    else:
      recon = jnp.zeros_like(margin)
    return margin + recon, {"margin_loss": margin, "reconstruction_loss": recon}

  def metrics(self, outputs: Outputs, batch: dict) -> dict:
    """Per example: ``accuracy`` (0/1; with several labels, the highest scores are exactly the
    labels, and ``at_least_one``); for routers that squash the class capsules, their
    saturation (``class_capsule_length``, ``saturated_fraction``:
    :func:`capsjax.models.metrics.capsule_saturation`); and, when measured (evaluation), the
    router's diagnostics under its names (dynamic routing: ``coupling_entropy``,
    ``coupling_max``, ``logit_change``, ``preactivation_norm``), ``(batch, iterations)``
    each."""
    result = metrics.label_sets_correct(outputs.scores, batch["labels"])
    if self.measures_saturation:
      result.update(metrics.capsule_saturation(outputs.lengths))
    if outputs.diagnostics:
      result.update(outputs.diagnostics)
    return result

  def capabilities(self, has_decoder: bool) -> frozenset[str]:
    """``reconstruction`` (with a decoder), ``routing_diagnostics``, ``saturation`` (heads
    that measure it), ``votes`` (:meth:`vote_scores`)."""
    found = {"routing_diagnostics", "votes"}
    if has_decoder:
      found.add("reconstruction")
    if self.measures_saturation:
      found.add("saturation")
    return frozenset(found)

  def monitors(self, config: ml_collections.ConfigDict, chance: float,
               saturation_settings: tuple[str, ...]) -> list:
    """The saturation warning (``config.train.saturation_warning``) for heads that measure
    saturation, naming ``saturation_settings`` (the model's keys that control it)."""
    if not self.measures_saturation:
      return []
    warning = config.train.saturation_warning
    return [SaturationWatch(fraction=warning.fraction, steps=warning.steps,
                            settings=saturation_settings, chance=chance)]


class CapsuleModel(nnx.Module):
  """A backbone (:meth:`primary`) composed with the capsule head (``self.head``).

  Subclasses set ``class_capsules``, ``decoder`` (None without one), ``head`` and the class
  attribute ``saturation_settings`` (the config keys the saturation warning names), and
  define :meth:`primary`; they may declare ``init_only_settings`` (config keys used only to
  build the initial parameters: a vectorised sweep's runs may differ in them).
  """

  class_capsules: ClassCapsules
  decoder: Decoder | None
  head: CapsuleHead
  saturation_settings: tuple[str, ...] = ()
  # The numbers a vectorised sweep's runs may differ in, each run's handed to the loss
  # (capsjax/config/per_run.py).
  per_run_numbers: type = LossSettings
  init_only_settings: tuple[str, ...] = ()

  def primary(self, images: jax.Array, *, train: bool = False) -> Capsules:
    """The backbone: ``(batch, h, w, c)`` images -> primary capsules."""
    raise NotImplementedError(f"{type(self).__name__} must define primary(images, *, train).")

  def __call__(self, images: jax.Array, labels: jax.Array | None = None, *,
               train: bool = False, diagnostics: bool = False, labels_per_example: int = 1,
               rng: jax.Array | None = None) -> Outputs:
    """Classifies and reconstructs ``images`` (:meth:`CapsuleHead.classify`)."""
    return self.head.classify(self.primary(images, train=train), self.class_capsules,
                              self.decoder, labels, train=train, diagnostics=diagnostics,
                              labels_per_example=labels_per_example, rng=rng)

  def apply(self, batch: dict, *, train: bool, rng: jax.Array | None = None) -> Outputs:
    """Outputs for a batch; the decoder is masked by the labels in training, by the prediction
    otherwise (and, with several labels per image, also by them), and evaluation also
    measures routing. ``rng`` is used only by routers that draw (``random``)."""
    labels = batch["labels"]
    several = labels.ndim == 2
    return self(batch["images"], labels if train or several else None, train=train,
                diagnostics=not train, labels_per_example=labels.shape[1] if several else 1,
                rng=rng)

  def decode(self, class_capsules: jax.Array, class_ids: jax.Array) -> jax.Array:
    """Decodes given class capsules (:meth:`CapsuleHead.decode`)."""
    return self.head.decode(self.decoder, class_capsules, class_ids)

  def vote_scores(self, batch: dict) -> jax.Array:
    """The vote attack's class scores, in evaluation mode (:meth:`CapsuleHead.vote_scores`)."""
    return self.head.vote_scores(self.primary(batch["images"], train=False),
                                 self.class_capsules)

  def loss(self, outputs: Outputs, batch: dict, *, step: jax.Array | None = None,
           numbers: LossSettings | None = None) -> tuple[jax.Array, dict]:
    """The margin and reconstruction losses (:meth:`CapsuleHead.loss`); ``step`` is unused
    (no schedule); ``numbers``: one run's :attr:`per_run_numbers` in a vectorised sweep."""
    del step
    return self.head.loss(outputs, batch, numbers)

  def metrics(self, outputs: Outputs, batch: dict) -> dict:
    """Accuracy, saturation and routing diagnostics (:meth:`CapsuleHead.metrics`)."""
    return self.head.metrics(outputs, batch)

  def capabilities(self) -> frozenset[str]:
    """:meth:`CapsuleHead.capabilities` of this model."""
    return self.head.capabilities(self.decoder is not None)

  def monitors(self, config: ml_collections.ConfigDict, chance: float) -> list:
    """The saturation warning, naming ``saturation_settings`` (:meth:`CapsuleHead.monitors`)."""
    return self.head.monitors(config, chance, self.saturation_settings)

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
