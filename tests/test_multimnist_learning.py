"""MultiMNIST CapsNet learns with its default initialisation, and a saturated one is reported.

configs/multimnist.py at a test size: conv1 of 32 channels instead of 256 (the paper's 32
capsule types on the 10x10 grid, so 3,200 primary capsules as in the paper) on generated
two-shape pairs (the bars of tests/helpers.make_images, overlaid). The paper-size model
saturates within its first Adam steps at learning rate 1e-3 because each step moves every
weight by about the learning rate, and its PrimaryCaps convolution sums 9*9*256 inputs; with
an 8x narrower conv1 the same overshoot needs a larger step, so this test trains at 4e-3. With
W_ij ~ normal(0, 0.1) (the default before) the class capsules then saturate and the exact
top-2 accuracy stays at chance (1/45); with the config's default it learns.
"""

import ml_collections
import numpy as np
import pytest

import multimnist as multimnist_config
from capsjax import train
from capsjax.models import metrics
from helpers import learning_run, write_idx_dataset

CHANCE = metrics.chance_levels(10, 2)["accuracy"]  # 1/45.


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory):
  return write_idx_dataset(tmp_path_factory.mktemp("pairs"), num_train=1024, num_test=256)


def small_multimnist(data_dir, init_scale=None):
  c = multimnist_config.get_config(None)
  c.data.source, c.data.dir, c.data.pairs_per_digit = "idx", str(data_dir), 1
  c.model.conv1.features = 32
  c.model.decoder.enabled = False
  c.loss.reconstruction_weight = 0.0
  if init_scale is not None:
    c.model.class_capsules.init_scale = init_scale
  c.optimizer.learning_rate = 4e-3
  c.train.batch_size, c.train.num_steps, c.train.log_every_steps = 32, 50, 10
  c.train.saturation_warning = ml_collections.ConfigDict(dict(steps=10))  # Left out: made.
  c.eval.batch_size = 128
  learning_run(c)
  return c


# Measured: 35 steps with the default init reach 18% exact (8x chance) and 89% at least one;
# the saturated init warns after 10 steps and is at 1.6% after 16 (2026-12-06; 0.8% after 20,
# 3.5% after 12: still moving, too near the 4.4% bound).
@pytest.mark.parametrize("init_scale,learns,steps", [(None, True, 35), (0.1, False, 16)],
                         ids=["default_init", "init_0.1_saturates"])
def test_multimnist_capsnet_learns_with_its_default_init(pairs_dir, tmp_path, capsys,
                                                         init_scale, learns, steps):
  config = small_multimnist(pairs_dir, init_scale)
  config.train.num_steps = config.train.eval_every_steps = steps
  config.train.checkpoint_every_steps = steps
  summary = train.train_and_evaluate(config, str(tmp_path))
  out = capsys.readouterr()
  warned = "(saturated)" in out.out + out.err
  test = summary["evaluations"]["test"]
  assert summary["chance"]["accuracy"] == pytest.approx(CHANCE)
  if learns:
    assert test["accuracy"] > 5 * CHANCE, test
    assert test["at_least_one"] > 0.6, test              # Chance 17/45 = 0.378.
    assert test["saturated_fraction"] < 0.5 and not warned
  else:
    assert test["accuracy"] < 2 * CHANCE, test
    assert test["saturated_fraction"] > 0.9 and warned
    assert "model.class_capsules.init_scale" in out.out + out.err
  np.testing.assert_allclose(test["error"], 1 - test["accuracy"])
