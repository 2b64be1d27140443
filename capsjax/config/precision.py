"""``config.matmul_precision``: the arithmetic of float32 matmuls and convolutions.

JAX's default on NVIDIA GPUs since Ampere (A100, H100) lets float32 matmuls and convolutions run
in TensorFloat-32 (10 explicit mantissa bits, products accumulated in float32); on TPUs in
bfloat16 passes; on CPUs in float32. The authors' code of 2017 ran on GPUs without TF32, in
float32 throughout, so ``"float32"`` is how its numbers were computed, and ``"default"`` (the
default) is the device's fastest, as every earlier capsjax run on a GPU.

The setting holds for everything a command computes (the train step and its gradients, custom
backward passes included, every evaluation and figure): the commands enter :func:`scope` around
the whole of their work, and JAX keys its compiled programs by it. ``model.compute_dtype`` is
another thing: the dtype the layers store and compute in (``"bfloat16"``).
"""

from __future__ import annotations

import contextlib

import jax
import ml_collections

from capsjax.config import run_settings
from capsjax.config import settings

PRECISIONS = run_settings.PRECISIONS  # capsjax's names for JAX's precisions.
SETTINGS = run_settings.MATMUL_PRECISION


def of(config: ml_collections.ConfigDict) -> str:
  """The run's ``matmul_precision`` (its default where the config has none; UsageError naming
  a value that is not one of :data:`PRECISIONS`)."""
  return settings.read(config, SETTINGS, "config")["matmul_precision"]


def check(config: ml_collections.ConfigDict) -> None:
  """UsageError naming ``config.matmul_precision`` when it is not one of :data:`PRECISIONS`."""
  of(config)


def scope(config: ml_collections.ConfigDict) -> contextlib.AbstractContextManager:
  """The context that computes with ``config``'s precision: enter it around everything a
  command traces, so that backward passes traced after the forward one (custom VJPs) are in
  it too. Nothing for ``"default"``."""
  value = of(config)
  return contextlib.nullcontext() if value == "default" else jax.default_matmul_precision(value)


def group_scope(configs) -> contextlib.AbstractContextManager:
  """:func:`scope` of runs that train as one program (a vectorised group): ValueError when
  they differ in precision (the planner keeps such runs apart)."""
  values = {of(c) for c in configs}
  if len(values) > 1:
    raise ValueError(f"Runs computed in one program must share config.matmul_precision; "
                     f"got {sorted(values)}.")
  return scope(configs[0])
