"""examples/: a researcher's own model, router, evaluator and dataset, each named by import
path, run end to end as the README's commands run them, and shown to learn together."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from capsjax import train
from capsjax.config import runconfig
from helpers import REPO, read_summary, run_main, write_idx_dataset

EXAMPLES = REPO / "examples"


def example_config(keywords: str, bars_64_32=None, steps=4):
  config = runconfig.import_config_file(EXAMPLES / "config.py").get_config(
      f"{keywords},steps={steps}")
  if bars_64_32 is not None:
    config.data.source, config.data.dir = "idx", str(bars_64_32)
  if "dataset" in keywords:
    config.data.num_train, config.data.num_test = 64, 32
  return config


@pytest.fixture(scope="module")
def bars_64_32(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 64 train, 32 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=32)


def test_the_model_example_trains_with_its_own_loss(bars_64_32, tmp_path):
  summary = train.train_and_evaluate(example_config("model", bars_64_32), str(tmp_path))
  assert summary["step"] == 4
  assert summary["config"]["model"]["name"].endswith("examples/tiny_capsnet.py:TinyCapsNet")
  assert set(summary["evaluations"]["test"]) >= {"loss", "spread_loss", "accuracy"}
  assert "margin_loss" not in summary["evaluations"]["test"]


def test_the_router_example_routes_and_its_settings_are_recorded(bars_64_32, tmp_path):
  config = example_config("router", bars_64_32)
  config.model.routing.temperature = 0.5
  summary = train.train_and_evaluate(config, str(tmp_path))
  written = json.loads((tmp_path / "config.json").read_text())["model"]["routing"]
  assert written["name"].endswith("examples/agreement_router.py:ROUTER")
  assert (written["temperature"], written["squash_epsilon"]) == (0.5, 0.0)
  assert "coupling_entropy" in summary["evaluations"]["test"]


def test_the_evaluator_example_attacks_through_the_routing(bars_64_32, tmp_path):
  summary = train.train_and_evaluate(example_config("evaluator", bars_64_32), str(tmp_path))
  fgsm = summary["evaluations"]["fgsm"]
  assert fgsm["epsilon"] == 0.1 and fgsm["zero_gradient"] == 0.0
  assert fgsm["clean_accuracy"] == pytest.approx(summary["evaluations"]["test"]["accuracy"])
  # FGSM by hand on the final parameters: each test image moved by 0.1 x the sign of the
  # gradient of its cross-entropy, clipped to [0, 1], then classified.
  import jax
  import jax.numpy as jnp
  from capsjax import evaluators
  from capsjax.training.setup import Setup
  from helpers import final_state

  setup = Setup(runconfig.load(str(tmp_path)))
  test = evaluators.limit(setup.splits["test"], setup.config)
  images = jnp.asarray(test.examples["images"], jnp.float32) / 255.0
  labels = jnp.asarray(test.examples["labels"])
  variables = final_state(tmp_path).variables
  outputs = lambda x: setup.task.forward(variables, {"images": x, "labels": labels},
                                           train=False).outputs
  cross_entropy = lambda x: -jnp.sum(jnp.take_along_axis(outputs(x).log_probabilities,
                                                         labels[:, None], axis=1))

  @jax.jit  # One program (op by op, this took 544 compilations).
  def attacked(x):
    moved = jnp.clip(x + 0.1 * jnp.sign(jax.grad(cross_entropy)(x)), 0.0, 1.0)
    return moved, outputs(moved).predictions

  moved, predicted = attacked(images)
  assert float(jnp.max(jnp.abs(moved - images))) == pytest.approx(0.1)
  by_hand = float(np.mean(np.asarray(predicted) == np.asarray(labels)))
  assert fgsm["accuracy"] == pytest.approx(by_hand)


def test_all_four_from_the_command_line_as_the_readme_says(tmp_path):
  """``python -m capsjax.main --config=examples/config.py:model,router,evaluator,dataset``:
  offline (generated data), from the repository root; then a rerun resumes it."""

  def main(*flags):
    cmd = [sys.executable, "-m", "capsjax.main",
           "--config=examples/config.py:model,router,evaluator,dataset,steps=3",
           f"--workdir={tmp_path / 'run'}", "--config.data.num_train=64",
           "--config.data.num_test=32", "--config.eval.figures=false", *flags]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_NUM_CPU_DEVICES="2"))

  result = main()
  assert result.returncode == 0, result.stdout + result.stderr
  summary = read_summary(tmp_path / "run")
  assert summary["step"] == 3 and summary["config"]["dataset"].endswith("bars_dataset.py:Bars")
  assert summary["chance"]["accuracy"] == 0.25
  again = main("--config.train.num_steps=4")
  assert again.returncode == 0, again.stdout + again.stderr
  assert "Resuming from the checkpoint at step 3" in again.stdout


def test_an_unknown_path_is_refused_naming_the_key(tmp_path):
  result = run_main(tmp_path / "run", "--config.model.routing.name=examples/nowhere.py:ROUTER")
  assert result.returncode == 2
  assert "config.model.routing.name='examples/nowhere.py:ROUTER': no file" in result.stderr
  assert "Traceback" not in result.stderr


def test_the_four_examples_together_learn_the_bars(tmp_path):
  """300 steps of the example model with the example router on the generated bars: well
  above the 25% of chance, and the attack lowers the accuracy."""
  summary = train.train_and_evaluate(
      runconfig.import_config_file(EXAMPLES / "config.py").get_config(
          "model,router,evaluator,dataset"), str(tmp_path))
  test = summary["evaluations"]["test"]
  assert test["accuracy"] > 0.9, test
  assert summary["evaluations"]["fgsm"]["accuracy"] < test["accuracy"]
