"""CIFAR-10 (paper Sec. 7): CapsNet on 24x24 patches with a "none-of-the-above" category.

Usage:
  python -m capsjax.main --config=configs/cifar10.py --workdir=/tmp/cifar10/seed0
  python -m capsjax.sweep experiments/cifar10_ensemble.py --workdir=/tmp/cifar10   # 7 seeds
  python -m capsjax.evaluate --ensemble=/tmp/cifar10                                # ensemble
Offline: --config.data.dir=DIR with tfds's cifar10 archive (cifar-10-binary.tar.gz).

Paper: 10.6% test error with an ensemble of 7 models, 3 routing iterations,
24x24 patches, 64 primary capsule types and a none-of-the-above routing
category. Sources of each setting:
  paper       3 routing iterations, 24x24 patches, 64 primary capsule types, "none-of-the-
              above" (= the official code's leaky routing, model.routing.leaky), 7 models;
  official    SAME padding (--hparams_override=padding=SAME), no decoder (remake=false),
  code        distortions of cifar10_input.py: random 24x24 crop, left-right flip,
              brightness +-63, contrast 0.2-1.8, then per-image standardisation; the test
              images centre-cropped and standardised; Adam 1e-3 decayed 0.96 every 2000
              steps, batch 128; 600,000 training steps in its sample command;
  MNIST       everything else (conv1 256 9x9, 8D primary and 16D class capsules, margin loss).

22,476,288 parameters. The length of a run here is config.train.num_epochs (50
epochs of 390 steps = 19,500 steps, far below the official 600,000); raise it
for a full reproduction.

Cost: XLA counts 9.45 GFLOP per training image
(python -m capsjax.benchmark --config=configs/cifar10.py);
docs/performance.md has its speed on the machines we measured.

Variant ``smoke``: a tiny model for a few steps (tests, on tfds.testing.mock_data).
"""

import pathlib

import ml_collections

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

images = import_config_file(pathlib.Path(__file__).with_name("images.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  smoke = config_args.parse_arg(arg, "configs/cifar10.py", smoke=False).smoke
  c = images.image_config(smoke=smoke, dataset="cifar10", tfds_name="cifar10", crop=24,
                          flip=True, brightness=63.0, contrast_lower=0.2, contrast_upper=1.8,
                          standardize=True)
  c.model.padding = "SAME"            # Official code.
  c.model.routing.leaky = True        # Paper's "none-of-the-above"; official leaky routing.
  c.model.decoder.enabled = False     # Official code: remake=false for CIFAR-10.
  if not smoke:
    c.model.primary.num_types = 64    # Paper.
  return c
