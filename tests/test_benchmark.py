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
