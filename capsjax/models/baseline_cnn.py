"""The paper's baseline CNN (Sec. 5, Table 1), registered as ``"baseline_cnn"``.

"Three convolutional layers of 256, 256, 128 channels. Each has 5x5 kernels and stride of 1. The
last convolutional layers are followed by two fully connected layers of size 328, 192. The last
fully connected layer is connected with dropout to a 10 class softmax layer with cross entropy
loss." With SAME padding, ReLU and no pooling that is 35,445,522 parameters at 28x28x1, the paper's
35.4M. For affNIST the paper compares against "a traditional convolutional model with a similar
number of parameters which had been trained with max pooling and dropout": the same module with
``pool`` and ``hidden`` set in ``configs/affnist.py:baseline``. The paper gives no dropout rate or
initialisation; the defaults are 0.5 and LeCun normal.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from capsjax.common.errors import UsageError
from capsjax.config.settings import NON_NEGATIVE, POSITIVE, Setting, at_least, between, each
from capsjax.config.settings import one_of
from capsjax.models import SHAPE_SETTINGS, layers, losses, metrics
from capsjax.models.outputs import Outputs

# "cross_entropy": the paper's softmax cross-entropy. "margin": the official code's baseline
# (its default loss_type): the margin loss of Eq. 4 on the raw logits, 0.5 x a mean over the
# classes (0.05 x Eq. 4's sum), as the code's layers._margin_loss and evaluate reduce it.
LOSSES = ("cross_entropy", "margin")
MARGIN_SCALE = 0.05

# ``config.model`` of the baseline CNN (configs/mnist_baseline.py has the paper's text's).
SETTINGS = {
    **SHAPE_SETTINGS,
    "model.conv_features": Setting(kind=tuple, meaning="Channels of each convolution, ReLU.",
                                   check=each(at_least(1))),
    "model.kernel_size": Setting(kind=int, meaning="The convolutions' kernel side.",
                                 check=POSITIVE),
    "model.pool": Setting(kind=tuple, meaning="Max pooling after each convolution (0 or 1: "
                          "none).", check=each(NON_NEGATIVE)),
    "model.hidden": Setting(kind=tuple, meaning="Fully connected widths, ReLU.",
                            check=each(at_least(1))),
    "model.dropout_rate": Setting(kind=float, meaning="Before the softmax layer (the paper "
                                  "gives none).", check=between(0, 1, open_high=True)),
    "model.padding": Setting(kind=str, meaning="The convolutions' padding (the official "
                             "code's: VALID).", check=one_of(*layers.PADDINGS)),
    "model.init_scale": Setting(kind=float, meaning=layers.INIT_SCALE, check=NON_NEGATIVE,
                                init_only=True),
    "model.dense_init_scale": Setting(None, "The dense layers'; unset: init_scale.",
                                      kind=float | None, check=NON_NEGATIVE, init_only=True),
    "model.bias_init": Setting(kind=float, meaning="Every bias's initial value (the official "
                               "code's 0.1).", init_only=True),
    "model.loss": Setting(kind=str, meaning="\"cross_entropy\"; \"margin\": the official "
                          "code's, on the logits.", check=one_of(*LOSSES)),
    "model.conv_impl": layers.CONV_IMPL,
    "model.compute_dtype": layers.COMPUTE_DTYPE,
}


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises UsageError naming the ``config.model`` key that cannot work with the others."""
  if not tuple(config.conv_features) or not tuple(config.hidden):
    raise UsageError(f"config.model.conv_features and hidden must not be empty, got "
                     f"{tuple(config.conv_features)!r} and {tuple(config.hidden)!r}.")
  pool = tuple(config.pool)
  if len(pool) != len(tuple(config.conv_features)):
    raise UsageError(f"config.model.pool must give a max-pooling size (0 or 1: none) for each "
                     f"of the {len(tuple(config.conv_features))} convolutions, got {pool!r}.")


class BaselineCNN(nnx.Module):
  """Convolutions (SAME or VALID, stride 1, ReLU, optional max pooling) -> fully connected ReLU
  layers -> dropout -> linear class scores; softmax cross-entropy (or the code's margin loss)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    """``config`` is ``config.model`` (its keys: :data:`SETTINGS`)."""
    validate_config(config)
    dtype = layers.COMPUTE_DTYPES[config.compute_dtype]
    h, w, channels = config.image_shape
    convs = []
    for features, pool in zip(config.conv_features, config.pool):
      convs.append(layers.Conv2D(channels, features, config.kernel_size, 1,
                                 padding=config.padding, impl=config.conv_impl,
                                 compute_dtype=dtype, init_scale=config.init_scale,
                                 bias_init=config.bias_init, rngs=rngs))
      channels = features
      if config.padding == "VALID":
        h, w = h - config.kernel_size + 1, w - config.kernel_size + 1
      if pool > 1:  # SAME max pooling, as the official baseline: ceil(size / pool).
        h, w = -(-h // pool), -(-w // pool)
    self.convs = nnx.List(convs)
    self.pool = tuple(config.pool)
    sizes = [h * w * channels, *config.hidden, config.num_classes]
    dense_scale = (config.init_scale if config.dense_init_scale is None
                   else config.dense_init_scale)
    self.dense = nnx.List([
        nnx.Linear(a, b, dtype=dtype, kernel_init=layers.kernel_init(dense_scale),
                   bias_init=nnx.initializers.constant(config.bias_init), rngs=rngs)
        for a, b in zip(sizes, sizes[1:])])
    self.dropout = nnx.Dropout(config.dropout_rate)
    self.loss_kind = config.loss

  SETTINGS = SETTINGS

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs) -> "BaselineCNN":
    return cls(config.model, rngs=rngs)

  validate_config = staticmethod(validate_config)

  def __call__(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
               labels_per_example: int = 1) -> Outputs:
    """``images`` ``(batch, h, w, c)``; ``rng`` drives dropout when ``train``. With several
    labels per example the scores are per-class sigmoids and the predictions the top ones."""
    x = images
    for conv, pool in zip(self.convs, self.pool):
      x = jax.nn.relu(conv(x))
      if pool > 1:
        x = nnx.max_pool(x, (pool, pool), strides=(pool, pool), padding="SAME")
    x = x.reshape(x.shape[0], -1)
    for layer in self.dense[:-1]:
      x = jax.nn.relu(layer(x))
    x = self.dropout(x, deterministic=not train, rngs=rng if train else None)
    logits = self.dense[-1](x).astype(jnp.float32)
    scores = jax.nn.softmax(logits) if labels_per_example == 1 else jax.nn.sigmoid(logits)
    return Outputs(scores=scores, predictions=metrics.predictions(logits, labels_per_example),
                   log_probabilities=jax.nn.log_softmax(logits), score_kind="probabilities",
                   logits=logits)

  # --- The task interface (capsjax.models). ---

  def apply(self, batch: dict, *, train: bool, rng: jax.Array | None = None) -> Outputs:
    labels = batch["labels"]
    return self(batch["images"], train=train, rng=rng,
                labels_per_example=labels.shape[1] if labels.ndim == 2 else 1)

  def loss(self, outputs: Outputs, batch: dict, *, step: jax.Array | None = None
           ) -> tuple[jax.Array, dict]:
    """Softmax cross-entropy per example; with several labels per example (MultiMNIST), the
    per-class sigmoid cross-entropy against the k-hot target, summed over classes; with
    ``loss="margin"``, the official code's margin loss on the raw logits (:data:`LOSSES`)."""
    del step
    labels = batch["labels"]
    if self.loss_kind == "margin":  # Every labelled class present (T_k = 1).
      margin = MARGIN_SCALE * losses.margin_loss_per_example(outputs.logits, labels)
      return margin, {"margin_loss": margin}
    if labels.ndim == 1:
      ce = optax.softmax_cross_entropy_with_integer_labels(outputs.logits, labels)
      return ce, {"cross_entropy": ce}
    k_hot = jnp.minimum(jnp.sum(jax.nn.one_hot(labels, outputs.logits.shape[-1]), axis=1), 1.0)
    bce = jnp.sum(optax.sigmoid_binary_cross_entropy(outputs.logits, k_hot), axis=-1)
    return bce, {"sigmoid_cross_entropy": bce}

  def metrics(self, outputs: Outputs, batch: dict) -> dict:
    return metrics.label_sets_correct(outputs.scores, batch["labels"])


MODEL = BaselineCNN
