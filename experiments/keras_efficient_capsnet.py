"""Efficient-CapsNet in Keras 3 (TensorFlow), the reference side of capsjax's speed comparison.

  python experiments/keras_efficient_capsnet.py --batch_size=128 --seconds=20
  python experiments/keras_efficient_capsnet.py --batch_size=16 --jit_compile=false

Not a sweep: a benchmark. It builds the network of the authors' Keras code (EscVM/Efficient-
CapsNet, ``models/efficient_capsnet_graph_mnist.py`` and ``utils/layers.py``) with Keras 3 layers,
written here from that code and not from capsjax (1,573,168 trainable parameters: 161,824 in the
capsule network, 1,411,344 in the decoder), and times its training step as a performance-minded
user would run it: one ``tf.function`` with ``GradientTape`` and Keras' Adam, the batch already a
tensor, random MNIST-shaped images and labels, margin loss (0.9, 0.1, 0.5) + 0.392 x the mean
squared error of the reconstruction of the true class's capsule. ``--jit_compile`` compiles the
step with XLA (TensorFlow's own choice is off). The last line printed is one JSON object; compare
it with ``python -m capsjax.benchmark --config=configs/efficient_capsnet.py
--config.train.batch_size=B`` in the same session (docs/performance.md).
"""

import json
import os
import platform
import time

from absl import app, flags, logging

_BATCH = flags.DEFINE_integer("batch_size", 128, "Images per training step.")
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Minimum time to measure the rate over.")
_JIT = flags.DEFINE_boolean("jit_compile", True, "Compile the train step with XLA.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the random batch.")
_DEPTHWISE = flags.DEFINE_boolean(
    "depthwise", True, "Primary capsules by DepthwiseConv2D (the same function as the authors' "
    "Conv2D(groups=128), faster in TensorFlow); false: the authors' layer.")


def build_model():
  """The authors' ``efficient_capsnet_graph`` plus the decoder of their ``build_graph``."""
  import keras
  import tensorflow as tf
  from keras import layers

  class PrimaryCaps(layers.Layer):
    """Depthwise ``k x k`` conv over ``(k, k, f)`` -> ``(n, d)`` capsules, squashed."""

    def __init__(self, filters, kernel, n, d):
      super().__init__()
      self.conv = (layers.DepthwiseConv2D(kernel, padding="valid") if _DEPTHWISE.value else
                   layers.Conv2D(filters, kernel, groups=filters, padding="valid"))
      self.n, self.d = n, d

    def call(self, x):
      s = tf.reshape(self.conv(x), (-1, self.n, self.d))
      norm = tf.norm(s, axis=-1, keepdims=True)
      return (1 - 1 / tf.math.exp(norm)) * (s / (norm + 1e-20))

  class FCCaps(layers.Layer):
    """Self-attention routing of ``utils/layers.py``'s FCCaps."""

    def __init__(self, n, d):
      super().__init__()
      self.n, self.d = n, d

    def build(self, input_shape):
      in_n, in_d = input_shape[-2], input_shape[-1]
      self.w = self.add_weight(shape=(self.n, in_n, in_d, self.d), initializer="he_normal")
      self.b = self.add_weight(shape=(self.n, in_n, 1), initializer="zeros")

    def call(self, x):
      u = tf.einsum("...ji,kjiz->...kjz", x, self.w)
      c = tf.einsum("...ij,...kj->...i", u, u)[..., None] / tf.sqrt(float(self.d))
      c = tf.nn.softmax(c, axis=1) + self.b
      s = tf.reduce_sum(u * c, axis=-2)
      norm = tf.norm(s, axis=-1, keepdims=True)
      return (1 - 1 / tf.math.exp(norm)) * (s / (norm + 1e-20))

  images = keras.Input((28, 28, 1))
  x = images
  for filters, kernel, stride in ((32, 5, 1), (64, 3, 1), (64, 3, 1), (128, 3, 2)):
    x = layers.Conv2D(filters, kernel, stride, activation="relu", padding="valid",
                      kernel_initializer="he_normal")(x)
    x = layers.BatchNormalization()(x)
  class_capsules = FCCaps(10, 16)(PrimaryCaps(128, 9, 16, 8)(x))
  capsnet = keras.Model(images, class_capsules)
  decoder = keras.Sequential([
      keras.Input((160,)),
      layers.Dense(512, activation="relu", kernel_initializer="he_normal"),
      layers.Dense(1024, activation="relu", kernel_initializer="he_normal"),
      layers.Dense(784, activation="sigmoid", kernel_initializer="glorot_normal")])
  return capsnet, decoder


def trainable_parameters(*models) -> int:
  return sum(int(w.numpy().size) for m in models for w in m.trainable_weights)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import keras
  import tensorflow as tf

  keras.utils.set_random_seed(_SEED.value)
  capsnet, decoder = build_model()
  optimizer = keras.optimizers.Adam(5e-4)
  variables = capsnet.trainable_variables + decoder.trainable_variables
  batch = _BATCH.value
  rng = tf.random.Generator.from_seed(_SEED.value)
  images = tf.cast(rng.uniform((batch, 28, 28, 1), 0, 256, tf.int32), tf.float32) / 255.0
  labels = tf.one_hot(rng.uniform((batch,), 0, 10, tf.int32), 10)

  @tf.function(jit_compile=_JIT.value)
  def train_step(images, labels):
    with tf.GradientTape() as tape:
      capsules = capsnet(images, training=True)
      lengths = tf.norm(capsules, axis=-1)
      margin = (labels * tf.square(tf.maximum(0.0, 0.9 - lengths))
                + 0.5 * (1 - labels) * tf.square(tf.maximum(0.0, lengths - 0.1)))
      masked = tf.reshape(capsules * labels[..., None], (-1, 160))
      reconstruction = decoder(masked, training=True)
      mse = tf.reduce_mean(tf.square(reconstruction - tf.reshape(images, (-1, 784))), axis=-1)
      loss = tf.reduce_mean(tf.reduce_sum(margin, axis=-1) + 0.392 * mse)
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  start = time.perf_counter()
  train_step(images, labels).numpy()
  compile_s = time.perf_counter() - start
  train_step(images, labels).numpy()
  steps, start = 0, time.perf_counter()
  while steps < 3 or time.perf_counter() - start < _SECONDS.value:
    loss = train_step(images, labels)
    steps += 1
  loss = float(loss.numpy())
  seconds = (time.perf_counter() - start) / steps
  result = {
      "framework": f"tensorflow {tf.__version__}, keras {keras.__version__}",
      "jit_compile": _JIT.value, "batch_size": batch,
      "trainable_parameters": trainable_parameters(capsnet, decoder),
      "compile_s": round(compile_s, 2), "steps": steps, "s_per_step": round(seconds, 4),
      "train_images_per_s": round(batch / seconds, 1), "last_loss": loss,
      "cpu": platform.processor() or platform.machine(),
      "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
  }
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
