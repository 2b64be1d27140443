"""Every shipped config's smoke variant, seed 0, trained end to end on generated data: prints
each run's evaluation metrics as JSON, so a refactor can show that nothing a user runs changed.

    python tools/smoke_losses.py > before.json   # on the old code
    python tools/smoke_losses.py > after.json    # on the new code
    python tools/smoke_losses.py --compare before.json after.json

MNIST-format configs read generated IDX files (tests/helpers.py); CIFAR-10, SVHN and smallNORB
read tensorflow-datasets' mock data. Runs on CPU in a few minutes.
"""

import argparse
import contextlib
import importlib
import io
import json
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "configs"), str(REPO / "tests")]

# (config file, variant, data): "idx" generated MNIST files, "mock" tfds mock data.
RUNS = [("mnist", "smoke", "idx"), ("fashion_mnist", "smoke", "idx"),
        ("mnist_baseline", "smoke", "idx"), ("affnist", "smoke", "idx"),
        ("affnist", "baseline_smoke", "idx"), ("multimnist", "smoke", "idx"),
        ("multimnist", "baseline_smoke", "idx"), ("efficient_capsnet", "smoke", "idx"),
        ("cifar10", "smoke", "mock"), ("svhn", "smoke", "mock"), ("smallnorb", "smoke", "mock"),
        ("em_mnist", "smoke", "idx"), ("em_mnist", "smoke,vb", "idx")]


def get_config(module, variant):
  """The config of ``module`` at ``variant``, whichever way the module spells variants."""
  return importlib.import_module(module).get_config(variant)


def run_all(only=None) -> dict:
  import jax

  jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))
  from helpers import write_idx_dataset
  from capsjax import train

  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    idx = write_idx_dataset(os.path.join(tmp, "idx"), num_train=256, num_test=64)
    for module, variant, data in RUNS:
      name = f"{module}:{variant}"
      if only and name not in only:
        continue
      config = get_config(module, variant)
      config.seed = 0
      if data == "idx":
        config.data.source, config.data.dir = "idx", idx
        manager = contextlib.nullcontext()
      else:
        import tensorflow_datasets as tfds

        manager = tfds.testing.mock_data(num_examples=64)
      with manager, contextlib.redirect_stdout(io.StringIO()):
        summary = train.train_and_evaluate(config, os.path.join(tmp, name.replace(":", "_")))
      results[name] = summary["evaluations"]
      print(f"{name}: test loss {summary['test_loss']!r}", file=sys.stderr)
  return results


def compare(before: dict, after: dict) -> int:
  """Prints every metric that differs; returns the number of differences."""
  differences = 0
  for name in sorted(before.keys() | after.keys()):
    if name not in before or name not in after:
      print(f"{name}: only in {'after' if name in after else 'before'}")
      differences += 1
      continue
    for evaluation in sorted(before[name].keys() | after[name].keys()):
      old, new = before[name].get(evaluation), after[name].get(evaluation)
      if old != new:
        print(f"{name} {evaluation}: {old} -> {new}")
        differences += 1
  print(f"{differences} difference(s) in {len(before)} runs")
  return differences


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
  parser.add_argument("--only", nargs="*", help="config:variant names to run")
  args = parser.parse_args()
  if args.compare:
    with open(args.compare[0]) as f, open(args.compare[1]) as g:
      sys.exit(1 if compare(json.load(f), json.load(g)) else 0)
  print(json.dumps(run_all(args.only), indent=1, sort_keys=True))
