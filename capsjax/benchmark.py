"""Measures training and evaluation speed against the device's bounds (a roofline).

  python -m capsjax.benchmark --config=configs/mnist.py [--config.train.batch_size=32 ...]

In one process, after compilation: train-step and eval-step images/s at the configured batch,
compile time, XLA's temp memory for the train step, and the step against the two bounds of
the device it runs on:

* compute: the train step's FLOPs per image (XLA's cost analysis of the program before
  optimisation where the backend gives one, as the CPU's does; else of the optimised program,
  a lower bound: ``flops_source``) at the measured rate of a dense f32 matmul on the same
  device (``matmul_gflop_per_s``); ``compute_fraction`` (also ``peak_fraction``, its earlier
  name) is the time that takes over the measured step time;
* memory: the bytes per image the compiled step moves (``bytes_per_image``: every kernel's
  operands and output, loops multiplied by their trip counts,
  :mod:`capsjax.runs.hlo_traffic`; XLA's own ``bytes accessed`` before and after optimisation
  are reported beside it, ``xla_bytes_per_image_*``, but count a loop's body once) at the
  measured bandwidth of an elementwise pass over a large array (``copy_gb_per_s``, bytes read
  plus written); ``memory_fraction`` likewise.

``bound`` names the larger of the two times; a step far above both (fractions well below 1)
is bound by neither: launch latency, host work or poorly shaped kernels. With ``--profile``,
also the ops executed per step (``launches_per_step``: kernels on a GPU, thunks on the CPU)
and a per-layer table of time and bytes. The last line printed is one JSON object with these
numbers. Data are random bytes already on the device, through the same jitted step that
training uses.
"""

import json
import os
import time

from absl import app, flags, logging
from ml_collections import config_flags

from capsjax.common.errors import UsageError
from capsjax.runs import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Minimum time to measure each rate over.")
_MATMUL_SIZE = flags.DEFINE_integer("matmul_size", 0,
                                    "n of the n x n matmul; 0: 2048 on CPU, 8192 elsewhere.")
_COPY_MB = flags.DEFINE_integer(
    "copy_mb", 0, "MiB of the array the bandwidth is measured on; 0: 64 on CPU, 1024 elsewhere "
    "(well beyond the caches).")
_PROFILE = flags.DEFINE_boolean(
    "profile", False, "Also print the train step's time per layer (forward and backward ms, "
    "share), from a JAX profiler trace (on a GPU without XLA's command buffers, so that each "
    "kernel is seen).")
_PROFILE_DEPTH = flags.DEFINE_integer(
    "profile_depth", 2, "Parts of a module's path a --profile row keeps (decoder.layers.0 at 2: "
    "decoder.layers).")
_RUNS = flags.DEFINE_list(
    "runs", [], "Instead: train images/s summed over N runs trained as one vectorised program "
    "(capsjax.sweep --vectorize), for each N listed (e.g. 1,2,4,8); N=1 is the ordinary step, "
    "and N runs one by one would sum to its rate.")
flags.mark_flags_as_required(["config"])


def _time_repeated(fn, min_seconds: float, min_repeats: int = 3) -> float:
  """Seconds per call of ``fn`` (which blocks), over at least ``min_seconds``."""
  fn()  # Warm-up.
  repeats, start = 0, time.perf_counter()
  while repeats < min_repeats or time.perf_counter() - start < min_seconds:
    fn()
    repeats += 1
  return (time.perf_counter() - start) / repeats


def _first(cost):
  """A cost analysis as one dict: some JAX versions give one per partition."""
  return cost[0] if isinstance(cost, (list, tuple)) else cost


def _flops(lowered) -> tuple[float, str]:
  """FLOPs of a lowered program and where the count comes from: XLA's cost analysis of the
  program before optimisation where the backend gives one (the CPU does; JAX 0.11's GPU backend
  gives none), else of the optimised program, in which a GPU's cuDNN convolutions count as no
  FLOPs (a lower bound, named as such)."""
  cost = _first(lowered.cost_analysis())
  if cost and "flops" in cost:
    return float(cost["flops"]), "xla_cost_analysis_before_optimisation"
  cost = _first(lowered.compile().cost_analysis())
  return float(cost["flops"]), "xla_cost_analysis_after_optimisation_lower_bound"


def matmul_gflop_per_s(n: int, min_seconds: float) -> float:
  """Rate of an ``n x n`` f32 matmul on the default device (chained, so it is not cached)."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32) / n ** 0.5
  step = jax.jit(lambda x: x @ a)
  x = [a]

  def run():
    x[0] = step(x[0])
    x[0].block_until_ready()

  return 2 * n ** 3 / _time_repeated(run, min_seconds) / 1e9


def copy_gb_per_s(num_bytes: int, min_seconds: float) -> float:
  """Bandwidth of an elementwise pass over an f32 array of ``num_bytes`` on the default device
  (each call reads it and writes a new one: 2 x ``num_bytes`` moved; chained, so it is not
  cached), in GB/s."""
  import jax
  import jax.numpy as jnp

  x = [jnp.zeros((num_bytes // 4,), jnp.float32)]
  step = jax.jit(lambda v: v * 0.5 + 1.0)

  def run():
    x[0] = step(x[0])
    x[0].block_until_ready()

  return 2 * (num_bytes // 4) * 4 / _time_repeated(run, min_seconds) / 1e9


def _xla_bytes(cost) -> float | None:
  cost = _first(cost)
  return float(cost["bytes accessed"]) if cost and "bytes accessed" in cost else None


def roofline(flops_per_image: float, bytes_per_image: float, images_per_second: float,
             matmul_gflop_per_s: float, copy_gb_per_s: float) -> dict:
  """The step against the device's two bounds: the seconds per image its FLOPs take at the
  matmul rate and its bytes at the bandwidth, each over the measured seconds per image
  (``compute_fraction``, ``memory_fraction``), and which bound is the larger (``bound``)."""
  compute = flops_per_image / (matmul_gflop_per_s * 1e9)
  memory = bytes_per_image / (copy_gb_per_s * 1e9)
  return {"compute_fraction": compute * images_per_second,
          "memory_fraction": memory * images_per_second,
          "bound": "compute" if compute >= memory else "memory"}


def run_benchmark(config, min_seconds: float = 20.0, matmul_size: int = 0,
                  profile_depth: int = 0, copy_mb: int = 0) -> dict:
  """The measurements of the module docstring as a dict; with ``profile_depth > 0`` also
  ``layer_profile``, the rows of :func:`capsjax.runs.layer_profile.layer_table` (and
  ``layer_profile_table``, their markdown)."""
  import contextlib
  import resource

  import jax

  from capsjax.runs import hlo_traffic, layer_profile

  devices = jax.devices()
  batch = config.train.batch_size
  num_steps = config.train.steps_per_dispatch
  runtime, split, state = _random_data_runtime(config)
  examples, shared = runtime.on_devices(split)

  train_step = runtime.make_train_step()
  start = time.perf_counter()
  scopes = (layer_profile.module_scopes(runtime.task.model_class, runtime.task.abstract_model)
            if profile_depth else contextlib.nullcontext())
  with scopes:  # Named scopes only label ops: the computation is the same.
    compiled = train_step.lower(state, examples, shared, num_steps).compile()
  compile_seconds = time.perf_counter() - start
  # XLA's cost analysis counts a loop's body once: with steps fused by lax.scan it would give
  # the FLOPs of one step, not of num_steps. So they are counted on a single step, and on the
  # program before XLA's optimisations: after them, a GPU's convolutions are cuDNN custom calls
  # that the analysis counts as no FLOPs (the paper model's 1.23 GFLOP per image read 0.024 on
  # an H200), while before them every backend counts the same program.
  single = train_step.lower(state, examples, shared, 1)
  flops, flops_source = _flops(single)
  # The program before partitioning is the whole batch's, on however many devices.
  flops_per_image = flops / batch
  # Bytes: the compiled program as it runs (num_steps steps, loops multiplied out), the
  # whole batch's on one device; on several, each device's program moves its share.
  traffic = hlo_traffic.program_traffic(compiled.as_text())
  bytes_per_image = traffic.total_bytes * len(devices) / (batch * num_steps)
  xla_before = _xla_bytes(single.cost_analysis())
  xla_after = _xla_bytes(compiled.cost_analysis())  # Counts the steps' loop body once.
  memory = compiled.memory_analysis()
  temp_bytes = int(memory.temp_size_in_bytes) if memory is not None else None
  # What the step holds at once by XLA's buffer assignment: inputs, outputs (less those that
  # reuse an input's buffer) and temporaries.
  step_bytes = None if memory is None else int(
      memory.argument_size_in_bytes + memory.output_size_in_bytes
      - memory.alias_size_in_bytes + memory.temp_size_in_bytes)

  holder = [state]

  def train_once():
    holder[0], metrics = compiled(holder[0], examples, shared)
    jax.block_until_ready(metrics)

  train_seconds = _time_repeated(train_once, min_seconds)
  train_rate = batch * num_steps / train_seconds
  profiled = {}
  if profile_depth:
    seconds, launches = layer_profile.trace_ops(train_once, repeats=3)
    rows = layer_profile.layer_table(
        seconds, layer_profile.op_layers(compiled.as_text(), profile_depth), per=num_steps,
        bytes_by_op=traffic.bytes_by_op)
    profiled = {"launches_per_step": launches / num_steps,
                "layer_profile": [row._asdict() for row in rows],
                "layer_profile_table": layer_profile.format_table(rows,
                                                                  train_seconds / num_steps)}

  eval_batch = config.eval.batch_size
  eval_set = runtime.runner.eval_set(runtime.splits["test"].first(eval_batch),
                                     runtime.task.dataset.eval_batch)
  eval_seconds = _time_repeated(lambda: runtime.runner.evaluate(holder[0].variables, eval_set),
                                min_seconds / 2)
  eval_rate = eval_batch / eval_seconds

  n = matmul_size or (2048 if devices[0].platform == "cpu" else 8192)
  matmul_rate = matmul_gflop_per_s(n, min_seconds / 2)
  copy_bytes = (copy_mb or (64 if devices[0].platform == "cpu" else 1024)) * 2 ** 20
  copy_rate = copy_gb_per_s(copy_bytes, min_seconds / 2)
  train_gflops = flops_per_image * train_rate / 1e9
  return {
      "batch_size": batch,
      "steps_per_dispatch": num_steps,
      "train_seconds_per_step": train_seconds / num_steps,
      "train_images_per_second": train_rate,
      "eval_images_per_second": eval_rate,
      "train_gflop_per_image": flops_per_image / 1e9,
      "flops_source": flops_source,
      "train_gflop_per_s": train_gflops,
      "matmul_size": n,
      "matmul_gflop_per_s": matmul_rate,
      "peak_fraction": train_gflops / matmul_rate,
      "bytes_per_image": bytes_per_image,
      "xla_bytes_per_image_before_optimisation": (xla_before / batch
                                                  if xla_before is not None else None),
      "xla_bytes_per_image_after_optimisation": (xla_after * len(devices) / batch
                                                 if xla_after is not None else None),
      "loops_of_unknown_trip_count": traffic.unknown_trip_counts,
      "copy_size_bytes": copy_bytes,
      "copy_gb_per_s": copy_rate,
      **roofline(flops_per_image, bytes_per_image, train_rate, matmul_rate, copy_rate),
      "compile_seconds": compile_seconds,
      "temp_memory_bytes": temp_bytes,
      "step_memory_bytes": step_bytes,
      "device_peak_bytes": (devices[0].memory_stats() or {}).get("peak_bytes_in_use"),
      "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      "device": f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform})",
      "model": runtime.config.model.name,
      "dataset": runtime.config.dataset,
      # Models without these settings (em_capsnet has no compute_dtype) report None.
      "conv_impl": config.model.get("conv_impl"),
      "compute_dtype": config.model.get("compute_dtype"),
      "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),  # See capsjax/runs/hostmemory.py.
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      **profiled,
  }


def vectorized_throughput(config, run_counts: list[int], min_seconds: float) -> list[dict]:
  """Per N of ``run_counts``: train images/s summed over N runs advanced by one vectorised
  step (:class:`capsjax.training.vectorize.VectorizedStep`; N=1: the ordinary jitted step),
  ``speedup`` against N=1 (the rate of the same runs one by one), the seconds per dispatch
  and the step's new memory per device."""
  import jax

  from capsjax.training import memory, vectorize

  batch, num_steps = config.train.batch_size, config.train.steps_per_dispatch
  runtime, split, state = _random_data_runtime(config)
  examples, shared = runtime.on_devices(split)
  rows = []
  for runs in run_counts:
    if runs == 1:
      step = runtime.make_train_step()
      compiled = step.lower(state, examples, shared, num_steps).compile()
      holder = [jax.tree.map(lambda x: x.copy(), state)]
      call = lambda: compiled(holder[0], examples, shared)
    else:
      vstep = vectorize.VectorizedStep(runtime)
      holder = [vectorize.stack([state] * runs, vectorize.replicated(runtime))]
      compiled = vstep.prepare(holder[0], {}, examples, shared, num_steps)
      call = lambda: compiled(holder[0], {}, examples, shared)

    def once():
      holder[0], metrics = call()
      jax.block_until_ready(metrics)

    seconds = _time_repeated(once, min_seconds)
    rate = runs * batch * num_steps / seconds
    rows.append({"runs": runs, "images_per_second": rate,
                 "speedup": rate / rows[0]["images_per_second"] if rows else 1.0,
                 "seconds_per_dispatch": seconds,
                 "new_memory_bytes": memory.new_memory_bytes(compiled)})
    holder = compiled = None  # Freed before the next program is compiled.
  return rows


def _random_data_runtime(config):
  """``(runtime, split, state)``: the config's runtime loaded with random data of its train
  split's shapes (at least 4 batches, 1,024 examples and an evaluation batch) as both train
  and test, and fresh parameters."""
  from capsjax.training.runtime import Runtime

  runtime = Runtime(config)
  split = random_split(runtime.task.dataset, max(4 * config.train.batch_size, 1024,
                                                 config.eval.batch_size))
  runtime.load({"train": split, "test": runtime.task.dataset.eval_split_like(split)})
  return runtime, split, runtime.fresh_state()


def random_split(builder, num_examples: int):
  """Random bytes and labels of the shapes the builder's train split has (the data are
  not read: benchmarks need no files)."""
  import numpy as np

  from capsjax import datasets

  rng = np.random.default_rng(0)
  examples = {}
  for name, spec in builder.train_spec().items():
    if np.issubdtype(spec.dtype, np.integer) and name.startswith("label"):
      examples[name] = rng.integers(0, builder.info.num_classes,
                                    (num_examples, *spec.shape)).astype(spec.dtype)
    else:
      examples[name] = rng.integers(0, 256, (num_examples, *spec.shape)).astype(spec.dtype)
  return datasets.Split(examples, builder.train_shared(examples))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  with cli.clear_errors():
    if _PROFILE.value and _PROFILE_DEPTH.value < 1:
      raise UsageError(f"--profile_depth must be at least 1, got {_PROFILE_DEPTH.value}.")
    if _RUNS.value:
      counts = [_positive_int(n) for n in _RUNS.value]
      rows = vectorized_throughput(cli.config_from_flag(_CONFIG), counts, _SECONDS.value)
      _print_runs_table(rows)
      return
    if _PROFILE.value:  # Before any backend starts (layer_profile's docstring says why).
      from capsjax.runs import layer_profile
      os.environ["XLA_FLAGS"] = layer_profile.without_command_buffers(
          os.environ.get("XLA_FLAGS", ""))
    result = run_benchmark(cli.config_from_flag(_CONFIG), _SECONDS.value, _MATMUL_SIZE.value,
                           _PROFILE_DEPTH.value if _PROFILE.value else 0, _COPY_MB.value)
  table = result.pop("layer_profile_table", None)
  for key, value in result.items():
    if key == "layer_profile":
      continue
    print(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")
  if table:
    print(table)
  print(json.dumps(result))


def _positive_int(text: str) -> int:
  if not text.strip().isdigit() or int(text) < 1:
    raise UsageError(f"--runs takes counts of runs >= 1, e.g. --runs=1,2,4,8; got {text!r}.")
  return int(text)


def _print_runs_table(rows: list[dict]) -> None:
  import jax

  device = jax.devices()[0]
  print(f"{len(jax.devices())} x {device.device_kind} ({device.platform})")
  print("| runs | train img/s, summed | per run | x one by one | ms per dispatch | "
        "new memory |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    new_bytes = r["new_memory_bytes"]
    print(f"| {r['runs']} | {r['images_per_second']:,.0f} | "
          f"{r['images_per_second'] / r['runs']:,.0f} | {r['speedup']:.2f} | "
          f"{1000 * r['seconds_per_dispatch']:.2f} | "
          f"{'?' if new_bytes is None else f'{new_bytes / 2**20:,.0f} MiB'} |")
  print(json.dumps(rows))


if __name__ == "__main__":
  cli.run(main, "capsjax.benchmark")
