"""Which devices JAX found, and a warning when the machine has an accelerator JAX is not using.

``pip install -e .`` gives JAX's CPU build; on a GPU or TPU machine a run would then train on the
CPU, slowly, without a word. Every run prints :func:`describe` and, when an accelerator is present
but JAX found only CPU devices, the :func:`cpu_fallback_warning` naming the install that fixes it.
"""

from __future__ import annotations

import os

# Files whose presence means the machine has the accelerator, and the extra that installs it.
ACCELERATOR_FILES = (
    ("/proc/driver/nvidia/version", "an NVIDIA GPU", "cuda12"),
    ("/dev/nvidia0", "an NVIDIA GPU", "cuda12"),
    ("/dev/accel0", "a TPU", "tpu"),
    ("/dev/vfio/0", "a TPU", "tpu"),
)


def describe() -> str:
  """``backend gpu: 8 x NVIDIA H100 ... in 2 processes`` for the banner."""
  import jax

  devices = jax.devices()
  kinds = sorted({d.device_kind for d in devices})
  return (f"JAX {jax.__version__}, backend {jax.default_backend()}: {len(devices)} x "
          f"{', '.join(kinds)} in {jax.process_count()} process(es)")


def present_accelerator(files=ACCELERATOR_FILES) -> tuple[str, str, str] | None:
  """``(what, evidence path, pip extra)`` of an accelerator this machine has, or None."""
  return next(((what, path, extra) for path, what, extra in files if os.path.exists(path)), None)


def cpu_fallback_warning(backend: str, files=ACCELERATOR_FILES) -> str | None:
  """The warning to print when ``backend`` is the CPU on a machine with an accelerator."""
  found = present_accelerator(files)
  if backend != "cpu" or found is None or os.environ.get("JAX_PLATFORMS", "") == "cpu":
    return None
  what, path, extra = found
  return (f"Warning: this machine has {what} ({path} exists) but JAX found only CPU devices, "
          f"so this run trains on the CPU. Install JAX's accelerator build, e.g. "
          f"pip install -e \".[{extra}]\" (README, Install and data), or set "
          "JAX_PLATFORMS=cpu to silence this.")
