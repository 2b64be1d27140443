"""Efficient-CapsNet's convolutions written several ways, timed forward and forward + backward.

  python experiments/conv_formulations.py --batch_size=128
  XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT \
      python experiments/conv_formulations.py --batch_size=128 --forms=native,im2col

Not a sweep: the measurements behind ``capsjax.models.layers.conv2d``'s ``"auto"`` choice on
CPU (docs/notes/performance_log.md, "Efficient-CapsNet against Keras 3, and XLA:CPU's
convolutions against oneDNN's"). For each of the four
convolutions of the backbone (28x28x1 -> 32@5x5 -> 64@3x3 -> 64@3x3 -> 128@3x3 stride 2, VALID),
the median over repeats of the jitted forward and of the gradient of ``sum(sin(conv(x, w)))``
with respect to input and kernel, per form:

* ``native``: one ``lax.conv_general_dilated`` (XLA's convolution and its gradients);
* ``im2col``: the patch matrix and one matmul (``layers.conv2d(..., "im2col")``, the default);
* ``shifted``: the sum over the kernel offsets of a shifted view times that offset's
  ``(in, out)`` weights: no patch matrix, k*k smaller matmuls;
* ``chunked``: ``im2col`` over chunks of ``--chunk`` images by ``lax.map`` (cache-sized patches);
* ``split``: a custom VJP: im2col forward, the input gradient as XLA's transposed convolution,
  the kernel gradient as the saved patches times the output gradient;
* ``winograd`` / ``winograd4``: Winograd's F(2x2, 3x3) / F(4x4, 3x3) for the 3x3 stride-1
  convolutions (``capsjax/models/winograd.py``, its own custom VJP), im2col for the others;
* ``tensorflow``: ``tf.nn.conv2d`` in a ``tf.function`` (oneDNN on x86), if TensorFlow is
  installed: the reference of ``experiments/keras_efficient_capsnet.py``.

Every JAX form's gradients are checked against ``native``'s (largest relative difference
printed). The process restarts itself with capsjax's malloc tunables, as the benchmark does.
"""

import functools
import json
import os
import time

from absl import app, flags, logging

FORMS = ("native", "im2col", "shifted", "chunked", "split", "winograd", "winograd4",
         "tensorflow")
SHAPES = (("conv1", 28, 1, 32, 5, 1), ("conv2", 24, 32, 64, 3, 1),
          ("conv3", 22, 64, 64, 3, 1), ("conv4", 20, 64, 128, 3, 2))

_BATCH = flags.DEFINE_integer("batch_size", 128, "Images per call.")
_FORMS = flags.DEFINE_list("forms", list(FORMS), f"Which of {FORMS}.")
_CHUNK = flags.DEFINE_integer("chunk", 16, "Images per chunk of the 'chunked' form.")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Timed calls per measurement (median).")


def jax_forms(chunk: int) -> dict:
  import jax
  import jax.numpy as jnp

  from capsjax.models import layers

  def im2col(x, w, s):
    return layers.conv2d(x, w, s, "im2col")

  def shifted(x, w, s):
    kh, kw = w.shape[:2]
    oh, ow = (x.shape[1] - kh) // s + 1, (x.shape[2] - kw) // s + 1
    terms = [jnp.einsum("bhwc,co->bhwo",
                        x[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s], w[i, j])
             for i in range(kh) for j in range(kw)]
    return functools.reduce(jnp.add, terms)

  def chunked(x, w, s):
    parts = x.reshape(x.shape[0] // chunk, chunk, *x.shape[1:])
    y = jax.lax.map(lambda part: im2col(part, w, s), parts)
    return y.reshape(x.shape[0], *y.shape[2:])

  @functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
  def split(x, w, s):
    return im2col(x, w, s)

  def split_forward(x, w, s):
    kh, kw, _, cout = w.shape
    oh, ow = (x.shape[1] - kh) // s + 1, (x.shape[2] - kw) // s + 1
    patches = layers.im2col_patches(x, kh, kw, s)
    return (patches @ w.reshape(-1, cout)).reshape(x.shape[0], oh, ow, cout), (patches, x, w)

  def split_backward(s, residuals, dy):
    patches, x, w = residuals
    kh, kw, _, cout = w.shape
    dx = jax.vjp(lambda x: layers.conv2d(x, w, s, "native"), x)[1](dy)[0]
    return dx, (patches.T @ dy.reshape(-1, cout)).reshape(w.shape)

  split.defvjp(split_forward, split_backward)
  native = lambda x, w, s: layers.conv2d(x, w, s, "native")
  return {"native": native, "im2col": im2col, "shifted": shifted, "chunked": chunked,
          "split": split, "winograd": lambda x, w, s: layers.conv2d(x, w, s, "winograd"),
          "winograd4": lambda x, w, s: layers.conv2d(x, w, s, "winograd4")}


def median_ms(fn, repeats: int) -> float:
  import numpy as np

  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1e3 * float(np.median(times))


def time_jax(form, batch: int, repeats: int) -> dict:
  import jax
  import jax.numpy as jnp

  from capsjax.models import layers

  native = lambda x, w, s: layers.conv2d(x, w, s, "native")

  rows = {}
  for name, size, cin, cout, k, s in SHAPES:
    x = jax.random.normal(jax.random.PRNGKey(0), (batch, size, size, cin))
    w = 0.1 * jax.random.normal(jax.random.PRNGKey(1), (k, k, cin, cout))
    loss = lambda x, w, f: jnp.sum(jnp.sin(f(x, w, s)))
    forward = jax.jit(lambda x, w: form(x, w, s))
    gradient = jax.jit(jax.grad(lambda x, w: loss(x, w, form), (0, 1)))
    reference = jax.grad(lambda x, w: loss(x, w, native), (0, 1))(x, w)
    error = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
                for a, b in zip(gradient(x, w), reference))
    rows[name] = {
        "forward_ms": median_ms(lambda: forward(x, w).block_until_ready(), repeats),
        "forward_backward_ms": median_ms(lambda: jax.block_until_ready(gradient(x, w)),
                                         repeats),
        "gradient_relative_error": error}
  return rows


def time_tensorflow(batch: int, repeats: int) -> dict:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf

  rows = {}
  for name, size, cin, cout, k, s in SHAPES:
    x = tf.random.normal((batch, size, size, cin))
    w = tf.Variable(0.1 * tf.random.normal((k, k, cin, cout)))
    forward = tf.function(lambda x: tf.nn.conv2d(x, w, s, "VALID"))

    @tf.function
    def gradient(x):
      with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.sin(tf.nn.conv2d(x, w, s, "VALID")))
      return tape.gradient(loss, [x, w])

    rows[name] = {
        "forward_ms": median_ms(lambda: forward(x).numpy(), repeats),
        "forward_backward_ms": median_ms(lambda: [g.numpy() for g in gradient(x)], repeats)}
  return rows


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  unknown = sorted(set(_FORMS.value) - set(FORMS))
  if unknown:
    raise app.UsageError(f"--forms: unknown {unknown}; choose from {FORMS}.")
  if "chunked" in _FORMS.value and _BATCH.value % _CHUNK.value:
    raise app.UsageError(f"--batch_size={_BATCH.value} must be a multiple of "
                         f"--chunk={_CHUNK.value}.")
  results = {}
  for name in _FORMS.value:
    rows = (time_tensorflow(_BATCH.value, _REPEATS.value) if name == "tensorflow" else
            time_jax(jax_forms(_CHUNK.value)[name], _BATCH.value, _REPEATS.value))
    results[name] = rows
    total = sum(r["forward_backward_ms"] for r in rows.values())
    cells = "  ".join(f"{layer} {r['forward_ms']:.1f}/{r['forward_backward_ms']:.1f}"
                      for layer, r in rows.items())
    print(f"{name:>10} (forward/forward+backward ms): {cells}  total {total:.1f}", flush=True)
  print(json.dumps({"batch_size": _BATCH.value, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                    "results": results}))


def restart_with_malloc_tuning() -> None:
  """This script again, with capsjax's glibc malloc tunables (capsjax/runs/hostmemory.py)."""
  import sys

  from capsjax.runs import hostmemory

  environ = hostmemory.tuned_environment(dict(os.environ))
  if environ is not None and sys.executable:
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]],
              environ)


if __name__ == "__main__":
  restart_with_malloc_tuning()
  app.run(main)
