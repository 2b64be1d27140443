"""A researcher's own dataset and model, named by import path in the vectorised-sweep tests
(tests/test_vectorize.py): settings that only their ``load()`` or initialisation read.

    config.dataset = "tests/data/researcher_modules.py:FlippedMNIST"
    config.model.name = "tests/data/researcher_modules.py:LinearClassifier"
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from capsjax import datasets
from capsjax.config.settings import Setting
from capsjax.datasets import mnist
from capsjax.models import Outputs


class FlippedMNIST(mnist.MNIST):
  """MNIST whose first ``data.flip_fraction`` of training digits are mirrored left-right, and
  whose test digits are turned upside down when ``data.flip_test`` is 1 (the issue's case:
  floats read only while loading data; the second only for an evaluation set)."""
  SETTINGS = {**mnist.MNIST.SETTINGS,
              "data.flip_fraction": Setting(0.0, "The share of training digits mirrored."),
              "data.flip_test": Setting(0.0, "1: the test digits upside down.")}

  def load(self) -> dict[str, datasets.Split]:
    splits = super().load()
    d = self.config.data
    train = splits["train"].examples["images"]
    n = int(round(float(d.flip_fraction) * len(train)))
    splits["train"].examples["images"] = np.concatenate([train[:n, :, ::-1], train[n:]])
    if float(d.flip_test) == 1.0:
      test = splits["test"].examples
      test["images"] = np.ascontiguousarray(test["images"][:, ::-1])
    return splits


def flipped_config(base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``base`` (an MNIST config, changed in place: a copy would lose its unset placeholders)
  on :class:`FlippedMNIST`, nothing flipped."""
  config = base
  config.dataset = f"{__file__}:FlippedMNIST"
  config.data.flip_fraction = 0.0
  config.data.flip_test = 0.0
  return config


def get_config(arg=None):
  """configs/mnist.py:smoke on :class:`FlippedMNIST` (for ``--config`` and experiments)."""
  import pathlib
  import sys

  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "configs"))
  import mnist as mnist_config
  return flipped_config(mnist_config.get_config(arg or "smoke"))


class LinearClassifier(nnx.Module):
  """Softmax regression on the pixels, its weights drawn with std ``model.init_std`` (declared
  initialisation-only) and its logits divided by ``model.temperature`` (read by every step,
  declared nothing)."""

  init_only_settings = ("model.init_std",)

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    m = config.model
    h, w, c = m.image_shape
    self.dense = nnx.Linear(h * w * c, m.num_classes,
                            kernel_init=nnx.initializers.normal(float(m.init_std)), rngs=rngs)
    self.temperature = float(m.temperature)

  @classmethod
  def from_config(cls, config, *, rngs: nnx.Rngs) -> "LinearClassifier":
    return cls(config, rngs=rngs)

  def apply(self, batch: dict, *, train: bool, rng=None) -> Outputs:
    del train, rng
    images = batch["images"]
    logits = self.dense(images.reshape(images.shape[0], -1)) / self.temperature
    return Outputs(scores=jax.nn.softmax(logits), predictions=jnp.argmax(logits, axis=-1),
                   log_probabilities=jax.nn.log_softmax(logits), logits=logits)

  def loss(self, outputs: Outputs, batch: dict, *, step=None):
    del step
    nll = -jnp.take_along_axis(outputs.log_probabilities, batch["labels"][:, None], 1)[:, 0]
    return nll, {"cross_entropy": nll}

  def metrics(self, outputs: Outputs, batch: dict) -> dict:
    return {"accuracy": (outputs.predictions == batch["labels"]).astype(jnp.float32)}


def linear_config(base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``base`` (changed in place) with :class:`LinearClassifier` as its model."""
  config = base
  placeholder = ml_collections.config_dict.placeholder
  config.model = ml_collections.ConfigDict(dict(
      name=f"{__file__}:LinearClassifier", image_shape=placeholder(tuple),
      num_classes=placeholder(int), init_std=0.01, temperature=1.0))
  return config
