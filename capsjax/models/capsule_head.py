"""The capsule head that capsule models share: class capsules -> scores, predictions,
reconstructions, the margin + reconstruction loss and the metrics (Sabour et al. 2017,
Sec. 3-4).

A capsule model is a backbone (its own ``primary(images, *, train)`` giving primary capsules
:class:`capsjax.models.capsule_layers.Capsules`) composed with this head: it holds the head's
layers as ``class_capsules`` (:class:`capsjax.models.capsule_layers.ClassCapsules`) and ``decoder``
(:class:`capsjax.models.layers.Decoder` or None), the head's settings as ``head`` (a
:class:`CapsuleHead`), and takes the head's functions as its methods::

    class MyCapsNet(nnx.Module):
      __call__, apply, decode = capsule_head.call, capsule_head.apply, capsule_head.decode
      loss, metrics = capsule_head.loss, capsule_head.metrics
      capabilities, draw_figures = capsule_head.capabilities, capsule_head.draw_figures

so CapsNet and Efficient-CapsNet share it without inheriting from each other (the layers stay
attributes of the model, so parameter trees and checkpoints keep their layout).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections

from capsjax import routing
from capsjax.common import traced_settings
from capsjax.common.errors import UsageError
from capsjax.models import losses, metrics
from capsjax.models.outputs import Outputs

SCORES = ("auto", "lengths", "activations")


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


def check_scores(config: ml_collections.ConfigDict, router: routing.Router) -> None:
  """Raises UsageError for a ``config.class_capsules.scores`` the router cannot give."""
  scores = config.class_capsules.get("scores", "auto")
  if scores not in SCORES:
    raise UsageError(f"config.model.class_capsules.scores must be one of {SCORES}, "
                     f"got {scores!r}.")
  if scores == "activations" and not router.yields_activations:
    raise UsageError(f"config.model.class_capsules.scores='activations' but router "
                     f"{router.name!r} computes no parent activations; use 'lengths' or 'auto'.")


@dataclasses.dataclass(frozen=True)
class CapsuleHead:
  """The head's settings (hashable: a static attribute of the model).

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
    scores = config.class_capsules.get("scores", "auto")  # .get: configs before the switch.
    by_activations = router.yields_activations and scores != "lengths"
    return cls(config.num_classes, by_activations, router.squashes and not by_activations,
               loss or LossSettings())


def resolve_config(config: ml_collections.ConfigDict) -> None:
  """Writes the router's settings in effect into ``config.routing`` (``config`` is the run's
  resolved copy of ``config.model``: :func:`capsjax.training.tasks.resolve_config`)."""
  routing.fill(config.routing)


# --- The model's methods (``self`` is the capsule model). ---

def call(self, images: jax.Array, labels: jax.Array | None = None, *, train: bool = False,
         diagnostics: bool = False, labels_per_example: int = 1,
         rng: jax.Array | None = None) -> Outputs:
  """Classifies and reconstructs.

  Args:
    images: ``(batch, h, w, c)`` floats in [0, 1].
    labels: ``(batch,)`` int class ids, or ``(batch, n)`` for n digits per image; required
      when ``train``.
    train: mask the decoder input by the labels (training, paper Sec. 4.1); otherwise by the
      predicted classes (evaluation).
    diagnostics: also return the router's per-iteration measurements.
    labels_per_example: how many classes to predict (and reconstruct) per image.
    rng: the key of routers that draw in training (``random``).
  """
  head: CapsuleHead = self.head
  primary = self.primary(images, train=train)
  routed = self.class_capsules.route(primary, train=train, rng=rng, diagnostics=diagnostics)
  class_capsules = routed.capsules
  lengths = routing.safe_norm(class_capsules, axis=-1)
  scores = routed.activations if head.scores_are_activations else lengths
  predictions = metrics.predictions(scores, labels_per_example)
  reconstructions = label_reconstructions = None
  if self.decoder is not None:
    if train and labels is None:
      raise ValueError("A capsule model (train=True) masks the decoder by the labels: pass "
                       "labels.")
    reconstructions = decode(self, class_capsules, labels if train else predictions)
    if labels_per_example > 1 and labels is not None:  # Sec. 6: each digit its own target.
      label_reconstructions = (reconstructions if train
                               else decode(self, class_capsules, labels))
  return Outputs(scores=scores, predictions=predictions,
                 log_probabilities=jax.nn.log_softmax(scores),
                 score_kind="activations" if head.scores_are_activations else "lengths",
                 class_capsules=class_capsules, lengths=lengths,
                 reconstructions=reconstructions, label_reconstructions=label_reconstructions,
                 diagnostics=routed.diagnostics if diagnostics else None)


def decode(self, class_capsules: jax.Array, class_ids: jax.Array) -> jax.Array:
  """Decodes given capsule vectors (e.g. perturbed ones, paper Fig. 4), the others masked.

  Args:
    class_capsules: ``(batch, num_classes, capsule_dim)``.
    class_ids: ``(batch,)``, the capsule of each example to decode; or ``(batch, n)`` to
      decode n capsules one at a time (MultiMNIST), giving ``(batch, n, h, w, c)``.
  """
  if self.decoder is None:
    raise ValueError("This model has no decoder (config.model.decoder.enabled=False).")
  if class_ids.ndim == 2:
    return jnp.stack([decode(self, class_capsules, class_ids[:, k])
                      for k in range(class_ids.shape[1])], axis=1)
  return self.decoder(class_capsules, jax.nn.one_hot(class_ids, self.head.num_classes))


def apply(self, batch: dict, *, train: bool, rng: jax.Array | None = None) -> Outputs:
  """Outputs for a batch; the decoder is masked by the labels in training, by the prediction
  otherwise, and evaluation also measures routing. ``rng`` is used only by routers that draw
  (``random``)."""
  labels = batch["labels"]
  return call(self, batch["images"], labels if train or labels.ndim == 2 else None,
              train=train, diagnostics=not train,
              labels_per_example=labels.shape[1] if labels.ndim == 2 else 1, rng=rng)


def vote_scores(self, batch: dict) -> jax.Array:
  """The class scores that the vote attack of Gu, Wu & Tresp (ICLR 2021, "Effective and
  efficient vote attack on capsule networks", Sec. 4) differentiates, in evaluation mode.

  The votes u_hat_{j|i} of every child for each class capsule are averaged with equal weights,
  with no routing and no bias, and squashed (Eq. 1): ``v_j = squash(mean_i u_hat_{j|i})``; the
  scores are the lengths ``|v_j|``, ``(batch, num_classes)``. Their code (JindongGu/VoteAttack,
  ``models/rout.py``, ``Vote_Attack``) does exactly this, and then takes the logarithm of the
  lengths normalised to sum to 1 as log-probabilities; capsjax's attacks take
  ``log_softmax(scores)`` for the surrogate as for the model itself (:class:`Outputs`), so the
  vote attack and the attack through the routing differ only in the routing. Whatever the
  router (self-attention, self-routing, ...), Eq. 1's squash is used, as in their definition.
  """
  primary = self.primary(batch["images"], train=False)
  votes = self.class_capsules.votes(primary.poses)  # (batch, in_caps, out_caps, out_dim)
  return routing.safe_norm(routing.squash(jnp.mean(votes, axis=1)), axis=-1)


def loss(self, outputs: Outputs, batch: dict, *, step: jax.Array | None = None
         ) -> tuple[jax.Array, dict]:
  """Margin loss (Eq. 4) + weight x summed squared reconstruction error, per example.

  The reconstruction target is ``batch["reconstruction_targets"]`` (the clean images, or with
  several digits per image, Sec. 6, each digit's own image, reconstructed from the capsule of
  its label; the sums are added), not the input: an attack that moves the input of a batch
  completed by :meth:`capsjax.training.tasks.Task.complete_batch` leaves it. A batch without
  targets is refused (it is never the images silently: those may be an attack's). ``step`` is
  unused (no schedule)."""
  del step
  s = self.head.loss_settings
  # A vectorised sweep's runs may differ in these (capsjax/common/traced_settings.py).
  setting = lambda name: traced_settings.value(f"loss.{name}", getattr(s, name))
  margin = losses.margin_loss_per_example(outputs.scores, batch["labels"],
                                          m_plus=setting("m_plus"),
                                          m_minus=setting("m_minus"), lam=setting("lam"))
  several = batch["labels"].ndim == 2
  reconstructions = outputs.label_reconstructions if several else outputs.reconstructions
  weight = setting("reconstruction_weight")
  if reconstructions is not None and (traced_settings.is_traced("loss.reconstruction_weight")
                                      or weight):
    if "reconstruction_targets" not in batch:
      raise ValueError("the batch has no 'reconstruction_targets' to reconstruct: complete it "
                       "with capsjax.training.tasks.Task.complete_batch (the dataset's clean "
                       "images) before moving its images.")
    targets = batch["reconstruction_targets"]
    recon = losses.reconstruction_loss_per_example(reconstructions, targets, weight=weight)
  else:
    recon = jnp.zeros_like(margin)
  return margin + recon, {"margin_loss": margin, "reconstruction_loss": recon}


def metrics_of(self, outputs: Outputs, batch: dict) -> dict:
  """Per example: ``accuracy`` (0/1; with several labels, the highest scores are exactly the
  labels, and ``at_least_one``); for routers that squash the class capsules, their saturation
  (``class_capsule_length``, ``saturated_fraction``:
  :func:`capsjax.models.metrics.capsule_saturation`); and, when measured (evaluation), the
  router's diagnostics under its names (dynamic routing: ``coupling_entropy``,
  ``coupling_max``, ``logit_change``, ``preactivation_norm``), ``(batch, iterations)`` each."""
  result = metrics.label_sets_correct(outputs.scores, batch["labels"])
  if self.head.measures_saturation:
    result.update(metrics.capsule_saturation(outputs.lengths))
  if outputs.diagnostics:
    result.update(outputs.diagnostics)
  return result


def capabilities(self) -> frozenset[str]:
  """What this model can do beyond the contract: ``reconstruction`` (with a decoder:
  ``decode``, reconstruction figures), ``routing_diagnostics``, ``saturation`` (the
  ``saturated_fraction`` metric and its warning), ``votes`` (:func:`vote_scores`)."""
  found = {"routing_diagnostics", "votes"}
  if self.decoder is not None:
    found.add("reconstruction")
  if self.head.measures_saturation:
    found.add("saturation")
  return frozenset(found)


def monitors(self, config: ml_collections.ConfigDict, chance: float) -> list:
  """The run's watches over the train metrics: the saturation warning
  (``config.train.saturation_warning``) for heads that measure saturation."""
  if not self.head.measures_saturation:
    return []
  from capsjax.training import monitors as monitors_lib

  settings = config.train.get("saturation_warning") or {}  # Configs before it: defaults.
  return [monitors_lib.SaturationWatch(
      fraction=settings.get("fraction", 0.9), steps=settings.get("steps", 100),
      settings=self.saturation_settings, chance=chance)]


def draw_figures(model, batch: dict, workdir: str, writer, step: int) -> None:
  """The head's figures of a test batch (``model`` is a
  :class:`capsjax.training.run_figures.JittedModel`): reconstructions and paper Fig. 4, or with two
  labels per image Fig. 5."""
  from capsjax.models import capsule_figures

  if "reconstruction" not in model.capabilities:
    return
  if batch["labels"].ndim == 2:
    capsule_figures.draw_pair_reconstructions(workdir, model, batch, writer, step)
  else:
    capsule_figures.draw_reconstructions(workdir, model, batch, writer, step)
