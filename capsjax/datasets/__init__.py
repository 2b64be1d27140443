"""Datasets registered by name: ``config.dataset`` picks one, ``config.data`` configures it.

A dataset is a :class:`Builder` subclass named in :data:`DATASETS`. It reads its splits once into
host memory (:meth:`Builder.load`); the trainer puts them on the devices and, inside the jitted
step, asks the builder to turn the examples of a step into a batch (:meth:`Builder.train_batch`:
augmentation, synthetic data) or to turn evaluation examples into a batch
(:meth:`Builder.eval_batch`: deterministic). A batch is a dict with at least ``images`` (floats,
``(batch, *info.image_shape)``) and ``labels``; what a model should reconstruct is the builder's
``reconstruction_targets`` (the clean images by default).

A builder declares the ``config.data`` keys it reads as ``SETTINGS`` (``{"data.key":
Setting(...)}``, :mod:`capsjax.config.settings`; those of the files it reads:
``capsjax.datasets.sources.SETTINGS``) and the rules between them as ``RULES``; a run refuses any
other key of ``config.data`` and checks every value before anything is compiled. A builder
without ``SETTINGS`` gets ``config.data`` unchecked. To add a dataset (a module
``capsjax/datasets/NAME.py`` with ``DATASET = TheBuilder``; the train loop does not change):
docs/extending.md.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import ClassVar

import jax
import ml_collections
import numpy as np

from capsjax.config import settings
from capsjax.config import registries, schema
from capsjax.datasets.augment import to_float  # noqa: F401 (public here)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What a model needs to know about the data.

  Attributes:
    image_shape: ``(h, w, c)`` of the batches' images (after preprocessing).
    num_classes: labels lie in ``[0, num_classes)``.
    labels_per_example: 1 for classification, 2 for MultiMNIST-style pairs.
  """
  image_shape: tuple[int, int, int]
  num_classes: int
  labels_per_example: int = 1


@dataclasses.dataclass
class Split:
  """One split on the host.

  Attributes:
    examples: arrays with one row per example (same leading size), e.g.
      ``images`` uint8 ``(n, h, w, c)`` and ``labels`` int32 ``(n,)``.
    shared: arrays every example may index (e.g. the base digits that
      generated pairs refer to); not sliced into batches.
    ids: each example's position in the split of the source it was read from, ``(n,)``
      (MNIST's test digit 17 is 17 in the IDX file, wherever a sample or a held-out split put
      it); None: its position here. Kept on the host: runs record them beside their
      predictions, so that two runs are compared digit by digit (:mod:`capsjax.runs.predictions`).
    source_size: how many examples that source split holds (its halves are the first and the
      last ``source_size // 2`` ids); None: ``len(self)``.
  """
  examples: dict[str, np.ndarray]
  shared: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  ids: np.ndarray | None = None
  source_size: int | None = None

  def __len__(self) -> int:
    return len(next(iter(self.examples.values()))) if self.examples else 0

  def source_ids(self) -> np.ndarray:
    """``ids``, or ``0..n-1`` for a split that does not record them."""
    return np.arange(len(self)) if self.ids is None else np.asarray(self.ids)

  def source_count(self) -> int:
    return len(self) if self.source_size is None else int(self.source_size)

  def take(self, rows: np.ndarray) -> "Split":
    """The examples at ``rows`` (an index array), their ids and ``shared`` kept."""
    return Split({k: v[rows] for k, v in self.examples.items()}, self.shared,
                 self.source_ids()[rows], self.source_count())

  def first(self, n: int) -> "Split":
    """The first ``n`` examples (all if ``n`` is 0 or larger than the split)."""
    if not n or n >= len(self):
      return self
    return self.take(np.arange(n))

  def sample(self, n: int, seed: int = 0) -> "Split":
    """``n`` examples drawn without replacement with a fixed ``seed``, in their order (all if
    ``n`` is 0 or larger than the split): a fair sample of a split whatever its order
    (MultiMNIST's test pairs are digit-major, so its first pairs all share one digit). The
    first ``n`` of one permutation, so that samples nest: runs of two limits share all of the
    smaller one's examples (a comparison of them is on those)."""
    if not n or n >= len(self):
      return self
    return self.take(np.sort(np.random.default_rng(seed).permutation(len(self))[:n]))

  def with_examples(self, **arrays: np.ndarray) -> "Split":
    """The same examples with some arrays replaced (e.g. shifted ``images``), ids kept."""
    return Split({**self.examples, **arrays}, self.shared, self.ids, self.source_size)


class Builder:
  """Base class of dataset builders (the module docstring). Subclasses set ``info`` in
  ``__init__`` and implement :meth:`load`; the defaults of :meth:`train_batch` and
  :meth:`eval_batch` serve image/label datasets without augmentation."""
  name: ClassVar[str] = ""
  info: DatasetInfo
  SETTINGS: ClassVar[dict | None] = None   # ``config.data``'s keys it reads, declared.
  RULES: ClassVar[tuple] = ()

  def __init__(self, config: ml_collections.ConfigDict):
    """``config`` is the whole run config (``config.data`` and ``config.model``)."""
    self.config = config

  def describe(self) -> str:
    """What a run trains on, for its banner: the builder's name, where the files are read
    from and how the images are padded (the settings ``config.data.source``, ``dir`` and
    ``pad`` mean this for every builder that has them)."""
    d, text = self.config.data, self.name
    if d.get("source") == "idx":
      text += f" (IDX files in {d.dir})"
    if d.get("pad"):
      text += f" (padded by {d.pad} px)"
    return text

  def load(self) -> dict[str, Split]:
    """Host arrays of the splits: ``train``, ``test`` and, if held out, ``validation``."""
    raise NotImplementedError

  def train_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
    """Per-example shapes and dtypes of the train split (random stand-ins for benchmarks)."""
    return {"images": jax.ShapeDtypeStruct(self.info.image_shape, np.uint8),
            "labels": jax.ShapeDtypeStruct((), np.int32)}

  def train_shared(self, examples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``shared`` arrays of a train split with these ``examples`` (default none)."""
    del examples
    return {}

  def eval_split_like(self, split: Split) -> Split:
    """An evaluation split made from a train ``split`` (benchmarks time :meth:`eval_batch` on
    random stand-ins). The default serves datasets whose evaluation examples look like their
    train examples."""
    return split

  def train_batch(self, key: jax.Array, indices: jax.Array, examples: dict, shared: dict) -> dict:
    """The batch of train examples ``indices``, built inside the jitted step.

    Args:
      key: this step's key for augmentation.
      indices: ``(batch,)`` rows of the train split.
      examples, shared: the train split's arrays, on the devices.
    """
    del key, shared
    return {"images": to_float(examples["images"][indices]), "labels": examples["labels"][indices]}

  def stream_copies(self) -> int:
    """How many copies of each train example in a row ``data.order="stream"`` reads
    (:mod:`capsjax.datasets.stream_order`); 0: the builder has no such stream."""
    return 0

  def train_stream_batch(self, key: jax.Array, indices: jax.Array, copies: jax.Array,
                         examples: dict, shared: dict) -> dict:
    """The batch of copy ``copies[k]`` of train example ``indices[k]``, inside the jitted step
    (builders whose :meth:`stream_copies` is above 0)."""
    raise NotImplementedError(f"dataset {self.name!r} has no stream of copies")

  def eval_batch(self, examples: dict, shared: dict) -> dict:
    """A deterministic batch from a slice of an evaluation split's examples. ``images`` may be
    uint8 pixels (as the splits hold them) or floats in [0, 1] (images an attack or a
    generator made), which are taken as they are."""
    del shared
    return {"images": to_float(examples["images"]), "labels": examples["labels"]}

  # What a model that reconstructs its input should reconstruct from a batch: None, its clean
  # ``images``; a builder whose targets differ (MultiMNIST: each digit alone) defines
  # ``reconstruction_targets(self, batch) -> array``. :meth:`capsjax.training.tasks.Task.
  # complete_batch` stores them as ``batch["reconstruction_targets"]``, apart from the images
  # that go into the network (which an attack may move).
  reconstruction_targets: ClassVar = None


DATASETS = registries.DATASETS  # The table: capsjax/config/registries.py


def names() -> tuple[str, ...]:
  return DATASETS.names()


def get(config: ml_collections.ConfigDict) -> Builder:
  """The builder ``config.dataset`` names, constructed from ``config``. A resolved config
  (:func:`capsjax.config.schema.resolve_config`) holds every setting of ``config.data`` in
  effect and the class found (:attr:`capsjax.config.schema.ResolvedConfig.choices`); any other
  has the ones the builder declares read first (their defaults filled in, each value checked:
  :func:`capsjax.config.settings.read`)."""
  if isinstance(config, schema.ResolvedConfig):
    return config.choices.dataset(config)
  cls = DATASETS.get(config.dataset)
  if cls.SETTINGS is None:
    return cls(config)
  table = {key.split(".", 1)[1]: s for key, s in cls.SETTINGS.items() if key.startswith("data.")}
  config = copy.deepcopy(config)
  with config.unlocked():
    config.data.update(settings.read(config.data, table, "config.data"))
  return cls(config)
