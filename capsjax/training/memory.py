"""Whether a train step fits in the device's memory, known before it runs.

:class:`CompiledSteps` refuses a step whose memory (:func:`new_memory_bytes`, from XLA's
analysis of the compiled step) would not fit before it runs, and an allocation failure while it
runs becomes the same error (:class:`OutOfMemory`, a UsageError that says what to change): no
traceback, nothing of the run written.
"""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Callable

import jax

from capsjax.common import files
from capsjax.common.errors import UsageError


class OutOfMemory(UsageError):
  """A train step needs more memory than the device has free."""


def available_memory_bytes(device: jax.Device | None = None) -> int | None:
  """Free memory for a program on ``device``: the accelerator's allocator limit less what is in
  use, or on a CPU the least of the host's available memory (``MemAvailable``) and what the
  process's own limits leave (:func:`process_limit_bytes`); None if unknown."""
  device = device or jax.local_devices()[0]
  stats = device.memory_stats() or {}
  if "bytes_limit" in stats:
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  known = [n for n in (host_available_bytes(), process_limit_bytes()) if n is not None]
  return min(known) if known else None


def host_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
  """The host's ``MemAvailable`` in bytes (the file gives kB); None if unreadable."""
  return _kilobytes_field(meminfo, "MemAvailable:")


def process_limit_bytes(proc: str = "/proc/self", cgroup_root: str = "/sys/fs/cgroup"
                        ) -> int | None:
  """What this process may still allocate under the limits a cluster scheduler sets: its
  address-space limit (``RLIMIT_AS``, ``ulimit -v``) less its virtual size, and its memory
  cgroup's limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, at its level or any level
  above) less that cgroup's usage. The least of them; None where none is set."""
  left = []
  soft, _ = resource.getrlimit(resource.RLIMIT_AS)
  size = _kilobytes_field(os.path.join(proc, "status"), "VmSize:")
  if soft != resource.RLIM_INFINITY and size is not None:
    left.append(soft - size)
  left += cgroup_left_bytes(os.path.join(proc, "cgroup"), cgroup_root)
  return max(0, min(left)) if left else None


# (limit file, usage file) of cgroup v2 and v1; v1 writes "no limit" as a number near 2**63.
_CGROUP_FILES = (("memory.max", "memory.current"),
                 ("memory.limit_in_bytes", "memory.usage_in_bytes"))
_NO_LIMIT = 2 ** 60


def cgroup_left_bytes(cgroup_file: str, root: str) -> list[int]:
  """``limit - usage`` of each memory cgroup level that sets a limit, from the process's own
  (``/proc/self/cgroup``: ``0::PATH`` in v2, ``N:memory:PATH`` in v1) up to the root."""
  try:
    with open(cgroup_file) as f:
      lines = f.read().splitlines()
  except OSError:
    return []
  left = []
  for line in lines:
    _, controllers, path = line.split(":", 2)
    if controllers == "":
      mount = root if os.path.exists(os.path.join(root, "cgroup.controllers")) else \
          os.path.join(root, "unified")
    elif "memory" in controllers.split(","):
      mount = os.path.join(root, "memory")
    else:
      continue
    level = path.strip("/")
    while True:
      directory = os.path.join(mount, level)
      for limit_file, usage_file in _CGROUP_FILES:
        limit = _read_int(os.path.join(directory, limit_file))
        usage = _read_int(os.path.join(directory, usage_file))
        if limit is not None and usage is not None and limit < _NO_LIMIT:
          left.append(limit - usage)
      if not level:
        break
      level = os.path.dirname(level)
  return left


def _read_int(path: str) -> int | None:
  """The integer in a one-line file; None if absent, unreadable or not a number ("max")."""
  try:
    with open(path) as f:
      return int(f.read().strip())
  except (OSError, ValueError):
    return None


def _kilobytes_field(path: str, field: str) -> int | None:
  """A ``kB`` field of a ``/proc`` file (``/proc/meminfo``, ``/proc/PID/status``) in bytes."""
  try:
    with open(path) as f:
      for line in f:
        if line.startswith(field):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def new_memory_bytes(compiled) -> int | None:
  """What a compiled program allocates when it runs, per device: outputs that do not reuse
  an input's buffer, and temporaries (its inputs are already allocated)."""
  memory = compiled.memory_analysis()
  if memory is None:
    return None
  return int(memory.output_size_in_bytes - memory.alias_size_in_bytes + memory.temp_size_in_bytes)


def format_bytes(n: float) -> str:
  return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def advice(config, need: int | None = None, free: int | None = None) -> str:
  """What to change for a train step that does not fit (``config`` resolved), with a batch size
  that would: the largest power of two at most ``batch x free / need`` where the need is known
  (a step's memory grows about in proportion to its batch), else half the batch."""
  batch = config.train.batch_size
  smaller = max(1, batch // 2)
  if need and free is not None and need > free:
    smaller = 2 ** max(0, int(batch * free / need).bit_length() - 1)
  dtype = ("set --config.model.compute_dtype=bfloat16, "
           if config.model.get("compute_dtype") == "float32" else "")
  dispatch = (f"lower --config.train.steps_per_dispatch={config.train.steps_per_dispatch} "
              "(its steps' metrics are kept), "
              if config.train.steps_per_dispatch > 1 else "")
  return (f"Lower --config.train.batch_size={batch} (e.g. to {smaller}), "
          f"{dispatch}{dtype}or run on more devices (the batch is split over them).")


def is_out_of_memory(error: BaseException) -> bool:
  """Whether ``error`` is an allocation failure: XLA's ``RESOURCE_EXHAUSTED`` or Python's
  MemoryError (NumPy under an address-space limit). A failed file write is never one, though
  TensorStore (under Orbax) words a full disk ``RESOURCE_EXHAUSTED`` too: memory and disk are
  told apart by the error (:func:`capsjax.common.files.is_file_write_error`), not by that word."""
  if files.is_file_write_error(error):
    return False
  return (isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in str(error)
          or "Out of memory" in str(error))


@contextlib.contextmanager
def advice_on_allocation_failure(config, what: str = "The run"):
  """Turns an allocation failure anywhere inside (loading data, compiling, a step whose
  failure surfaces when its results are read, an evaluation) into :class:`OutOfMemory`:
  one line of advice, no traceback. What the run saved stays, so the same command resumes."""
  try:
    yield
  except OutOfMemory:
    raise
  except Exception as e:
    if not is_out_of_memory(e):
      raise  # A full disk among them: named where it was written, or by cli.clear_errors.
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise OutOfMemory(f"{what} ran out of memory ({first[:300]}). {advice(config)} What it "
                      "saved is kept: the same command resumes from its last checkpoint.") from None


class CompiledSteps:
  """``fn(*args, num_steps)`` of a jitted step ``fn(*args, num_steps)`` (``num_steps`` its last,
  static argument; the other arguments' shapes fixed), compiled once per ``num_steps`` and
  checked against the device's free memory before its first run (:class:`OutOfMemory`, naming
  ``what`` and the config's remedies)."""

  def __init__(self, jitted: Callable, config, what: str = "The train step",
               memory_limit: Callable[[], int | None] | None = None):
    """``memory_limit``: the free bytes per device (default :func:`available_memory_bytes`)."""
    self.jitted, self.config, self.what = jitted, config, what
    self.memory_limit = memory_limit or (lambda: available_memory_bytes())
    self._compiled: dict[int, object] = {}

  def prepare(self, *args):
    """The program for ``args`` (the last: ``num_steps``), compiled and its memory checked."""
    num_steps = args[-1]
    if num_steps not in self._compiled:
      compiled = self.jitted.lower(*args).compile()
      need, free = new_memory_bytes(compiled), self.memory_limit()
      if need is not None and free is not None and need > free:
        raise OutOfMemory(
            f"{self.what} needs {format_bytes(need)} per device beyond the state and data it "
            f"holds (batch {self.config.train.batch_size}, {num_steps} step(s) per dispatch); "
            f"the device has {format_bytes(free)} free. {advice(self.config, need, free)}")
      self._compiled[num_steps] = compiled
    return self._compiled[num_steps]

  def __call__(self, *args):
    compiled = self.prepare(*args)
    try:
      return compiled(*args[:-1])
    except Exception as e:
      if is_out_of_memory(e):
        raise OutOfMemory(f"{self.what} ran out of device memory ({str(e).splitlines()[0]}). "
                          f"{advice(self.config)}") from None
      raise
