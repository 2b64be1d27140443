"""The model interface of capsule models built on the capsule head: a backbone composed with
a :class:`capsjax.models.capsule_head.CapsuleHead`.

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

Each method below is one call of the head's (go-to-definition leads from here to the code
that runs); the head's layers are attributes of the model, so parameter trees and
checkpoints have the layout ``class_capsules/...``, ``decoder/...``.
"""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from capsjax.models.capsule_head import CapsuleHead, LossSettings
from capsjax.models.capsule_layers import Capsules, ClassCapsules
from capsjax.models.layers import Decoder
from capsjax.models.outputs import Outputs


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
