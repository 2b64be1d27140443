"""The platform programs are built for: the one thing every choice made by backend reads.

Some of capsjax's programs differ by backend: ``conv_impl="auto"`` computes a convolution as im2col
on a CPU, as polyphase (strided, larger than 3x3) or natively on a GPU and natively on a TPU
(:func:`capsjax.models.layers.conv2d`; depthwise ones likewise), and
:func:`capsjax.training.vectorize.default_min_runs` and the initialisation's compiler options
(``capsjax.training.setup.INIT_COMPILER_OPTIONS``) depend on it too. Each reads :func:`target`:
JAX's default backend, or the platform of the innermost :func:`building_for`. ``jax.export`` lowers
a program for a GPU or a TPU on a machine without one, but ``jax.default_backend()`` still says
``"cpu"`` while it does; so a GPU's or TPU's program is built on the CPU as that device builds it
inside ``building_for("cuda")`` / ``("tpu")`` (tests/test_accelerator_programs.py lowers every
shipped config's train and evaluation steps so).

Trace the functions inside the block: a jitted function traced before for another platform
may be served from JAX's cache, which knows nothing of this setting.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import jax

# jax.export's platform names (and JAX's backend names) -> the backend as
# jax.default_backend() names it, what the choices compare with.
BACKENDS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}

_building: contextvars.ContextVar[str | None] = contextvars.ContextVar("capsjax_building_for",
                                                                      default=None)


def target() -> str:
  """The backend the programs traced now are for, as ``jax.default_backend()`` names it (``"cpu"``,
  ``"gpu"``, ``"tpu"``): the innermost :func:`building_for`'s, else JAX's default backend."""
  return _building.get() or jax.default_backend()


@contextlib.contextmanager
def building_for(platform: str) -> Iterator[str]:
  """Within the block, :func:`target` is ``platform`` (a ``jax.export`` platform: ``"cpu"``,
  ``"cuda"``, ``"rocm"``, ``"tpu"``; or ``"gpu"``), as a backend name: e.g. ``"gpu"`` for
  ``"cuda"``, which it yields. Raises ValueError for another name."""
  if platform not in BACKENDS:
    raise ValueError(f"building_for: platform must be one of {tuple(BACKENDS)}, "
                     f"got {platform!r}.")
  token = _building.set(BACKENDS[platform])
  try:
    yield BACKENDS[platform]
  finally:
    _building.reset(token)
