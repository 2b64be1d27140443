"""The benchmark command runs and ends with its JSON line (no timing assertions)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from capsjax.perf import layer_profile
from capsjax.runs import hostmemory
from helpers import run_in_process, shared_run

REPO = pathlib.Path(__file__).resolve().parents[1]
KEYS = ("train_images_per_second", "eval_images_per_second", "train_gflop_per_s",
        "matmul_gflop_per_s", "peak_fraction", "compile_seconds", "temp_memory_bytes", "device",
        "bytes_per_image", "xla_bytes_per_image_before_optimisation",
        "xla_bytes_per_image_after_optimisation", "copy_gb_per_s", "compute_fraction",
        "memory_fraction", "bound")


@pytest.fixture(scope="session")
def one_device_command(tmp_path_factory):
  """``python -m capsjax.benchmark`` on the smoke config on 1 device, once per session (both
  workers): ``{"returncode", "stdout", "stderr", "expected_tunables"}``. The command's JSON
  line (the test below) and the one device that the 4 devices' bytes per image are set
  against (test_per_image_counts_hold_for_every_fused_step_and_every_device)."""

  def run(workdir):
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="1")
    env.pop("GLIBC_TUNABLES", None)
    result = subprocess.run(
        [sys.executable, "-m", "capsjax.benchmark", f"--config={REPO}/configs/mnist.py:smoke",
         "--seconds=0.2", "--matmul_size=256"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    workdir.mkdir()
    (workdir / "summary.json").write_text(json.dumps(
        {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr,
         "expected_tunables": (hostmemory.tuned_environment(env) or {}).get(
             "GLIBC_TUNABLES", "")}))

  return json.loads((shared_run(tmp_path_factory, "benchmark-one-device", run)
                     / "summary.json").read_text())


def test_benchmark_prints_json_last_line(one_device_command):
  result = one_device_command
  assert result["returncode"] == 0, result["stderr"]
  report = json.loads(result["stdout"].strip().splitlines()[-1])
  for key in KEYS:
    assert key in report, key
  assert report["train_images_per_second"] > 0 and report["temp_memory_bytes"] > 0
  # XLA's count must be at least the analytic FLOPs of the smoke model's PrimaryCaps conv
  # (forward + two gradients): 3 * 2 * 36 positions * 81 * 16 * 16 multiply-adds.
  assert report["train_gflop_per_image"] * 1e9 >= 3 * 2 * 36 * 81 * 16 * 16
  # Counted from the jaxpr; on the CPU, XLA's count of the same program is close (it counts
  # routing's loop body once, a few elementwise ops fewer).
  assert report["flops_source"] == "jaxpr"
  assert report["xla_flops_source"] == "xla_cost_analysis_before_optimisation"
  assert report["train_gflop_per_image"] == pytest.approx(report["xla_gflop_per_image"],
                                                          rel=0.02)
  assert abs(report["peak_fraction"] - report["train_gflop_per_s"]
             / report["matmul_gflop_per_s"]) < 1e-9
  assert report["device"].startswith("1 x")
  assert report["matmul_precision"] == "default"
  # The smoke model by hand: conv1 16 x (81 + 1); PrimaryCaps 16 x (16 x 81 + 1); W_ij 6 x 6
  # x 4 children x 10 parents x 8 x 4; the decoder 80-32-64-784 with biases.
  assert report["trainable_parameters"] == (
      16 * 82 + 16 * (16 * 81 + 1) + 144 * 10 * 8 * 4 + (80 * 32 + 32) + (32 * 64 + 64)
      + (64 * 784 + 784)) == 123_808
  # The roofline: both bounds from the measured rates, the larger named.
  for key in ("bytes_per_image", "copy_gb_per_s", "compute_fraction", "memory_fraction",
              "xla_bytes_per_image_before_optimisation", "xla_bytes_per_image_after_optimisation"):
    assert report[key] > 0, key
  assert report["compute_fraction"] == pytest.approx(report["peak_fraction"], rel=1e-9)
  assert report["memory_fraction"] == pytest.approx(
      report["bytes_per_image"] * report["train_images_per_second"]
      / (report["copy_gb_per_s"] * 1e9), rel=1e-9)
  compute_time = report["train_gflop_per_image"] / report["matmul_gflop_per_s"]
  memory_time = report["bytes_per_image"] / report["copy_gb_per_s"]
  assert report["bound"] == ("compute" if compute_time >= memory_time else "memory")
  # A hand count: Adam reads and writes the parameters and both moments every step, so a
  # step moves at least 6 x 4 bytes per parameter of the smoke model (123,808), per image
  # at batch 16; and the routing loop's trip count is known.
  assert report["bytes_per_image"] * report["batch_size"] >= 6 * 4 * 123_808
  assert report["loops_of_unknown_trip_count"] == 0
  # The entry point restarted itself with the host-memory tunables (capsjax/runs/hostmemory.py).
  assert report["glibc_tunables"] == result["expected_tunables"]


def test_benchmark_of_a_dataset_whose_test_split_differs_from_its_train_split():
  """MultiMNIST's test examples are pair indices into shared digits, its train examples
  digits: the eval-step timing needs an evaluation split of that layout. (In this process:
  the command's own output is the first test's.)"""
  import multimnist
  from capsjax import benchmark

  report = benchmark.run_benchmark(multimnist.get_config("smoke"), min_seconds=0.05,
                                   matmul_size=64, copy_mb=1)
  assert report["dataset"] == "multimnist"
  assert report["train_images_per_second"] > 0 and report["eval_images_per_second"] > 0


def test_per_image_counts_hold_for_every_fused_step_and_every_device(tmp_path,
                                                                     one_device_command):
  """XLA's cost analysis counts a scan's body once: with 3 steps per dispatch the benchmark
  must still report the FLOPs of one step per image, as with 1 (issue: 1/25 of them with
  Efficient-CapsNet's 25). Bytes per image: the compiled program is one device's (here 4,
  each with its quarter of the batch) and moves the steps' loop multiplied out, so per image
  it is about the same with 1 or 3 steps, and at least what Adam moves on every device: the
  parameters and both moments read and written (6 x 4 bytes per parameter of the smoke model,
  123,808) per step, on each of the 4 devices; and about what one device moves per image."""
  import jax

  import mnist
  from capsjax import benchmark
  from helpers import write_idx_dataset

  assert jax.device_count() == 4
  data = write_idx_dataset(tmp_path, 64, 32)
  reports = {}
  for steps in (1, 3):
    config = mnist.get_config("smoke")
    config.data.source, config.data.dir = "idx", str(data)
    config.train.steps_per_dispatch = steps
    reports[steps] = benchmark.run_benchmark(config, min_seconds=0.05, matmul_size=64,
                                             copy_mb=1)
  assert reports[3]["train_gflop_per_image"] == reports[1]["train_gflop_per_image"] > 0
  for steps, report in reports.items():
    assert report["device"].startswith("4 x")
    assert report["bytes_per_image"] * report["batch_size"] >= 4 * 6 * 4 * 123_808, steps
  assert 0.8 < reports[3]["bytes_per_image"] / reports[1]["bytes_per_image"] < 1.25
  # Per image, 4 devices move about what 1 does (each moves its quarter of the batch's
  # activations; the parameters' update 4 times: measured 1.27x): not a quarter of it.
  assert one_device_command["returncode"] == 0, one_device_command["stderr"]
  alone = json.loads(one_device_command["stdout"].strip().splitlines()[-1])
  assert alone["device"].startswith("1 x")
  assert 0.9 < reports[1]["bytes_per_image"] / alone["bytes_per_image"] < 2.0


def test_flops_per_image_close_to_the_analytic_count(tmp_path):
  """XLA's count of Efficient-CapsNet's train step against one written out from the layer
  shapes: every convolution and dense layer forward (2 x multiply-adds) and its two gradients
  (the first convolution has no input gradient). Normalisation, activations, routing and the
  optimiser add a little (3% here); the count must not fall short of the analytic one. On four
  devices: the count is of the program before partitioning, the whole batch's."""
  import efficient_capsnet
  from capsjax import benchmark
  from helpers import write_idx_dataset

  data = write_idx_dataset(tmp_path, 64, 32)
  config = efficient_capsnet.get_config()
  config.data.source, config.data.dir = "idx", str(data)
  config.train.steps_per_dispatch, config.train.batch_size, config.eval.batch_size = 1, 8, 8
  report = benchmark.run_benchmark(config, min_seconds=0.05, matmul_size=64, copy_mb=1)
  gflop, convs = report["train_gflop_per_image"], config.model.convs
  hidden, class_dim = list(config.model.decoder.hidden), config.model.class_capsules.dim
  size, channels, analytic = 28, 1, 0
  for i, (k, s, f) in enumerate(zip(convs.kernel_sizes, convs.strides, convs.features)):
    size = (size - k) // s + 1
    forward = 2 * size * size * k * k * channels * f
    analytic += forward * (2 if i == 0 else 3)
    channels = f
  widths = [10 * class_dim, *hidden, 784]
  analytic += sum(3 * 2 * a * b for a, b in zip(widths, widths[1:]))
  assert analytic <= gflop * 1e9 <= 1.1 * analytic, (gflop * 1e9, analytic)


def test_profile_prints_a_table_of_the_model_layers():
  result = subprocess.run(
      [sys.executable, "-m", "capsjax.benchmark", f"--config={REPO}/configs/mnist.py:smoke",
       "--seconds=0.05", "--matmul_size=64", "--profile"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  rows = {row["layer"]: row for row in report["layer_profile"]}
  # The paper model's modules (depth 2: primary_capsules.conv), and time in both passes of
  # the convolutions.
  assert {"conv1", "primary_capsules.conv", "class_capsules", "decoder.layers"} <= set(rows)
  assert rows["primary_capsules.conv"]["forward_ms"] > 0
  assert rows["primary_capsules.conv"]["backward_ms"] > 0
  assert abs(sum(row["share"] for row in rows.values()) - 1) < 1e-6
  assert abs(sum(row["bytes_share"] for row in rows.values()) - 1) < 1e-6
  assert rows["class_capsules"]["bytes_share"] > 0 and report["launches_per_step"] > 0
  assert "| primary_capsules.conv |" in result.stdout and "bytes share |" in result.stdout
  assert report["step_memory_bytes"] >= report["temp_memory_bytes"] > 0
  assert report["host_peak_rss_bytes"] > 0
  # Set before the backend started (the CPU ignores it; a GPU's table depends on it).
  assert report["xla_flags"].endswith("--xla_gpu_enable_command_buffer=")


def test_profile_turns_off_command_buffers_unless_the_user_set_them():
  assert layer_profile.without_command_buffers("") == "--xla_gpu_enable_command_buffer="
  assert (layer_profile.without_command_buffers("--xla_cpu_use_xnnpack=true")
          == "--xla_cpu_use_xnnpack=true --xla_gpu_enable_command_buffer=")
  mine = "--xla_gpu_enable_command_buffer=FUSION"
  assert layer_profile.without_command_buffers(mine) == mine


def test_profile_depth_below_one_is_a_usage_error(capsys):
  result = run_in_process(capsys, "capsjax.benchmark", f"--config={REPO}/configs/mnist.py:smoke",
                          "--profile", "--profile_depth=0")
  assert result.returncode == 2
  assert "--profile_depth must be at least 1, got 0" in result.stderr
  assert "Traceback" not in result.stderr


def test_flops_fall_back_to_the_optimised_program_where_the_backend_counts_none():
  """JAX 0.11.2's GPU backend gives no cost analysis before optimisation (the benchmark stopped
  with a TypeError on an H200): the count then comes from the compiled program, named a lower
  bound."""
  import jax
  import jax.numpy as jnp

  from capsjax.perf import costs

  lowered = jax.jit(lambda a: a @ a.T).lower(jnp.ones((64, 32)))

  class NoCountBeforeOptimisation:  # What the GPU backend's Lowered answers.
    def cost_analysis(self):
      return None

    def compile(self):
      return lowered.compile()

  before, after = costs.flops(lowered), costs.flops(NoCountBeforeOptimisation())
  assert before[1] == "xla_cost_analysis_before_optimisation"
  assert after[1] == "xla_cost_analysis_after_optimisation_lower_bound"
  for flops, _ in (before, after):
    assert flops == pytest.approx(2 * 64 * 64 * 32, rel=0.05)


def test_roofline_leaves_fractions_and_bound_empty_when_only_lower_bounds_are_known():
  from capsjax.perf import costs

  known = costs.roofline(2e9, 1e6, 100.0, matmul_gflop_per_s=1000.0, copy_gb_per_s=100.0)
  assert known == {"compute_fraction": pytest.approx(0.2), "memory_fraction": pytest.approx(1e-3),
                   "bound": "compute"}
  lower = costs.roofline(2e9, 1e6, 100.0, 1000.0, 100.0, exact=False)
  assert lower == {"compute_fraction": None, "memory_fraction": None, "bound": None}
