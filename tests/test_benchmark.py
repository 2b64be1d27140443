"""The benchmark command runs and ends with its JSON line (no timing assertions)."""

import json
import os
import pathlib
import subprocess
import sys

from capsjax.runs import hostmemory

REPO = pathlib.Path(__file__).resolve().parents[1]
KEYS = ("train_images_per_second", "eval_images_per_second", "train_gflop_per_s",
        "matmul_gflop_per_s", "peak_fraction", "compile_seconds", "temp_memory_bytes", "device")


def test_benchmark_prints_json_last_line():
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="2")
  env.pop("GLIBC_TUNABLES", None)
  result = subprocess.run(
      [sys.executable, "-m", "capsjax.benchmark", f"--config={REPO}/configs/mnist.py:smoke",
       "--seconds=0.2", "--matmul_size=256"],
      env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  for key in KEYS:
    assert key in report, key
  assert report["train_images_per_second"] > 0 and report["temp_memory_bytes"] > 0
  # XLA's count must be at least the analytic FLOPs of the smoke model's PrimaryCaps conv
  # (forward + two gradients): 3 * 2 * 36 positions * 81 * 16 * 16 multiply-adds.
  assert report["train_gflop_per_image"] * 1e9 >= 3 * 2 * 36 * 81 * 16 * 16
  assert abs(report["peak_fraction"] - report["train_gflop_per_s"]
             / report["matmul_gflop_per_s"]) < 1e-9
  assert report["device"].startswith("2 x")
  # The entry point restarted itself with the host-memory tunables (capsjax/runs/hostmemory.py).
  expected = hostmemory.tuned_environment(env)
  assert report["glibc_tunables"] == (expected or {}).get("GLIBC_TUNABLES", "")


def test_benchmark_of_a_dataset_whose_test_split_differs_from_its_train_split():
  """MultiMNIST's test examples are pair indices into shared digits, its train examples
  digits: the eval-step timing needs an evaluation split of that layout."""
  result = subprocess.run(
      [sys.executable, "-m", "capsjax.benchmark", f"--config={REPO}/configs/multimnist.py:smoke",
       "--seconds=0.05", "--matmul_size=64"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["dataset"] == "multimnist"
  assert report["train_images_per_second"] > 0 and report["eval_images_per_second"] > 0


def test_flops_per_image_count_every_fused_step(tmp_path):
  """XLA's cost analysis counts a scan's body once: with 3 steps per dispatch the benchmark
  must still report the FLOPs of one step per image, as with 1 (issue: 1/25 of them with
  Efficient-CapsNet's 25). In a subprocess: capsjax.benchmark defines the command's flags."""
  from helpers import write_idx_dataset

  data = write_idx_dataset(tmp_path, 64, 32)
  code = f"""
import json, sys
sys.path[:0] = [{str(REPO / "configs")!r}]
import mnist
from capsjax import benchmark
per_image = {{}}
for steps in (1, 3):
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", {str(data)!r}
  config.train.steps_per_dispatch = steps
  report = benchmark.run_benchmark(config, min_seconds=0.05, matmul_size=64)
  per_image[steps] = report["train_gflop_per_image"]
print(json.dumps(per_image))
"""
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, JAX_NUM_CPU_DEVICES="2"))
  assert result.returncode == 0, result.stderr
  per_image = json.loads(result.stdout.strip().splitlines()[-1])
  assert per_image["3"] == per_image["1"] > 0
