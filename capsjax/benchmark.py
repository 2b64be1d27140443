"""Measures training and evaluation speed against the device's bounds (a roofline).

  python -m capsjax.benchmark --config=configs/mnist.py [--config.train.batch_size=32 ...]

In one process, after compilation, on random bytes already on the device through the jitted step
that training uses: train-step and eval-step images/s, compile time, XLA's memory for the train
step, and the step against the device's compute and memory bounds (``bound`` names the larger
time); ``--profile`` adds a per-layer table. The last line printed is one JSON object;
docs/benchmarking.md defines each field, with its unit, caveats and the code that counts it.
"""

import contextlib
import json
import os
import resource
import time
import types

import jax
import numpy as np
from absl import app, flags, logging

from capsjax import datasets
from capsjax.common.errors import UsageError
from capsjax.config import precision, schema
from capsjax.perf import costs, layer_profile, rates
from capsjax.runs import cli
from capsjax.training import memory, train_step
from capsjax.training.setup import Setup
from capsjax.training.tasks import Task

FLAGS: types.SimpleNamespace | None = None  # The command's flags (define_flags), once it runs.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS, argv=None):
  """The command's flags, in ``flag_values``; ``argv`` (default sys.argv): config overrides."""
  global FLAGS
  define = dict(flag_values=flag_values)
  FLAGS = types.SimpleNamespace(
      config=cli.define_config_file("config", None, "Config file.", flag_values, argv),
      seconds=flags.DEFINE_float("seconds", 20.0, "Minimum time to measure each rate over.",
                                 **define),
      matmul_size=flags.DEFINE_integer(
          "matmul_size", 0, "n of the n x n matmul; 0: 2048 on CPU, 8192 elsewhere.", **define),
      copy_mb=flags.DEFINE_integer(
          "copy_mb", 0, "MiB of the array the bandwidth is measured on; 0: 64 on CPU, 1024 "
          "elsewhere (well beyond the caches).", **define),
      profile=flags.DEFINE_boolean(
          "profile", False, "Also print the train step's time per layer (forward and "
          "backward ms, share), from a JAX profiler trace (on a GPU without XLA's command "
          "buffers, so that each kernel is seen).", **define),
      profile_depth=flags.DEFINE_integer(
          "profile_depth", 2, "Parts of a module's path a --profile row keeps "
          "(decoder.layers.0 at 2: decoder.layers).", **define),
      runs=flags.DEFINE_list(
          "runs", [], "Instead: train images/s summed over N runs trained as one vectorised "
          "program (capsjax.sweep --vectorize), for each N listed (e.g. 1,2,4,8); N=1 is the "
          "ordinary step, and N runs one by one would sum to its rate.", **define))
  flags.mark_flags_as_required(["config"], flag_values=flag_values)
  return FLAGS


def run_benchmark(config, min_seconds: float = 20.0, matmul_size: int = 0,
                  profile_depth: int = 0, copy_mb: int = 0) -> dict:
  """The measurements of the module docstring as a dict; with ``profile_depth > 0`` also
  ``layer_profile``, the rows of :func:`capsjax.perf.layer_profile.layer_table` (and
  ``layer_profile_table``, their markdown). Everything, the matmul rate included, in
  ``config.matmul_precision``."""
  config = schema.as_resolved(config)  # Every setting checked before anything runs.
  with precision.scope(config):
    devices = jax.devices()
    batch, num_steps = config.train.batch_size, config.train.steps_per_dispatch
    setup, state, examples, shared = _random_data_setup(config)
    train_step = setup.make_train_step()
    compiled, compile_seconds = _compile(setup, train_step, state, examples, shared,
                                         num_steps, profile_depth)
    cost = costs.step_costs(train_step, compiled, state, examples, shared, batch, num_steps,
                            len(devices))
    holder = [state]

    def train_once():
      holder[0], metrics = compiled(holder[0], examples, shared)
      jax.block_until_ready(metrics)

    train_seconds = rates.time_repeated(train_once, min_seconds)
    train_rate = batch * num_steps / train_seconds
    profiled = (_profile(train_once, compiled, cost["traffic"], profile_depth, num_steps,
                         train_seconds) if profile_depth else {})
    eval_batch = config.eval.batch_size  # Eval images/s: of one test batch.
    eval_set = setup.batched.eval_set(setup.splits["test"].first(eval_batch),
                                      setup.task.dataset.eval_batch)
    eval_rate = eval_batch / rates.time_repeated(
        lambda: setup.batched.evaluate(holder[0].variables, eval_set), min_seconds / 2)
    n = matmul_size or (2048 if devices[0].platform == "cpu" else 8192)
    matmul_rate = rates.matmul_gflop_per_s(n, min_seconds / 2)
    copy_bytes = (copy_mb or (64 if devices[0].platform == "cpu" else 1024)) * 2 ** 20
    copy_rate = rates.copy_gb_per_s(copy_bytes, min_seconds / 2)
    flops_per_image, bytes_per_image = cost["flops_per_image"], cost["bytes_per_image"]
    train_gflops = flops_per_image * train_rate / 1e9
    per_image = lambda moved, shards=1: None if moved is None else moved * shards / batch
    return {
        "batch_size": batch,
        "steps_per_dispatch": num_steps,
        "train_seconds_per_step": train_seconds / num_steps,
        "train_images_per_second": train_rate,
        "eval_images_per_second": eval_rate,
        "train_gflop_per_image": flops_per_image / 1e9,
        "flops_source": cost["flops_source"],
        "xla_gflop_per_image": cost["xla_flops_per_image"] / 1e9,
        "xla_flops_source": cost["xla_flops_source"],
        "train_gflop_per_s": train_gflops,
        "matmul_size": n,
        "matmul_gflop_per_s": matmul_rate,
        "peak_fraction": train_gflops / matmul_rate,
        "bytes_per_image": bytes_per_image,
        "xla_bytes_per_image_before_optimisation": per_image(cost["xla_before"]),
        "xla_bytes_per_image_after_optimisation": per_image(cost["xla_after"], len(devices)),
        "loops_of_unknown_trip_count": cost["traffic"].unknown_trip_counts,
        "copy_size_bytes": copy_bytes,
        "copy_gb_per_s": copy_rate,
        **costs.roofline(flops_per_image, bytes_per_image, train_rate, matmul_rate, copy_rate,
                         exact=(cost["flops_source"] == "jaxpr"
                                and not cost["traffic"].unknown_trip_counts)),
        "compile_seconds": compile_seconds,
        "temp_memory_bytes": cost["temp_bytes"],
        "step_memory_bytes": cost["step_bytes"],
        "device_peak_bytes": (devices[0].memory_stats() or {}).get("peak_bytes_in_use"),
        "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "device": f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform})",
        "model": setup.config.model.name,
        "trainable_parameters": int(sum(leaf.size for leaf in jax.tree.leaves(state.params))),
        "dataset": setup.config.dataset,
        "conv_impl": config.model.get("conv_impl"),
        "compute_dtype": config.model.get("compute_dtype"),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),  # See capsjax/runs/hostmemory.py.
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        **profiled,
        "matmul_precision": precision.of(config),
    }


def _compile(setup, train_step, state, examples, shared, num_steps: int, profile_depth: int):
  """``(compiled, seconds)``: the train step compiled; with a profile, its ops labelled by layer
  (named scopes only label ops: the computation is the same)."""
  start = time.perf_counter()
  with (layer_profile.module_scopes(setup.task.model_class, setup.task.abstract_model)
        if profile_depth else contextlib.nullcontext()):
    compiled = train_step.lower(state, examples, shared, num_steps).compile()
  return compiled, time.perf_counter() - start


def _profile(train_once, compiled, traffic, depth: int, num_steps: int,
             train_seconds: float) -> dict:
  """``launches_per_step`` and the per-layer table (``layer_profile``, its markdown), traced."""
  seconds, launches = layer_profile.trace_ops(train_once, repeats=3)
  rows = layer_profile.layer_table(seconds, layer_profile.op_layers(compiled.as_text(), depth),
                                   per=num_steps, bytes_by_op=traffic.bytes_by_op)
  return {"launches_per_step": launches / num_steps,
          "layer_profile": [row._asdict() for row in rows],
          "layer_profile_table": layer_profile.format_table(rows, train_seconds / num_steps)}


def vectorized_throughput(config, run_counts: list[int], min_seconds: float) -> list[dict]:
  """Per N of ``run_counts``: train images/s summed over N runs advanced by one vectorised
  :class:`capsjax.training.train_step.Step` (N=1: the ordinary jitted step), ``speedup`` against
  N=1, the seconds per dispatch and the step's new memory per device; in the config's precision."""
  config = schema.resolve_config(config)
  with precision.scope(config):
    batch, num_steps = config.train.batch_size, config.train.steps_per_dispatch
    setup, state, examples, shared = _random_data_setup(config)
    rows = []
    for runs in run_counts:
      if runs == 1:
        step = setup.make_train_step()
        compiled = step.lower(state, examples, shared, num_steps).compile()
        holder = [jax.tree.map(lambda x: x.copy(), state)]
        call = lambda: compiled(holder[0], examples, shared)
      else:
        vstep = train_step.Step(setup, vectorised=True)
        holder = [vstep.stack([state] * runs)]
        compiled = vstep.prepare(holder[0], None, examples, shared, num_steps)
        call = lambda: compiled(holder[0], None, examples, shared)

      def once():
        holder[0], metrics = call()
        jax.block_until_ready(metrics)

      seconds = rates.time_repeated(once, min_seconds)
      rate = runs * batch * num_steps / seconds
      rows.append({"runs": runs, "images_per_second": rate,
                   "speedup": rate / rows[0]["images_per_second"] if rows else 1.0,
                   "seconds_per_dispatch": seconds,
                   "new_memory_bytes": memory.new_memory_bytes(compiled)})
      holder = compiled = None  # Freed before the next program is compiled.
    return rows


def _random_data_setup(config):
  """``(setup, state, examples, shared)``: the config's setup on random data of its train split's
  shapes (at least 4 batches, 1,024 examples and an eval batch) as train and test, fresh
  parameters, and the train split on the devices."""
  dataset = Task.from_config(config).dataset
  split = random_split(dataset, max(4 * config.train.batch_size, 1024, config.eval.batch_size))
  setup = Setup(config, splits={"train": split, "test": dataset.eval_split_like(split)})
  return (setup, setup.fresh_state(), *setup.on_devices(split))


def random_split(builder, num_examples: int):
  """Random bytes and labels of the builder's train split's shapes (benchmarks read no files)."""
  rng = np.random.default_rng(0)
  examples = {}
  for name, spec in builder.train_spec().items():
    label = np.issubdtype(spec.dtype, np.integer) and name.startswith("label")
    high = builder.info.num_classes if label else 256
    examples[name] = rng.integers(0, high, (num_examples, *spec.shape)).astype(spec.dtype)
  return datasets.Split(examples, builder.train_shared(examples))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  f = FLAGS
  with cli.clear_errors():
    if f.profile.value and f.profile_depth.value < 1:
      raise UsageError(f"--profile_depth must be at least 1, got {f.profile_depth.value}.")
    if f.runs.value:
      counts = [_positive_int(n) for n in f.runs.value]
      rows = vectorized_throughput(cli.config_from_flag(f.config), counts, f.seconds.value)
      _print_runs_table(rows)
      return
    if f.profile.value:  # Before any backend starts (layer_profile's docstring says why).
      os.environ["XLA_FLAGS"] = layer_profile.without_command_buffers(
          os.environ.get("XLA_FLAGS", ""))
    result = run_benchmark(cli.config_from_flag(f.config), f.seconds.value,
                           f.matmul_size.value, f.profile_depth.value if f.profile.value else 0,
                           f.copy_mb.value)
  table = result.pop("layer_profile_table", None)
  for key, value in result.items():
    if key != "layer_profile":
      print(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")
  if table:
    print(table)
  print(json.dumps(result))


def _positive_int(text: str) -> int:
  if not text.strip().isdigit() or int(text) < 1:
    raise UsageError(f"--runs takes counts of runs >= 1, e.g. --runs=1,2,4,8; got {text!r}.")
  return int(text)


def _print_runs_table(rows: list[dict]) -> None:
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
  cli.run(main, "capsjax.benchmark", define_flags)
