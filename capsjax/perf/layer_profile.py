"""Where a compiled step spends its time, per layer of the model: ``benchmark --profile``.

The model's submodules are named in the traced program (a ``jax.named_scope`` per module call,
its attribute path in the model, e.g. ``convs.2`` or ``decoder``), the compiled step runs under
JAX's profiler, and each executed XLA op's time goes to the module whose scope its HLO metadata
names, forward or backward (an op of the backward pass carries ``transpose(...)`` in its name).
Ops outside every module (loss, optimiser, data shuffling and augmentation) are a row of their
own. Works for any model of the registry, for a device's ops (GPU) as for the CPU's thunks.

On a GPU, XLA replays runs of kernels as CUDA graphs ("command buffers"), and the profiler
records a graph as one event that names no layer: EM routing's whole step (a ``fori_loop`` per
capsule layer) came out as 99.8% "outside modules" on an H100. A profiled process therefore
runs without them (:func:`without_command_buffers`), which changed that step's time by 2%.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import glob
import inspect
import re
import tempfile
from typing import Callable, Iterator, NamedTuple

import jax
from flax import nnx

SCOPE_PREFIX = "module."
OUTSIDE = "(outside modules: loss, optimiser, data)"
COMMAND_BUFFER_FLAG = "--xla_gpu_enable_command_buffer"


def without_command_buffers(xla_flags: str) -> str:
  """``xla_flags`` (the ``XLA_FLAGS`` value) with XLA:GPU's command buffers turned off, unless
  it sets them already (the user's choice stands). The flag is known to every XLA backend and
  read when the first backend starts, so it must be set before that; the CPU ignores it."""
  if COMMAND_BUFFER_FLAG in xla_flags:
    return xla_flags
  return " ".join(filter(None, [xla_flags, COMMAND_BUFFER_FLAG + "="]))


@contextlib.contextmanager
def module_scopes(model_class: type, model: nnx.Module) -> Iterator[None]:
  """While open, each submodule's ``__call__`` (and other public methods) traced under
  ``model_class``'s ``apply`` runs in ``jax.named_scope("module.<path>")``, ``<path>`` its
  attribute path (``convs.0``). The persistent compilation cache is off meanwhile.

  The classes are patched, not instances: the train step builds new instances inside the
  trace (``nnx.merge``), so the paths are read from the instance ``apply`` is called on.
  ``model``: an instance (abstract is enough) that lists the submodule classes."""
  paths: dict[int, str] = {}
  classes = {type(m) for p, m in nnx.iter_modules(model) if p}
  originals = {(cls, name): method for cls in classes for name, method in vars(cls).items()
               if inspect.isfunction(method) and (name == "__call__" or not name.startswith("_"))}
  original_apply = model_class.apply
  inherited = "apply" not in vars(model_class)

  @functools.wraps(original_apply)
  def apply(self, *args, **kwargs):
    paths.clear()
    paths.update({id(m): ".".join(map(str, p)) for p, m in nnx.iter_modules(self) if p})
    return original_apply(self, *args, **kwargs)

  def scoped(method: Callable) -> Callable:
    @functools.wraps(method)
    def call(self, *args, **kwargs):
      path = paths.get(id(self))
      with contextlib.nullcontext() if path is None else jax.named_scope(SCOPE_PREFIX + path):
        return method(self, *args, **kwargs)
    return call

  # A persistent compilation cache keys programs without their metadata: a program compiled
  # before, without the scopes, would come back unnamed.
  cache = jax.config.jax_enable_compilation_cache
  try:
    jax.config.update("jax_enable_compilation_cache", False)
    model_class.apply = apply
    for (cls, name), method in originals.items():
      setattr(cls, name, scoped(method))
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
    if inherited:
      del model_class.apply
    else:
      model_class.apply = original_apply
    for (cls, name), method in originals.items():
      setattr(cls, name, method)


def op_layers(hlo_text: str, depth: int = 2) -> dict[str, tuple[str, str]]:
  """``{instruction name: (module path, "forward" | "backward")}`` for the instructions of an
  optimised HLO module's text that carry an ``op_name``; the path is the innermost module
  scope, cut to ``depth`` parts (``decoder.layers.0`` -> ``decoder.layers``)."""
  found = {}
  for name, op_name in re.findall(r'%?([\w.\-]+) = [^\n]*?metadata=\{[^}]*?op_name="([^"]*)"',
                                  hlo_text):
    scopes = re.findall(re.escape(SCOPE_PREFIX) + r"([\w.]+)", op_name)
    layer = ".".join(scopes[-1].split(".")[:depth]) if scopes else OUTSIDE
    found[name] = (layer, "backward" if "transpose(" in op_name else "forward")
  return found


def trace_ops(run: Callable[[], None], repeats: int) -> tuple[dict[str, float], float]:
  """From a profiler trace of ``repeats`` calls of ``run``: the seconds per call spent in each
  XLA op (by HLO instruction name), and the number of op executions per call: the events that
  name an HLO op on the accelerators' planes (kernels launched) where the trace has such
  planes, else on the host's (the CPU's thunks)."""
  launches = 0
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    try:
      for _ in range(repeats):
        run()
    finally:
      jax.profiler.stop_trace()
    files = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    profile = jax.profiler.ProfileData.from_file(files[-1])
  total = collections.defaultdict(float)
  planes = list(profile.planes)
  on_devices = any(plane.name.startswith("/device:") for plane in planes)
  for plane in planes:
    for line in plane.lines:
      events = [(event.start_ns, event.duration_ns, str(stats["hlo_op"]))
                for event in line.events if "hlo_op" in (stats := dict(event.stats))]
      if plane.name.startswith("/device:") or not on_devices:
        launches += len(events)
      for op, ns in self_times(events).items():
        total[op] += ns / 1e9 / repeats
  return dict(total), launches / repeats


def self_times(events: list[tuple[float, float, str]]) -> dict[str, float]:
  """``{op: summed self time}`` for one thread's ``(start, duration, op)`` events: an event
  less the events nested in it. A loop's op (``while``) spans its body's ops on the same
  thread (measured on the CPU: 5.42 ms around 5.36 ms of body ops), so counting whole
  durations counted a loop's layer twice."""
  total = collections.defaultdict(float)
  open_events: list[tuple[float, str]] = []  # (end, op), innermost last.
  for start, duration, op in sorted(events, key=lambda e: (e[0], -e[1])):
    while open_events and open_events[-1][0] <= start:
      open_events.pop()
    if open_events:  # Nested in the innermost open event: not that event's own time.
      total[open_events[-1][1]] -= min(duration, open_events[-1][0] - start)
    total[op] += duration
    open_events.append((start + duration, op))
  return dict(total)


class Row(NamedTuple):
  layer: str
  forward_ms: float
  backward_ms: float
  share: float
  bytes_share: float | None = None  # Of the bytes the program moves (hlo_traffic).


def layer_table(seconds: dict[str, float], layers: dict[str, tuple[str, str]],
                per: int = 1, bytes_by_op: dict[str, float] | None = None) -> list[Row]:
  """Rows by layer, slowest first: forward and backward ms (divided by ``per``, the steps in
  one call), the share of all op time and, given ``bytes_by_op``
  (:func:`capsjax.perf.hlo_traffic.program_traffic`), the share of all bytes moved. Ops
  without metadata count as outside modules."""
  times = collections.defaultdict(lambda: [0.0, 0.0])
  for op, s in seconds.items():
    layer, direction = layers.get(op, (OUTSIDE, "forward"))
    times[layer][direction == "backward"] += s / per
  moved = collections.defaultdict(float)
  for op, n in (bytes_by_op or {}).items():
    moved[layers.get(op, (OUTSIDE, "forward"))[0]] += n
  for layer in moved:
    times[layer]  # A layer that moves bytes in ops too short to be seen still gets a row.
  total = sum(f + b for f, b in times.values()) or 1.0
  total_bytes = sum(moved.values()) or 1.0
  rows = [Row(layer, 1e3 * f, 1e3 * b, (f + b) / total,
              moved[layer] / total_bytes if bytes_by_op is not None else None)
          for layer, (f, b) in times.items()]
  return sorted(rows, key=lambda r: -(r.forward_ms + r.backward_ms))


def format_table(rows: list[Row], step_seconds: float) -> str:
  """The rows as a markdown table, with the measured wall time of a step."""
  with_bytes = any(r.bytes_share is not None for r in rows)
  lines = [f"per-layer time of one train step (wall {1e3 * step_seconds:.1f} ms; op times "
           "summed over threads, so they can exceed it)",
           "| layer | forward ms | backward ms | share |" + (" bytes share |" if with_bytes
                                                           else ""),
           "|---|---|---|---|" + ("---|" if with_bytes else "")]
  lines += [f"| {r.layer} | {r.forward_ms:.2f} | {r.backward_ms:.2f} | {100 * r.share:.1f}% |"
            + (f" {100 * (r.bytes_share or 0.0):.1f}% |" if with_bytes else "") for r in rows]
  return "\n".join(lines)
