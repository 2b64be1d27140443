"""A tiny CapsNet learns: on three generated shapes its loss falls and it classifies the test
shapes far above chance, in a few dozen steps."""

import json
import pathlib

import pytest

import mnist
from capsjax import train
from capsjax.config.runconfig import import_config_file
from helpers import learning_run, train_on_shapes, write_shapes_dataset

em_mnist = import_config_file(pathlib.Path(__file__).parents[1] / "configs" / "em_mnist.py")


def test_a_tiny_capsnet_learns_three_shapes(tmp_path):
  config = mnist.get_config("smoke")
  config.data.source, config.data.dir = "idx", str(write_shapes_dataset(tmp_path / "shapes"))
  config.data.train_limit = config.data.test_limit = 0
  config.train.num_steps, config.train.log_every_steps = 40, 10
  config.optimizer.learning_rate = 3e-3  # The smoke model is tiny; measured: loss 0.40 -> 0.11.
  learning_run(config)
  summary = train.train_and_evaluate(config, str(tmp_path / "run"))
  losses = [r["loss"] for r in map(json.loads, open(tmp_path / "run" / "metrics.jsonl"))
            if r["kind"] == "train"]
  assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
  # Chance: 10% for 10 classes, 33% guessing among the three shapes; measured ~100%.
  assert summary["chance"]["accuracy"] == 0.1
  assert summary["test_accuracy"] > 0.9, summary["evaluations"]["test"]


# Steps and learning rate each needs on this task. Random coupling learns slower than the
# others (40 steps: 85% test accuracy); self-routing's scores move only through its routing
# matrices acting on short primary capsules (3e-3: 70% after 40 steps, 78% after 120; 1e-2:
# 65% after 80, above 90% after 160). EM routing classifies at 3e-3 within 40 steps but its
# loss falls slowly (0.63 -> 0.49); at 1e-2 80 steps depend on the seed (seeds 0-3: 100, 98,
# 65, 100% by autodiff; a rounding change in the gradient took seed 0 to 89.6%), 120 steps
# reached 100% at all four with either of its gradients of then (the custom VJP, autodiff of
# the child-major loop; since 2026-11-29 one loop, seed 0 passing). Variational Bayes routing as its
# authors' code at HEAD (the clamped normaliser) needs small votes: with the class transforms
# at the config's normal(0, 0.1) the children's p_ij underflow below the clamp's floor, every
# coupling stays uniform (entropy log 10) and 120 steps at 1e-2 reach 35%; at 0.01, 88% after
# 120 steps and 100% after 240 at 5e-3 (2e-2: 35%, the couplings collapse again). With the
# first commits' rule (assignments="first_commits", the default before) 120 steps at 1e-2
# reached 100%.
# Every router's run is in the default test run (CI): one evaluation and one checkpoint at the
# end, no example figures, so a run is its compilations and its steps (7-25 s each here).
@pytest.mark.parametrize("router,steps,learning_rate,class_init", [
    ("uniform", 40, 3e-3, None), ("random", 80, 3e-3, None), ("self_attention", 40, 3e-3, None),
    ("inverted_dot_product", 40, 3e-3, None), ("self_routing", 160, 1e-2, None),
    ("em", 120, 1e-2, None), ("variational_bayes", 240, 5e-3, 0.01)])
def test_every_router_learns_three_shapes(tmp_path, router, steps, learning_rate, class_init):
  """Each router on the same tiny backbone: the loss falls and the test shapes are classified
  far above chance (10 classes: 10%; guessing among the three shapes: 33%)."""
  config = mnist.get_config("smoke")
  config.model.routing.name = router
  if class_init is not None:
    config.model.class_capsules.init_scale = class_init
  config.data.source, config.data.dir = "idx", str(write_shapes_dataset(tmp_path / "shapes"))
  config.data.train_limit = config.data.test_limit = 0
  config.train.num_steps, config.train.log_every_steps = steps, 10
  learning_run(config)
  config.optimizer.learning_rate = learning_rate
  summary = train.train_and_evaluate(config, str(tmp_path / "run"))
  losses = [r["loss"] for r in map(json.loads, open(tmp_path / "run" / "metrics.jsonl"))
            if r["kind"] == "train"]
  assert losses[-1] < 0.5 * losses[0], losses
  assert summary["test_accuracy"] > 0.9, summary["evaluations"]["test"]
  assert summary["config"]["model"]["routing"]["name"] == router


def test_matrix_capsules_learn_three_shapes_with_dynamic_routing(tmp_path):
  """``configs/em_mnist.py:smoke`` (matrix capsules) with ``routing.name=dynamic`` at every
  routed layer: the capsule type and the router are separate choices. Measured: 160 steps at
  1e-2, loss 0.022 -> 0.001, 98% test accuracy (80 steps: 71%; EM at 80 steps: 59%)."""
  config = em_mnist.get_config("smoke")
  config.model.routing.name = "dynamic"
  summary, losses = train_on_shapes(config, tmp_path, 160, 1e-2)
  assert losses[-1] < 0.5 * losses[0], losses
  assert summary["test_accuracy"] > 0.9, summary["evaluations"]["test"]
  assert summary["config"]["model"]["routing"]["name"] == "dynamic"
  assert "caps1_coupling_entropy" in (tmp_path / "run" / "metrics.jsonl").read_text()
